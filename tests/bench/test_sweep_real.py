"""Real sweeps: real worker processes serving tiny real mlx models on loopback."""

from __future__ import annotations

import json

import pytest

from mtpstack.bench import report as rpt
from mtpstack.bench.sweep import (
    ConfigurationAborted,
    Expected,
    ProcessReused,
    Sweep,
    check_weights,
    write_outputs,
)
from mtpstack.runtime import free_port
from mtpstack.validator import load_valid_config
from mtpstack.worker.proof import hash_weights

pytestmark = pytest.mark.mlx


def test_a_two_configuration_three_repeat_sweep_records_every_pass_and_proof(fast_settings, tiny_pair):
    config = load_valid_config(fast_settings.config_file)
    results = Sweep(config, fast_settings).run()
    paths = write_outputs(results, fast_settings.out)

    configs = results["configurations"]
    assert [c["label"] for c in configs] == ["no-drafter", "depth 2"]
    assert all(c["status"] == "measured" for c in configs), [c["error"] for c in configs]
    # a fresh process per configuration
    assert configs[0]["process"]["pid"] != configs[1]["process"]["pid"]
    for c in configs:
        for workload in ("code", "prose"):
            wl = c["workloads"][workload]
            assert wl["warmup"] is not None  # measured, then discarded from the statistics
            assert len(wl["passes"]) == 3
            for p in wl["passes"]:
                assert p["tokens"] > 0 and p["e2e_tps"] > 0 and p["ttft_s"] > 0
    # the weights proof compared the worker's /identity hashes with the files on disk
    target, drafter = tiny_pair
    proof = configs[1]["proof"]
    assert proof["identity"]["target"]["sha256"] == hash_weights(target)
    assert proof["identity"]["drafter"]["sha256"] == hash_weights(drafter)
    assert proof["claim"]["depth"] == 2 and proof["identity"]["draft_depth"] == 2
    assert configs[0]["proof"]["claim"]["drafter"] is None
    # the drafter's kind: the tiny drafter is a separate model, as the worker reports it (an older
    # worker reports none: then the profile's `auto`)
    reported = proof["identity"]["drafter"].get("kind")
    assert reported in (None, "model")
    assert (configs[0]["drafter_kind"], configs[1]["drafter_kind"]) == (None, reported or "auto")
    # acceptance comes from the worker's /metrics deltas: drafting happened only with a drafter
    assert all(p["drafted"] == 0 for p in configs[0]["workloads"]["code"]["passes"])
    assert all(p["drafted"] > 0 for p in configs[1]["workloads"]["code"]["passes"])
    assert rpt.acceptance(configs[1], "code") is not None
    # greedy text is the same with and without the drafter (the report would warn otherwise)
    assert rpt.output_mismatches(results) == []

    saved = json.loads((fast_settings.out / "results.json").read_text())
    assert saved["meta"]["versions"]["mlx"] and saved["meta"]["device"]
    assert saved["meta"]["git_revision"] is None or len(saved["meta"]["git_revision"]) >= 40
    report = (fast_settings.out / "report.md").read_text()
    assert "depth 2 vs no-drafter:" in report
    assert f"| depth 2 | {configs[1]['drafter_kind']} | {configs[1]['process']['pid']} |" in report
    assert (fast_settings.out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {p.name for p in paths} == {"results.json", "report.md", "sweep.png"}


@pytest.fixture
def other_worker(other_pair, tmp_path):
    """A worker started on a different pair of weights (seed 1)."""
    from mtpstack.validator import WorkerProfile, worker_argv
    from mtpstack.worker.launcher import resolve_command, worker_env
    from mtpstack.runtime import Process, url_of

    target, drafter = other_pair
    port = free_port()
    profile = WorkerProfile.model_validate(
        {"model": "tiny", "target": {"path": str(target), "bits": "fp32"},
         "drafter": {"path": str(drafter), "bits": "fp32", "depth": 2}, "maxNumSeqs": 1, "port": port}
    )
    proc = Process(resolve_command(worker_argv(profile)), log_path=tmp_path / "other.log", kind="worker",
                   url=url_of("127.0.0.1", port), env=worker_env()).start()
    try:
        proc.wait_ready("/health", 120, state="healthy")
        yield proc, profile
    finally:
        proc.stop()


def test_the_weights_proof_catches_a_worker_started_with_other_weights(other_worker, tiny_pair):
    proc, served = other_worker
    target, drafter = tiny_pair
    asked = served.model_copy(update={
        "target": served.target.model_copy(update={"path": str(target)}),
        "drafter": served.drafter.model_copy(update={"path": str(drafter)}),
    })
    with pytest.raises(ConfigurationAborted) as e:
        check_weights(proc.pid, proc.url, Expected(asked, hash_weights(target), hash_weights(drafter)))
    assert "target (command line)" in str(e.value) and "drafter (command line)" in str(e.value)


def test_the_weights_proof_catches_changed_files_behind_the_same_path(other_worker, tiny_pair):
    proc, served = other_worker
    target, drafter = tiny_pair
    # same paths on the command line, but the content hashed before the sweep was another model's
    with pytest.raises(ConfigurationAborted) as e:
        check_weights(proc.pid, proc.url, Expected(served, hash_weights(target), hash_weights(drafter)))
    message = str(e.value)
    assert "target sha256 (/identity)" in message and "command line" not in message


def test_the_weights_proof_passes_for_the_weights_asked_for(other_worker, other_pair):
    proc, served = other_worker
    target, drafter = other_pair
    proof = check_weights(proc.pid, proc.url, Expected(served, hash_weights(target), hash_weights(drafter)))
    assert proof["identity"]["pid"] == proc.pid


class ReusingSweep(Sweep):
    """Serves every configuration from the first process it started: what the sweep must refuse."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.first = None

    def launch(self, profile, label):
        if self.first is None:
            self.first = super().launch(profile, label)
        return self.first

    def stop(self, proc):
        pass  # keep it alive for the next configuration


def test_the_sweep_fails_when_a_configuration_reuses_a_process(fast_settings):
    config = load_valid_config(fast_settings.config_file)
    fast_settings.workloads = ["code"]
    sweep = ReusingSweep(config, fast_settings)
    try:
        with pytest.raises(ProcessReused) as e:
            sweep.run()
    finally:
        if sweep.first is not None:
            sweep.first.stop()
    assert "`no-drafter` and `depth 2` were served by the same process" in e.value.message
    # what was measured before the refusal is kept, with the reason the sweep stopped
    saved = json.loads((fast_settings.out / "results.json").read_text())
    assert [c["label"] for c in saved["configurations"]] == ["no-drafter"]
    assert "served by the same process" in saved["meta"]["stopped"]


def test_a_sweep_at_widths_one_and_two_measures_each_workload_at_each_width(tmp_path, tiny_pair):
    import shutil
    from pathlib import Path

    import yaml

    from mtpstack.bench.sweep import SweepSettings, parse_widths, SweepError
    from tests.bench.conftest import fleet_data

    data = fleet_data(*tiny_pair)
    data["proxy"]["concurrencyLimit"] = 2
    data["workers"]["tiny"]["maxNumSeqs"] = 2
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(data))
    shipped = Path(__file__).resolve().parents[2] / "bench" / "prompts"
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for workload in ("code", "prose"):
        (prompts / f"{workload}.jsonl").write_text("\n".join((shipped / f"{workload}.jsonl").read_text().splitlines()[:2]) + "\n")
    with pytest.raises(SweepError):
        parse_widths("1,4", 2)  # wider than the worker's own batch
    settings = SweepSettings(config_file=str(tmp_path / "fleet.yaml"), worker="tiny", depths=[2], baseline="no-drafter",
                             repeats=3, max_repeats=3, workloads=["code", "prose"], out=tmp_path / "out", max_tokens=8,
                             prompts_dir=prompts, startup_timeout=120.0, widths=parse_widths("1,2", 2))
    results = Sweep(load_valid_config(settings.config_file), settings).run()
    assert results["settings"]["widths"] == [1, 2]
    for c in results["configurations"]:
        assert c["status"] == "measured", c["error"]
        assert set(c["workloads"]) == {"code", "prose", "code @ width 2", "prose @ width 2"}
        for p in c["workloads"]["code @ width 2"]["passes"]:
            assert p["clients"] == 2 and p["e2e_tps"] > 0 and len(p["requests"]) == 2
            assert p["e2e_tps"] == pytest.approx(p["tokens"] / p["wall_seconds"])
            assert p["target_steps"] > 0 and p["step_ms"] > 0  # the worker counts its batched forwards
    text = "\n".join(rpt.render_report(results))
    assert "## code @ width 2" in text and "recommendation: prose @ width 2:" in text
    assert "at widths 1, 2" in text
    assert rpt.workloads_of(results) == ["code", "prose", "code @ width 2", "prose @ width 2"]
    paths = write_outputs(results, settings.out)
    assert any(p.suffix == ".png" and p.stat().st_size > 0 for p in paths)
    # The emitted map is for the worker's own width, 2.
    results["meta"]["profile"]["drafter"]["depth"] = 2
    assert "measured at width 2" in "\n".join(rpt.emit_config(results))
    shutil.rmtree(settings.out)


def test_a_sweep_of_depths_alternates_by_default_in_one_proven_process_in_rotating_paired_order(fast_settings):
    from mtpstack.bench.sweep import SweepError

    fast_settings.depths = [1, 3]
    fast_settings.baseline = "configured"  # depth 2, from the fleet
    fast_settings.repeats = fast_settings.max_repeats = 5
    fast_settings.workloads = ["code"]
    results = Sweep(load_valid_config(fast_settings.config_file), fast_settings).run()
    configs = results["configurations"]
    assert results["settings"]["design"] == "alternated"  # by default: every configuration is a depth
    assert [c["label"] for c in configs] == ["depth 2", "depth 1", "depth 3"]
    assert all(c["status"] == "measured" for c in configs), [c["error"] for c in configs]
    assert len({c["process"]["pid"] for c in configs}) == 1  # one process, loaded at the deepest depth
    assert configs[0]["proof"]["claim"]["depth"] == 3
    drafted = {c["label"]: [p["drafted"] for p in c["workloads"]["code"]["passes"]] for c in configs}
    assert all(len(v) == 5 for v in drafted.values())  # paired: as many passes each
    # Each request carried its depth: deeper configurations draft more per pass.
    assert max(drafted["depth 1"]) < min(drafted["depth 3"])
    assert rpt.output_mismatches(results) == []
    text = "\n".join(rpt.render_report(results))
    assert "every configuration in one worker" in text and "geometric mean of the paired ratios" in text
    assert "recommendation: code:" in text
    fast_settings.baseline = "no-drafter"
    fast_settings.design = "alternated"
    with pytest.raises(SweepError):
        Sweep(load_valid_config(fast_settings.config_file), fast_settings).run()
