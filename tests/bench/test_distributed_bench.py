"""The distributed bench, run for real: one round of every configuration on the shipped demo pair, and one
lost rank per signal on the tiny hybrid pair (`--lose-rank`)."""

from __future__ import annotations

import pytest

from devkit.scripts import load_script
from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET
from tests.bench.conftest import run_bench

db = load_script("distributed_bench")


def run(tmp_path, *args: str) -> tuple[dict, str]:
    report, done = run_bench("distributed_bench", tmp_path / "distributed.json", *args, timeout=900)
    return report, done.stderr


def test_one_round_measures_every_configuration_at_every_width_against_one_process(tmp_path):
    report, table = run(tmp_path, "--target", str(DEMO_TARGET), "--drafter", str(DEMO_HEAD), "--repeats", "1",
                        "--warmup", "0", "--max-tokens", "8")
    assert (report["meta"]["target"], report["meta"]["head"], report["meta"]["repeats"]) == (
        str(DEMO_TARGET), str(DEMO_HEAD), 1)
    widths = [str(w) for w in db.WIDTHS]
    samples, tok_s, ratio = report["samples"], report["summary"]["tok_s"], report["summary"]["ratio"]
    assert {name: list(by_width) for name, by_width in samples.items()} == {name: widths for name in db.CONFIGS}
    for name in db.CONFIGS:
        for w in widths:
            s = tok_s[name][w]
            assert s["n"] == 1 and s["min"] == s["median"] == s["max"] > 0 and samples[name][w] == [s["median"]]
            base = tok_s[db.baseline_of(name)][w]["median"]
            assert ratio[name][w] == pytest.approx(s["median"] / base)
        assert f"  {name:<13} width 1: " in table
    # Pipeline ranks run the same layers in the same order: token for token one process's greedy text.
    notes = report["summary"]["notes"]
    assert not [n for n in notes if "`pipeline" in n] and notes[-1].startswith("only 1 repeats")


def test_a_rank_lost_to_a_kill_or_a_hang_is_noticed_and_rank_0_exits_non_zero(tmp_path):
    report, table = run(tmp_path, "--lose-rank", "--repeats", "1")
    assert report["meta"]["settle_s"] == db.SETTLE_SECONDS and list(report["runs"]) == list(db.SIGNALS)
    for name, runs in report["runs"].items():
        (r,) = runs
        assert 0 < r["unhealthy_s"] <= r["exited_s"] and r["exit_code"] != 0
        assert any(line.startswith(f"{name}: /health non-200 after ") and line.endswith(", n=1")
                   for line in table.splitlines())
