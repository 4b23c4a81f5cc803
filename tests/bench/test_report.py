"""Formatting is pure: results in, lines out."""

from __future__ import annotations

import json

import pytest

from mtpstack.bench import report as rpt
from mtpstack.bench.stats import decide, summarize


def config(label: str, depth: int | None, e2e: list[float], *, pid: int = 100, drafted: int = 0, accepted: int = 0,
           digest: str = "same", kind: str | None = None) -> dict:
    passes = [
        {"e2e_tps": v, "decode_tps": v * 1.2, "ttft_s": 0.05, "tokens": 64, "seconds": 64 / v, "drafted": drafted,
         "accepted": accepted, "requests": [{"prompt_id": "code-01", "output_sha256": digest}]}
        for v in e2e
    ]
    return {"label": label, "depth": depth, "drafter_kind": kind, "status": "measured", "process": {"pid": pid},
            "workloads": {"code": {"warmup": passes[0] if passes else None, "passes": passes}}}


def results(*configs: dict, baseline: str = "no-drafter") -> dict:
    return {"schema": rpt.SCHEMA, "meta": {"worker": "w"}, "settings": {"workloads": ["code"], "margin": 0.05, "repeats": 3},
            "baseline": baseline, "configurations": list(configs)}


BASE = [20.0, 21.0, 22.0, 23.0, 24.0]
WIN = [30.0, 30.5, 31.0, 31.5, 32.0]


def test_summary_reads_like_hyperfine():
    assert rpt.format_summary(summarize([17.4, 22.0, 27.3]), "tok/s") == "22.0 ± 4.60 tok/s (min 17.4 … max 27.3, n 3)"


def test_not_significant_is_printed_before_any_ratio():
    line = rpt.format_verdict("depth 2", "no-drafter", decide(BASE, [21.0, 22.0, 23.0, 22.5, 21.5]))
    assert line.startswith("depth 2 vs no-drafter: not significant: keep the default")
    assert line.index("not significant") < line.index("ratio")


def test_an_adopted_change_shows_its_interval():
    line = rpt.format_verdict("depth 2", "no-drafter", decide(BASE, WIN))
    assert "adopt: 1.409x (95% CI" in line


@pytest.mark.parametrize("n", [1, 2])
def test_the_report_refuses_a_ratio_with_fewer_than_three_passes(n):
    res = results(config("no-drafter", None, BASE), config("depth 2", 2, WIN[:n], pid=101))
    text = "\n".join(rpt.render_report(res))
    verdict = next(line for line in text.splitlines() if line.startswith("depth 2 vs no-drafter:"))
    assert verdict.startswith("depth 2 vs no-drafter: too few passes to compare (n %d against 5" % n)
    assert verdict.endswith("; no ratio is printed")
    assert "CI" not in text and "adopt:" not in text and "1.4" not in text
    assert "recommendation: code: no recommendation" in text


def test_a_slower_configuration_is_marked_and_not_adopted():
    line = rpt.format_verdict("depth 6", "no-drafter", decide(WIN, BASE))
    assert "not significant: keep the default (slower)" in line


def test_report_has_table_warnings_with_a_remedy_and_a_recommendation():
    noisy = [15.0, 22.0, 30.0, 18.0, 26.0]
    res = results(config("no-drafter", None, BASE), config("depth 2", 2, WIN, pid=101, drafted=100, accepted=60, kind="mtp"),
                  config("depth 3", 3, noisy, pid=102, drafted=100, accepted=40, kind="model"))
    lines = rpt.render_report(res)
    text = "\n".join(lines)
    assert "| no-drafter | - | 100 | 5 |" in text
    assert "| depth 2 | mtp | 101 | 5 | 31.0 ± 0.500 | 30.0 … 32.0 |" in text
    assert "| depth 3 | model | 102 | 5 |" in text
    assert "| 60.0% |" in text
    assert "warning: code: the spread is large for depth 3 (MAD 18%, min … max 68% wide);" in text
    assert "no-drafter (MAD" not in text  # only the noisy configuration is named
    assert "measured spread: CV about " in text
    assert "hint: rerun with more `--repeats` on a quieter machine" in text
    assert "recommendation: code: use `depth 2`" in text


def test_greedy_output_that_changes_with_the_drafter_is_reported():
    res = results(config("no-drafter", None, BASE), config("depth 2", 2, WIN, pid=101, digest="other"))
    assert rpt.output_mismatches(res) == [
        "warning: code: prompt `code-01` gave different greedy output under `depth 2` than under `no-drafter`;"
        " speculative decoding should not change greedy text"
    ]


def test_aborted_configurations_are_named_in_the_report():
    bad = {"label": "depth 4", "depth": 4, "status": "aborted", "error": "the weights proof failed: x", "workloads": {}}
    text = "\n".join(rpt.render_report(results(config("no-drafter", None, BASE), bad)))
    assert "error: configuration `depth 4` was not measured: the weights proof failed: x" in text


def test_compare_pairs_configurations_by_label_with_the_same_rule():
    a = results(config("depth 2", 2, BASE))
    b = results(config("depth 2", 2, WIN))
    lines = rpt.compare_lines(a, b, a_name="A", b_name="B")
    assert lines[-1].startswith("code: B `depth 2` vs A `depth 2`: adopt:")
    few = rpt.compare_lines(a, results(config("depth 2", 2, WIN[:2])))
    assert "too few passes" in few[-1] and "x (" not in few[-1]


def test_compare_says_when_nothing_matches():
    a = results(config("depth 2", 2, BASE), config("depth 3", 3, BASE))
    b = results(config("depth 5", 5, WIN), config("depth 6", 6, WIN))
    assert rpt.compare_lines(a, b)[-1].startswith("error: no configuration to compare")


def test_plot_points_put_no_drafter_at_zero_and_the_figure_is_written(tmp_path):
    res = results(config("depth 3", 3, WIN), config("no-drafter", None, BASE), config("depth auto", "auto", WIN))
    # `auto` one past the deepest fixed depth.
    assert [(x, t) for x, t, _ in rpt.plot_points(res, "code")] == [(0, "none"), (3, "3"), (4, "auto")]
    path = rpt.plot_sweep(res, tmp_path / "sweep.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_load_results_rejects_other_files(tmp_path):
    other = tmp_path / "x.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(rpt.ResultsError):
        rpt.load_results(other)
    with pytest.raises(rpt.ResultsError) as e:
        rpt.load_results(tmp_path / "missing.json")
    assert e.value.hint


def test_a_sweep_on_the_reference_blas_is_flagged_with_the_fix():
    res = results(config("no-drafter", None, BASE))
    res["meta"]["blas"] = "bundled (reference BLAS, slow)"
    text = "\n".join(rpt.render_report(res))
    assert "warning: the workers ran mlx on its bundled reference BLAS" in text
    assert "hint: install Debian's OpenBLAS" in text


def test_a_recommendation_resting_on_an_undecided_comparison_says_so_and_a_decided_one_does_not():
    # The issue's case: depth 2 recommended at 585 tok/s against depth 3's 660 on 3 passes each.
    d2 = [560.0, 585.0, 640.0]
    d3 = [600.0, 660.0, 700.0]
    res = results(config("no-drafter", None, [300.0, 310.0, 320.0]), config("depth 2", 2, d2), config("depth 3", 3, d3))
    line = rpt.recommendation_line(res, "code")
    assert line.startswith("code: use `depth 2`")
    assert "rests on an undecided comparison: `depth 3` / `depth 2`" in line and "(3 and 3 passes)" in line
    # Many tight passes decide it: depth 3 is within noise of depth 2 with its whole interval below 1.05.
    res = results(config("no-drafter", None, [300.0, 310.0, 320.0]), config("depth 2", 2, [600.0, 601.0, 602.0, 603.0, 604.0]),
                  config("depth 3", 3, [605.0, 606.0, 607.0, 608.0, 609.0]))
    line = rpt.recommendation_line(res, "code")
    assert line == "code: use `depth 2` (the smallest depth within noise of the best)"


def test_emit_config_prints_the_recommended_depth_per_workload_as_yaml_and_nix():
    import yaml

    from mtpstack.validator import validate_data

    def two(label, depth, code, prose, pid):
        c = config(label, depth, code, pid=pid)
        c["workloads"]["prose"] = config(label, depth, prose, pid=pid)["workloads"]["code"]
        return c

    slow, fast = [20.0, 21.0, 22.0, 23.0, 24.0], [30.0, 30.5, 31.0, 31.5, 32.0]
    res = results(two("depth 3", 3, slow, fast, 100), two("depth 4", 4, fast, slow, 101), two("depth 2", 2, slow, fast, 102),
                  baseline="depth 3")
    res["settings"]["workloads"] = ["code", "prose"]
    res["meta"]["profile"] = {"drafter": {"depth": 3}, "maxNumSeqs": 2}
    lines = rpt.emit_config(res)
    text = "\n".join(lines)
    assert "width 2; these depths were not measured there" in text
    fragment = yaml.safe_load(text.split("# YAML\n")[1].split("\n\n")[0])
    assert fragment == {"workers": {"w": {"drafter": {"depth": {"code": 4, "prose": 3, "default": 3}}}}}
    assert "services.mtpstack.workers.w.drafter.depth = { code = 4; default = 3; prose = 3; };" in text
    # The fragment is a valid depth map.
    fleet = {"workers": {"w": {"model": "m", "target": {"path": "t", "bits": 4}, "maxNumSeqs": 1, "port": 8101,
                               "drafter": {"path": "d", "bits": 6, **fragment["workers"]["w"]["drafter"]}}}}
    config_, report = validate_data(fleet)
    assert config_ is not None and report.findings == []


def test_a_paired_verdict_names_its_statistic_and_the_unpaired_estimate_says_it_is_one():
    from mtpstack.bench.stats import decide

    noisy = [21.0, 22.0, 23.0, 22.5, 21.5, 20.0]
    line = rpt.format_verdict("depth 2", "no-drafter", decide(BASE + [20.0], noisy, paired=True), paired=True)
    assert "not significant" in line and "geometric mean of pair ratios" in line
    assert "; ratio " not in line
    spread = [summarize([15.0, 22.0, 30.0, 18.0, 26.0]), summarize([20.0, 21.0, 22.0, 23.0, 24.0])]
    assert "if unpaired; these passes are paired" in rpt.noise_note(spread, paired=True)
    assert "paired" not in rpt.noise_note(spread)


def test_a_configured_auto_is_kept_as_default_and_written_quoted_for_nix():
    slow, fast = [20.0, 21.0, 22.0, 23.0, 24.0], [30.0, 30.5, 31.0, 31.5, 32.0]
    res = results(config("depth auto", "auto", slow, pid=100), config("depth 4", 4, fast, pid=101), baseline="depth auto")
    res["meta"]["profile"] = {"drafter": {"depth": "auto"}, "maxNumSeqs": 1}
    text = "\n".join(rpt.emit_config(res))
    assert "services.mtpstack.workers.w.drafter.depth = { code = 4; default = \"auto\"; };" in text
    assert "        default: auto" in text
