import pytest

from mtpstack.validator import WorkerProfile, worker_argv
from mtpstack.validator.argv import draft_kind_from_argv


def profile(**overrides):
    data = {
        "model": "qwen3.8-27b",
        "target": {"path": "/m/target", "bits": 4},
        "drafter": {"path": "/m/drafter", "bits": 6, "depth": 3},
        "maxNumSeqs": 2,
        "port": 8101,
    }
    data.update(overrides)
    return WorkerProfile.model_validate(data)


def test_native_argv_carries_weights_depth_and_width():
    assert worker_argv(profile(extraArgs=["--admission-grace-seconds", "2"])) == [
        "mtpstack", "worker",
        "--model", "/m/target", "--target-bits", "4",
        "--draft-model", "/m/drafter", "--drafter-bits", "6", "--draft-depth", "3", "--draft-kind", "auto",
        "--max-num-seqs", "2", "--prefix-cache-gib", "2", "--served-model-name", "qwen3.8-27b",
        "--host", "127.0.0.1", "--port", "8101",
        "--admission-grace-seconds", "2",
    ]


@pytest.mark.parametrize(("gib", "flag"), [(0, "0"), (0.5, "0.5"), (1.25, "1.25"), (16.0, "16"), (1 / 3, "0.333333")])
def test_the_prefix_cache_budget_is_on_the_native_worker_argv_as_nix_writes_it(gib, flag):
    argv = worker_argv(profile(prefixCache={"maxGiB": gib}))
    assert argv[argv.index("--prefix-cache-gib") + 1] == flag


def test_mlx_lm_gets_the_prefix_cache_budget_in_bytes_without_a_drafter_and_no_cache_with_one():
    argv = worker_argv(profile(backend="mlx-lm", drafter=None, prefixCache={"maxGiB": 0.5}))
    assert argv[argv.index("--prompt-cache-bytes") + 1] == str(2**29)
    off = worker_argv(profile(backend="mlx-lm", drafter=None, prefixCache={"maxGiB": 0}))
    assert off[off.index("--prompt-cache-size") + 1] == "0" and "--prompt-cache-bytes" not in off
    assert "--prompt-cache-bytes" not in worker_argv(profile(backend="mlx-lm"))


@pytest.mark.parametrize("kind", ["mtp", "model"])
def test_a_declared_drafter_kind_follows_the_depth(kind):
    argv = worker_argv(profile(drafter={"path": "/m/target", "bits": 4, "depth": 2, "kind": kind}))
    depth = argv.index("--draft-depth")
    assert argv[depth + 2 : depth + 4] == ["--draft-kind", kind]
    assert draft_kind_from_argv(argv) == kind


def test_the_last_draft_kind_on_a_command_line_counts_as_for_the_worker():
    assert draft_kind_from_argv(["mtpstack", "worker", "--draft-kind", "auto", "--draft-kind=mtp"]) == "mtp"
    assert draft_kind_from_argv(["mtpstack", "worker", "--model", "t"]) is None


def test_without_a_drafter_no_draft_flags_appear():
    argv = worker_argv(profile(drafter=None, target={"path": "/m/t", "bits": "bf16"}))
    assert "--draft-model" not in argv and "--draft-depth" not in argv and "--draft-kind" not in argv
    assert argv[argv.index("--target-bits") + 1] == "bf16"


def test_mlx_lm_argv_sets_both_concurrency_flags_and_disables_the_prompt_cache_with_a_drafter():
    argv = worker_argv(profile(backend="mlx-lm", maxNumSeqs=1))
    assert argv[0] == "mlx_lm.server"
    assert argv[argv.index("--decode-concurrency") + 1] == "1"
    assert argv[argv.index("--prompt-concurrency") + 1] == "1"
    assert argv[argv.index("--prompt-cache-size") + 1] == "0"
    assert argv[argv.index("--num-draft-tokens") + 1] == "3"
    assert "--draft-kind" not in argv  # mlx_lm.server has no such flag
    assert "--prompt-cache-size" not in worker_argv(profile(backend="mlx-lm", drafter=None))  # its byte budget instead


def test_max_context_tokens_follows_the_width_on_the_native_worker_only():
    argv = worker_argv(profile(maxContextTokens=32768))
    width = argv.index("--max-num-seqs")
    assert argv[width : width + 4] == ["--max-num-seqs", "2", "--max-context-tokens", "32768"]
    assert "--max-context-tokens" not in worker_argv(profile())
    # mlx_lm.server has no such flag (the rule `mlx-lm-cannot-cap-context` refuses the setting)
    assert "--max-context-tokens" not in worker_argv(profile(backend="mlx-lm", drafter=None, maxContextTokens=32768))


def test_a_depth_map_becomes_the_default_depth_and_one_sorted_plain_argument():
    argv = worker_argv(profile(drafter={"path": "/m/d", "bits": 6, "depth": {"prose": 2, "default": 3, "code": 4}}))
    i = argv.index("--draft-depth")
    assert argv[i : i + 6] == ["--draft-depth", "3", "--draft-depth-map", "code=4,prose=2", "--draft-kind", "auto"]
    # A map of `default` alone is a single depth.
    assert "--draft-depth-map" not in worker_argv(profile(drafter={"path": "/m/d", "bits": 6, "depth": {"default": 5}}))


def test_the_weights_proof_reads_the_depth_map_back():
    from mtpstack.validator.claim import parse_depth_map, weights_from_argv

    argv = worker_argv(profile(drafter={"path": "/m/d", "bits": 6, "depth": {"prose": 2, "default": 3, "code": 4}}))
    claim = weights_from_argv(argv)
    assert (claim.depth, claim.depth_map) == (3, {"code": 4, "prose": 2})
    assert weights_from_argv(worker_argv(profile())).depth_map == {}
    with pytest.raises(ValueError):
        parse_depth_map("code=4,prose")


def test_auto_carries_its_bound_and_a_fixed_depth_does_not():
    argv = worker_argv(profile(drafter={"path": "/m/d", "bits": 6, "depth": {"code": 4, "default": "auto"}, "maxDepth": 6}))
    at = argv.index("--draft-depth")
    assert argv[at : at + 6] == ["--draft-depth", "auto", "--draft-depth-map", "code=4", "--draft-max-depth", "6"]
    assert "--draft-max-depth" not in worker_argv(profile(drafter={"path": "/m/d", "bits": 6, "depth": 3, "maxDepth": 6}))
