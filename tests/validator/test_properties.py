"""Property tests: the validator only ever answers with its own findings, and its
coupling verdict is exactly the plain predicate."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpstack.validator import CODES, validate_data

MODELS = ["qwen3.8-27b", "coder", "m.1", "chat"]
BITS = [2, 3, 4, 5, 6, 8, "mxfp4", "bf16", "fp16", "fp32"]

widths = st.integers(min_value=-1, max_value=6)
bits = st.sampled_from(BITS)


@st.composite
def fleets(draw):
    workers = {}
    for i in range(draw(st.integers(0, 5))):
        drafter = draw(st.none() | st.fixed_dictionaries({"path": st.just("d"), "bits": bits, "depth": st.integers(0, 9)}))
        workers[f"w{i}"] = {
            "model": draw(st.sampled_from(MODELS)),
            "backend": draw(st.sampled_from(["native", "mlx-lm"])),
            "target": {"path": "t", "bits": draw(bits)},
            "drafter": drafter,
            "maxNumSeqs": draw(widths),
            "host": draw(st.sampled_from(["127.0.0.1", "0.0.0.0", "::1"])),
            "port": draw(st.integers(8100, 8104)),
        }
    limits = draw(st.dictionaries(st.sampled_from(MODELS + ["typo"]), widths, max_size=4))
    return {
        "proxy": {"concurrencyLimit": draw(widths), "modelConcurrencyLimits": limits, "port": draw(st.integers(8080, 8101))},
        "policy": {"allowedBackends": draw(st.lists(st.sampled_from(["native", "mlx-lm"]), min_size=0, max_size=2, unique=True))},
        "workers": workers,
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_mismatch_verdict_equals_the_plain_predicate(data):
    config, report = validate_data(data)
    assert config is not None
    flagged = {f.path[1] for f in report.findings if f.code == "concurrency-mismatch"}
    limits, default = data["proxy"]["modelConcurrencyLimits"], data["proxy"]["concurrencyLimit"]
    expected = {name for name, w in data["workers"].items() if w["maxNumSeqs"] != limits.get(w["model"], default)}
    assert flagged == expected
    # out-of-range is reported independently of agreement
    out = {f.path for f in report.findings if f.code == "out-of-range"}
    for name, w in data["workers"].items():
        assert (("workers", name, "maxNumSeqs") in out) == (not 1 <= w["maxNumSeqs"] <= 4)
    # a config is valid exactly when it has no error findings
    assert report.ok == (not report.errors)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=25,
)


@st.composite
def perturbed(draw):
    """A structurally plausible fleet with random keys replaced by random JSON values."""
    data = draw(fleets())
    for _ in range(draw(st.integers(1, 4))):
        node, path = data, []
        while isinstance(node, dict) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node)))
            path.append(key)
            if not isinstance(node[key], dict):
                break
            node = node[key]
        if isinstance(node, dict):
            key = draw(st.sampled_from(sorted(node) + ["extra", "maxNumSeq"]))
            node[key] = draw(json_values)
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(perturbed() | json_values)
def test_random_input_only_ever_yields_the_validators_own_findings(data):
    config, report = validate_data(data)
    assert {f.code for f in report.findings} <= CODES
    for f in report.findings:
        assert f.message and "\n" not in f.message
        assert all(isinstance(p, str) for p in f.path)
    if config is None:
        assert not report.ok
