"""The one weights proof (`mtpstack.worker.proof.prove_weights`): every item it compares, and the three
commands that render it (`mtpstack weights`, `mtpstack status`, `mtpstack bench sweep`) all seeing each."""

from __future__ import annotations

import pytest

from mtpstack.validator import WorkerProfile, worker_argv
from mtpstack.validator.claim import weights_from_argv
from mtpstack.worker import proof as pf
from tests.sleeping_process import sleeping_process


def _profile(backend: str = "native", **drafter) -> WorkerProfile:
    return WorkerProfile.model_validate({
        "model": "m", "backend": backend, "target": {"path": "/m/target", "bits": 4},
        "drafter": {"path": "/m/drafter", "bits": 6, "depth": {"code": 4, "default": 2}, "kind": "mtp", **drafter}
        if backend == "native" else {"path": "/m/drafter", "bits": 6, "depth": 2},
        "maxNumSeqs": 2, "port": 8123,
    })


@pytest.fixture
def worker():
    """A sleeping process whose command line is the profile's worker argv, and an /identity that agrees with it."""
    with sleeping_process(worker_argv(_profile())) as proc:
        identity = {"pid": proc.pid, "argv": pf.read_cmdline(proc.pid), "target": {"path": "/m/target", "sha256": "t"},
                    "drafter": {"path": "/m/drafter", "kind": "mtp", "sha256": "d"}, "draft_depth": 2,
                    "draft_depth_map": {"code": 4}, "max_num_seqs": 2}
        yield proc.pid, identity


def test_an_identity_that_agrees_with_the_command_line_proves_the_weights(worker):
    pid, identity = worker
    proof = pf.prove_weights(pid, "http://unused", fetch=lambda url: identity)
    assert proof.proved and proof.mismatches == []
    assert (proof.claim.target, proof.claim.depth, proof.claim.depth_map, proof.kind) == ("/m/target", 2, {"code": 4}, "mtp")


@pytest.mark.parametrize(("what", "change"), [
    ("pid", {"pid": 1}),
    ("argv", {"argv": ["mtpstack", "worker", "--model", "/m/target"]}),
    ("target", {"target": {"path": "/m/other"}}),
    ("drafter", {"drafter": None}),
    ("depth", {"draft_depth": 3}),
    ("depth per class", {"draft_depth_map": {}}),
    ("drafter kind", {"drafter": {"path": "/m/drafter", "kind": "model"}}),
    ("maxNumSeqs", {"max_num_seqs": 1}),
])
def test_each_item_the_identity_disagrees_on_is_named(worker, what, change):
    pid, identity = worker
    proof = pf.prove_weights(pid, "http://unused", fetch=lambda url: identity | change)
    assert [m.what for m in proof.mismatches] == [what] and proof.mismatches[0].at == "/identity"


def test_the_command_line_is_held_to_what_the_caller_asked_for_and_the_hashes_to_the_expected(worker):
    pid, identity = worker
    asked = weights_from_argv(worker_argv(_profile(depth=3)))
    proof = pf.prove_weights(pid, "http://unused", asked=asked, expected_sha256={"target": "t", "drafter": "other"},
                             fetch=lambda url: identity)
    assert [(m.what, m.want, m.got, m.at) for m in proof.mismatches] == [
        ("depth", 3, 2, "command line"), ("depth per class", {}, {"code": 4}, "command line"),
        ("drafter sha256", "other", "d", "/identity")]


def test_an_identity_that_cannot_be_read_keeps_what_the_command_line_gave(worker):
    def refuse(url):
        raise OSError("connection refused")

    with pytest.raises(pf.IdentityUnavailable) as e:
        pf.prove_weights(worker[0], "http://unused", fetch=refuse)
    assert e.value.status == 0 and e.value.proof.claim.target == "/m/target"
    assert "does not answer" in e.value.message


def test_an_mlx_lm_server_is_proven_from_its_command_line_alone_without_restating_its_defaults():
    argv = worker_argv(_profile("mlx-lm"))
    with sleeping_process(argv) as proc:
        proof = pf.prove_weights(proc.pid, fetch=lambda url: pytest.fail("mlx_lm.server has no /identity"))
    assert proof.proved and proof.identity is None and proof.note == pf.MLX_LM_NOTE
    bare = weights_from_argv(["mlx_lm.server", "--model", "/m/target", "--draft-model", "/m/drafter"])
    assert (bare.depth, bare.port) == (None, None)  # mlx_lm.server's own defaults are not ours to restate


def test_weights_status_and_sweep_each_report_what_only_one_of_them_checked_before(worker, monkeypatch):
    from mtpstack.bench import sweep as sw
    from mtpstack.status import local_weights
    from mtpstack.worker.cli import prove

    pid, identity = worker
    # `mtpstack weights` did not compare the drafter kind.
    monkeypatch.setattr(pf, "fetch_identity", lambda url, timeout=5.0: identity | {"drafter": identity["drafter"] | {"kind": "model"}})
    assert "the drafter kind is `mtp` on the command line but `model` on /identity" in prove(str(pid))["problems"]
    # `mtpstack status` did not compare the command line /identity reports.
    monkeypatch.setattr(pf, "fetch_identity", lambda url, timeout=5.0: identity | {"argv": ["other"]})
    assert local_weights(pid, "http://unused")["why"] == "argv: /identity reports another command line"
    # `mtpstack bench sweep` did not compare the width or the depth per class.
    expected = sw.Expected(_profile(), None, None)
    with pytest.raises(sw.ConfigurationAborted) as e:
        sw.check_weights(pid, "http://unused", expected, fetch=lambda url: identity | {"max_num_seqs": 1, "draft_depth_map": {}})
    assert str(e.value) == ("the weights proof failed: depth per class (/identity): asked for {'code': 4}, the process has {}; "
                            "maxNumSeqs (/identity): asked for 2, the process has 1")
