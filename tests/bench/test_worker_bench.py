"""The worker bench, run for real: every default configuration on the shipped demo pair, a warm-up round and
two kept ones of a few tokens each."""

from __future__ import annotations

import ast
import re

from devkit.scripts import load_script
from mtpstack.bench.servers import WIDTH
from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET
from tests.bench.conftest import run_bench

wb = load_script("worker_bench")

REPEATS, TOKENS = 2, 12
#: Servers that honour `ignore_eos`, so every answer is `TOKENS` long (the peers may stop at their end of turn).
NATIVE = ("native+mtp", "native")


def texts_named(note: str) -> dict[str, str]:
    """The configurations' texts a "greedy texts differ" note names (each cut to 40 characters)."""
    pairs = re.findall(r"([\w.+@-]+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")", note.split(": ", 2)[-1])
    return {name: ast.literal_eval(text) for name, text in pairs}


def test_every_configuration_reports_its_spreads_tokens_drafts_and_the_same_greedy_text(tmp_path):
    report, done = run_bench("worker_bench", tmp_path / "worker.json", "--target", str(DEMO_TARGET), "--drafter",
                             str(DEMO_HEAD), "--repeats", str(REPEATS), "--warmup", "1", "--max-tokens", str(TOKENS))
    meta, samples, summary = report["meta"], report["samples"], report["summary"]
    assert (meta["target"], meta["head"]) == (str(DEMO_TARGET), str(DEMO_HEAD))
    assert (meta["repeats"], meta["warmup"], meta["max_tokens"]) == (REPEATS, 1, TOKENS)
    configs = wb.default_configs(None)
    assert list(samples["single"]) == list(samples["concurrent"]) == configs
    assert list(summary["single"]) == list(summary["concurrent"]) == configs

    spreads = [s for name in configs for s in (summary["single"][name]["tok_s"], summary["single"][name]["ttft_s"],
                                               *summary["concurrent"][name].values())]
    spreads += [s for c in summary["step_costs"].values() for key, s in c.items() if key != "step_ms_inside"]
    assert all(s["n"] == REPEATS and 0 < s["min"] <= s["median"] <= s["max"] for s in spreads)  # warm-up left out
    for name in configs:
        single = summary["single"][name]
        assert single["ttft_cold_s"]["n"] + single["ttft_hit_s"]["n"] == REPEATS
        runs, concurrent = samples["single"][name], samples["concurrent"][name]
        assert len(runs) == len(concurrent) == REPEATS
        assert all(0 < r["tokens"] <= TOKENS for r in runs)
        assert all(len(c["tokens"]) == WIDTH and all(0 < t <= TOKENS for t in c["tokens"]) for c in concurrent)
        if name in NATIVE:
            assert all(r["tokens"] == TOKENS for r in runs) and all(c["tokens"] == [TOKENS] * WIDTH for c in concurrent)

    # The head loaded where asked and only there: the native worker's usage counts its drafts, mlx-vlm's
    # speculative rounds are fewer than the tokens after the first; without a head a step per token.
    assert all(r["drafted"] > 0 and 0 <= r["accepted"] <= r["drafted"] for r in samples["single"]["native+mtp"])
    assert all(r["drafted"] == 0 and r["steps"] == r["tokens"] - 1 for r in samples["single"]["native"])
    assert all(r["steps"] < r["tokens"] - 1 for r in samples["single"]["mlx-vlm+mtp"])
    assert list(summary["step_costs"]) == ["native+mtp", "mlx-vlm+mtp"] and 0 < summary["acceptance"] <= 1
    assert all(summary["speedup"].values()) and all(value is not None for value in summary["goals"].values())
    # One target everywhere: the same greedy text from the native worker and mlx-vlm, with and without the
    # head. mlx_lm.server's `text` holds its answer's content only, empty while the demo's thinking lasts.
    for note in summary["notes"]:
        if "greedy texts differ" in note:
            texts = texts_named(note)
            assert set(texts) == set(configs) and len({texts[n] for n in configs if n != "mlx_lm.server"}) == 1, note
    assert summary["notes"][-1].startswith(f"only {REPEATS} repeats")
    assert all(f"  {name:<22} " in done.stderr for name in configs)
