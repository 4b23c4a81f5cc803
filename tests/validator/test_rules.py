import pytest

from mtpstack.validator import validate_data
from mtpstack.validator.findings import format_finding


def codes(data):
    _, report = validate_data(data)
    return [f.code for f in report.findings]


def only(data, code):
    _, report = validate_data(data)
    found = [f for f in report.findings if f.code == code]
    assert found, f"no {code} in {[f.code for f in report.findings]}"
    return found


def test_the_base_fleet_is_valid(fleet):
    config, report = validate_data(fleet)
    assert config is not None and report.findings == []


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_any_matched_pair_within_range_is_valid_with_a_drafter(fleet, width):
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-27b"] = width
    fleet["workers"]["qwen-mtp"]["maxNumSeqs"] = width
    assert codes(fleet) == []


@pytest.mark.parametrize(("gate", "width"), [(4, 1), (1, 4), (2, 3)])
def test_a_gate_that_differs_from_the_batch_width_is_a_mismatch(fleet, gate, width):
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-27b"] = gate
    fleet["workers"]["qwen-mtp"]["maxNumSeqs"] = width
    [f] = only(fleet, "concurrency-mismatch")
    assert f.severity == "error"
    assert f.path == ("workers", "qwen-mtp", "maxNumSeqs")
    assert f.related == (("proxy", "modelConcurrencyLimits", "qwen3.8-27b"),)
    assert f"batch width is {width}" in f.message and f"admits {gate}" in f.message
    assert "must agree" in f.message
    assert "together" in f.hint


def test_mismatch_against_the_default_gate_names_concurrency_limit(fleet):
    fleet["proxy"]["modelConcurrencyLimits"] = {}
    fleet["workers"]["qwen-mtp"]["maxNumSeqs"] = 3
    [f] = only(fleet, "concurrency-mismatch")
    assert f.related == (("proxy", "concurrencyLimit"),)
    assert "`proxy.concurrencyLimit`" in f.message
    assert "no entry in `proxy.modelConcurrencyLimits`" in f.message


def test_the_mismatch_message_never_suggests_mtp_needs_width_1(fleet):
    fleet["workers"]["qwen-mtp"]["maxNumSeqs"] = 1
    [f] = only(fleet, "concurrency-mismatch")
    text = (f.message + " " + f.hint).lower().replace("qwen-mtp", "WORKER")
    assert "mtp" not in text and "speculat" not in text and "must be 1" not in text
    assert "any matched pair is valid" in text


def test_the_model_limit_applies_per_worker_not_in_total(fleet):
    second = dict(fleet["workers"]["qwen-mtp"], port=8102)
    fleet["workers"]["qwen-mtp-2"] = second
    assert codes(fleet) == []


def test_agreeing_on_a_value_outside_1_to_4_is_out_of_range_not_a_match(fleet):
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-27b"] = 5
    fleet["workers"]["qwen-mtp"]["maxNumSeqs"] = 5
    assert sorted(codes(fleet)) == ["out-of-range", "out-of-range"]


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("proxy", "concurrencyLimit"), 0),
        (("proxy", "modelConcurrencyLimits", "qwen3.8-27b"), 9),
        (("workers", "qwen-mtp", "maxNumSeqs"), -1),
        (("workers", "qwen-mtp", "drafter", "depth"), 0),
        (("workers", "qwen-mtp", "drafter", "depth"), 9),
    ],
)
def test_values_outside_their_range_are_out_of_range(fleet, where, value):
    node = fleet
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    found = only(fleet, "out-of-range")
    assert any(f.path == where for f in found)


@pytest.mark.parametrize("depth", [1, 8])
def test_depth_bounds_are_inclusive(fleet, depth):
    fleet["workers"]["qwen-mtp"]["drafter"]["depth"] = depth
    assert codes(fleet) == []


def test_a_limit_for_a_model_nobody_serves_is_flagged_with_did_you_mean(fleet):
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-72b"] = 2
    [f] = only(fleet, "unknown-model-limit")
    assert f.path == ("proxy", "modelConcurrencyLimits", "qwen3.8-72b")
    assert f.hint == "did you mean `qwen3.8-27b`?"


@pytest.mark.parametrize(
    ("target", "drafter", "warned"),
    [
        (4, 4, True),
        (4, 3, True),
        ("mxfp4", 4, True),
        (8, 5, True),
        (2, 6, False),
        (8, 6, False),
        (4, 6, False),
        ("bf16", 8, False),
        (4, "mxfp4", True),
        (2, 3, False),
        ("fp16", "fp16", False),
    ],
)
def test_drafter_precision_warns_only_when_as_hard_as_the_target_and_below_6_bits(fleet, target, drafter, warned):
    fleet["workers"]["qwen-mtp"]["target"]["bits"] = target
    fleet["workers"]["qwen-mtp"]["drafter"]["bits"] = drafter
    config, report = validate_data(fleet)
    found = [f for f in report.findings if f.code == "drafter-precision"]
    assert bool(found) == warned
    assert report.ok  # a warning never makes the config invalid
    if warned:
        assert found[0].severity == "warning"


def test_a_bundled_head_is_not_warned_about_precision_it_shares_with_its_target(fleet):
    worker = fleet["workers"]["qwen-mtp"]
    worker["drafter"].update(path=worker["target"]["path"], bits=4)
    assert codes(fleet) == []
    worker["drafter"]["path"] = "elsewhere/drafter-4bit"
    assert codes(fleet) == ["drafter-precision"]


def mlx_lm_fleet(fleet, **drafter):
    fleet["policy"] = {"allowedBackends": ["native", "mlx-lm"]}
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-27b"] = 1
    worker = fleet["workers"]["qwen-mtp"]
    worker.update(backend="mlx-lm", maxNumSeqs=1)
    worker["drafter"].update(drafter)
    return fleet


@pytest.mark.parametrize(
    ("drafter", "why"),
    [
        ({"kind": "mtp"}, "`drafter.kind` is `mtp`"),
        ({"path": "mlx-community/Qwen3.8-27B-4bit"}, "`drafter.path` is the target's own path"),
        ({"path": "mlx-community/Qwen3.8-27B-4bit", "kind": "auto"}, "bundled in its checkpoint"),
    ],
)
def test_mlx_lm_cannot_load_a_declared_or_bundled_mtp_head(fleet, drafter, why):
    [f] = only(mlx_lm_fleet(fleet, **drafter), "mlx-lm-cannot-load-mtp")
    assert (f.severity, f.path, f.related) == ("error", ("workers", "qwen-mtp", "drafter"), (("workers", "qwen-mtp", "backend"),))
    assert f.message.startswith("`mlx_lm.server` cannot load an MTP head, only a separate draft model: ")
    assert why in f.message
    assert f.hint == "use backend `native`, or drop the drafter"


@pytest.mark.parametrize("kind", ["auto", "model"])
def test_mlx_lm_with_a_separate_drafter_not_declared_mtp_passes(fleet, kind):
    assert codes(mlx_lm_fleet(fleet, kind=kind)) == []


def test_the_native_backend_loads_a_declared_or_bundled_head(fleet):
    fleet["workers"]["qwen-mtp"]["drafter"]["kind"] = "mtp"
    assert codes(fleet) == []
    fleet["workers"]["qwen-mtp"]["drafter"]["path"] = fleet["workers"]["qwen-mtp"]["target"]["path"]
    assert codes(fleet) == []


def test_a_backend_outside_the_policy_is_wired_but_unreachable(fleet):
    fleet["workers"]["qwen-mtp"]["backend"] = "mlx-lm"
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-27b"] = 1
    fleet["workers"]["qwen-mtp"]["maxNumSeqs"] = 1
    [f] = only(fleet, "backend-forbidden")
    assert "wired but unreachable" in f.message
    assert f.related == (("policy", "allowedBackends"),)


def test_mlx_lm_with_a_drafter_above_width_1_is_refused(fleet):
    fleet["policy"] = {"allowedBackends": ["native", "mlx-lm"]}
    fleet["workers"]["qwen-mtp"]["backend"] = "mlx-lm"
    assert codes(fleet) == ["mlx-lm-serializes-drafts"]
    fleet["workers"]["qwen-mtp"]["drafter"] = None
    assert codes(fleet) == []  # without a drafter mlx_lm.server batches
    fleet["workers"]["qwen-mtp"]["drafter"] = {"path": "d", "bits": 6, "depth": 2}
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-27b"] = 1
    fleet["workers"]["qwen-mtp"]["maxNumSeqs"] = 1
    assert codes(fleet) == []


@pytest.mark.parametrize("cap", [1, 4096, 262144])
def test_a_positive_max_context_tokens_is_valid(fleet, cap):
    fleet["workers"]["qwen-mtp"]["maxContextTokens"] = cap
    assert codes(fleet) == []


@pytest.mark.parametrize("cap", [0, -1])
def test_a_non_positive_max_context_tokens_is_out_of_range(fleet, cap):
    fleet["workers"]["qwen-mtp"]["maxContextTokens"] = cap
    [f] = only(fleet, "out-of-range")
    assert (f.severity, f.path) == ("error", ("workers", "qwen-mtp", "maxContextTokens"))
    assert f"at least 1, got: {cap}" in f.message
    assert "`workers.qwen-mtp.maxContextTokens`" in f.hint


@pytest.mark.parametrize("cap", ["4096", 4096.0, True])
def test_max_context_tokens_must_be_an_integer(fleet, cap):
    fleet["workers"]["qwen-mtp"]["maxContextTokens"] = cap
    assert codes(fleet) == ["invalid-type"]


def test_mlx_lm_cannot_cap_the_context(fleet):
    fleet["policy"] = {"allowedBackends": ["native", "mlx-lm"]}
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-27b"] = 1
    worker = fleet["workers"]["qwen-mtp"]
    worker.update(backend="mlx-lm", maxNumSeqs=1, drafter=None, maxContextTokens=4096)
    [f] = only(fleet, "mlx-lm-cannot-cap-context")
    assert (f.severity, f.path, f.related) == ("error", ("workers", "qwen-mtp", "maxContextTokens"), (("workers", "qwen-mtp", "backend"),))
    assert "4096" in f.message and "no flag" in f.message
    assert "native" in f.hint and "null" in f.hint
    worker["maxContextTokens"] = None
    assert codes(fleet) == []


@pytest.mark.parametrize(
    ("proxy_host", "worker_host", "conflict"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "127.0.0.2", False),
        ("0.0.0.0", "127.0.0.2", True),
        ("127.0.0.1", "::", True),
        ("localhost", "127.0.0.1", True),
        ("::1", "0:0:0:0:0:0:0:1", True),
    ],
)
def test_port_conflicts_consider_wildcard_hosts(fleet, proxy_host, worker_host, conflict):
    fleet["proxy"].update(host=proxy_host, port=8101)
    fleet["workers"]["qwen-mtp"]["host"] = worker_host
    assert ("port-conflict" in codes(fleet)) == conflict


def test_two_workers_on_one_port_conflict_and_name_each_other(fleet):
    fleet["workers"]["b"] = dict(fleet["workers"]["qwen-mtp"])
    [f] = only(fleet, "port-conflict")
    assert f.path == ("workers", "b", "port")
    assert f.related == (("workers", "qwen-mtp", "port"),)


@pytest.mark.parametrize(
    ("mutate", "code", "path"),
    [
        (lambda d: d["workers"]["qwen-mtp"].update(maxNumSeq=2), "unknown-key", ("workers", "qwen-mtp", "maxNumSeq")),
        (lambda d: d["workers"]["qwen-mtp"].pop("target"), "missing-key", ("workers", "qwen-mtp", "target")),
        (lambda d: d["workers"]["qwen-mtp"].update(maxNumSeqs="2"), "invalid-type", ("workers", "qwen-mtp", "maxNumSeqs")),
        (lambda d: d["workers"]["qwen-mtp"].update(maxNumSeqs=True), "invalid-type", ("workers", "qwen-mtp", "maxNumSeqs")),
        (lambda d: d["workers"]["qwen-mtp"]["target"].update(bits=7), "invalid-value", ("workers", "qwen-mtp", "target", "bits")),
        (lambda d: d["workers"]["qwen-mtp"].update(backend="vllm"), "invalid-value", ("workers", "qwen-mtp", "backend")),
        (lambda d: d["workers"]["qwen-mtp"].update(port=0), "out-of-range", ("workers", "qwen-mtp", "port")),
        (lambda d: d.update(workers=["qwen-mtp"]), "invalid-type", ("workers",)),
    ],
)
def test_structural_problems_have_codes_and_key_paths(fleet, mutate, code, path):
    mutate(fleet)
    config, report = validate_data(fleet)
    assert config is None
    assert [(f.code, f.path) for f in report.findings] == [(code, path)]


def test_unknown_keys_suggest_the_near_name(fleet):
    fleet["proxy"]["concurencyLimit"] = 2
    _, report = validate_data(fleet)
    [f] = report.findings
    assert f.hint == "did you mean `concurrencyLimit`?"


def test_text_output_quotes_model_names_with_dots(fleet):
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-27b"] = 3
    [f] = only(fleet, "concurrency-mismatch")
    text = format_finding("fleet.yaml", f)
    assert text.startswith("fleet.yaml: error[concurrency-mismatch]: workers.qwen-mtp.maxNumSeqs: ")
    assert '`proxy.modelConcurrencyLimits."qwen3.8-27b"`' in text
    assert "\n\nhint: " in text


def test_a_depth_per_class_with_a_default_is_valid(fleet):
    fleet["workers"]["qwen-mtp"]["drafter"]["depth"] = {"code": 4, "prose": 2, "default": 3}
    assert codes(fleet) == []


def test_a_depth_map_without_default_is_refused_with_a_hint(fleet):
    fleet["workers"]["qwen-mtp"]["drafter"]["depth"] = {"code": 4, "prose": 2}
    [f] = only(fleet, "depth-map-no-default")
    assert (f.severity, f.path) == ("error", ("workers", "qwen-mtp", "drafter", "depth"))
    assert "`default`" in f.message and "default: 3" in f.hint


def test_each_class_depth_is_range_checked_at_its_own_path(fleet):
    fleet["workers"]["qwen-mtp"]["drafter"]["depth"] = {"code": 9, "prose": 0, "default": 3}
    paths = sorted(f.path for f in only(fleet, "out-of-range"))
    assert paths == [("workers", "qwen-mtp", "drafter", "depth", c) for c in ("code", "prose")]


@pytest.mark.parametrize(("name", "bad"), [("code", False), ("a.b-c_1", False), ("co de", True), ("a=b", True), ("x,y", True), ("", True)])
def test_class_names_must_stay_plain_for_the_argv_and_the_header(fleet, name, bad):
    fleet["workers"]["qwen-mtp"]["drafter"]["depth"] = {name: 2, "default": 3}
    assert ("depth-class-name" in codes(fleet)) == bad


def test_mlx_lm_refuses_a_depth_map_but_takes_a_single_depth(fleet):
    fleet["policy"] = {"allowedBackends": ["native", "mlx-lm"]}
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-27b"] = 1
    worker = fleet["workers"]["qwen-mtp"]
    worker.update(backend="mlx-lm", maxNumSeqs=1)
    worker["drafter"].update(kind="model", depth={"code": 4, "default": 3})
    [f] = only(fleet, "mlx-lm-depth-map")
    assert f.related == (("workers", "qwen-mtp", "backend"),) and "native" in f.hint
    worker["drafter"]["depth"] = 3
    assert "mlx-lm-depth-map" not in codes(fleet)


@pytest.mark.parametrize("depth", ["3", 3.0, [3], {"code": "4", "default": 3}])
def test_a_depth_that_is_neither_an_integer_nor_a_map_of_integers_is_one_type_error(fleet, depth):
    fleet["workers"]["qwen-mtp"]["drafter"]["depth"] = depth
    _, report = validate_data(fleet)
    assert [f.code for f in report.findings] == ["invalid-type"]
    # pydantic's branch tags (`int`, `dict[str,int]`) stay out of the path.
    assert report.findings[0].path[:5] == ("workers", "qwen-mtp", "drafter", "depth", *(["code"] if isinstance(depth, dict) else []))
    assert not set(report.findings[0].path) & {"int", "dict[str,int]"}


def test_two_workers_sharing_a_prefix_cache_directory_on_one_host_are_an_error_naming_both(fleet):
    fleet["workers"]["qwen-mtp"]["prefixCache"] = {"dir": "/var/lib/cache"}
    fleet["workers"]["b"] = dict(fleet["workers"]["qwen-mtp"], port=8102, prefixCache={"dir": "/var/lib/cache/"})
    [f] = only(fleet, "prefix-cache-dir-shared")
    assert f.path == ("workers", "b", "prefixCache", "dir") and f.related == (("workers", "qwen-mtp", "prefixCache", "dir"),)
    assert "`qwen-mtp`" in f.message and "`b`" in f.message and f.severity == "error"


@pytest.mark.parametrize("other", [{"dir": "/var/lib/other"}, {"dir": "/var/lib/cache", "diskGiB": 0}, {"dir": None},
                                   {"dir": "/var/lib/cache", "maxGiB": 0}])
def test_workers_with_their_own_directories_or_no_disk_tier_share_nothing(fleet, other):
    fleet["workers"]["qwen-mtp"]["prefixCache"] = {"dir": "/var/lib/cache"}
    fleet["workers"]["b"] = dict(fleet["workers"]["qwen-mtp"], port=8102, prefixCache=other)
    assert "prefix-cache-dir-shared" not in codes(fleet)


def test_one_directory_on_two_hosts_is_two_directories(fleet):
    fleet["hosts"] = {"h1": {"address": "10.0.0.1"}, "h2": {"address": "10.0.0.2"}}
    fleet["proxy"]["deployOn"] = "h1"
    fleet["workers"]["qwen-mtp"].update(prefixCache={"dir": "/var/lib/cache"}, deployOn="h1", host="0.0.0.0")
    fleet["workers"]["b"] = dict(fleet["workers"]["qwen-mtp"], port=8102, deployOn="h2")
    assert "prefix-cache-dir-shared" not in codes(fleet)
    fleet["workers"]["b"]["deployOn"] = "h1"
    assert "prefix-cache-dir-shared" in codes(fleet)


@pytest.mark.parametrize("depth", ["auto", {"code": "auto", "prose": 2, "default": 3}, {"code": 4, "default": "auto"}])
def test_auto_is_a_depth_alone_and_for_any_class(fleet, depth):
    fleet["workers"]["qwen-mtp"]["drafter"]["depth"] = depth
    assert codes(fleet) == []


def test_mlx_lm_refuses_auto_naming_the_backend(fleet):
    fleet["policy"] = {"allowedBackends": ["native", "mlx-lm"]}
    fleet["proxy"]["modelConcurrencyLimits"]["qwen3.8-27b"] = 1
    worker = fleet["workers"]["qwen-mtp"]
    worker.update(backend="mlx-lm", maxNumSeqs=1)
    worker["drafter"].update(kind="model", depth="auto")
    [f] = only(fleet, "mlx-lm-depth-auto")
    assert f.severity == "error" and f.path == ("workers", "qwen-mtp", "drafter", "depth")
    assert f.related == (("workers", "qwen-mtp", "backend"),) and "native" in f.hint


@pytest.mark.parametrize("max_depth", [0, 9])
def test_max_depth_is_range_checked_at_its_own_path(fleet, max_depth):
    fleet["workers"]["qwen-mtp"]["drafter"].update(depth="auto", maxDepth=max_depth)
    [f] = only(fleet, "out-of-range")
    assert f.path == ("workers", "qwen-mtp", "drafter", "maxDepth") and "1 to 8" in f.hint


def test_max_depth_below_a_fixed_class_depth_beside_auto_names_both(fleet):
    fleet["workers"]["qwen-mtp"]["drafter"].update(depth={"code": 6, "default": "auto"}, maxDepth=4)
    [f] = only(fleet, "max-depth-below-fixed")
    assert f.severity == "error" and f.path == ("workers", "qwen-mtp", "drafter", "maxDepth")
    assert f.related == (("workers", "qwen-mtp", "drafter", "depth", "code"),) and "to 6 or more" in f.hint
    fleet["workers"]["qwen-mtp"]["drafter"]["maxDepth"] = 6
    assert codes(fleet) == []


def test_max_depth_without_auto_is_a_warning_and_its_default_is_not(fleet):
    fleet["workers"]["qwen-mtp"]["drafter"].update(depth=3, maxDepth=6)
    [f] = only(fleet, "max-depth-unused")
    assert f.severity == "warning" and "auto" in f.hint
    fleet["workers"]["qwen-mtp"]["drafter"]["maxDepth"] = 4  # what the Nix modules render when it is not set
    assert codes(fleet) == []


@pytest.mark.parametrize("depth", ["fast", "Auto ", {"code": "deep", "default": 3}])
def test_a_word_other_than_auto_is_one_type_error_that_names_auto(fleet, depth):
    fleet["workers"]["qwen-mtp"]["drafter"]["depth"] = depth
    _, report = validate_data(fleet)
    [f] = report.findings
    assert f.code == "invalid-type" and "`auto`" in f.message
