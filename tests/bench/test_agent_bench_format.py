"""The grammar and constrained-decoding benches' tables are pure functions of their reports."""

from __future__ import annotations

from devkit.scripts import load_script

constrained_bench = load_script("constrained_bench")  # and its --libraries mode, the grammar libraries' cost


def span(median, lo, hi):
    return {"median": median, "min": lo, "max": hi, "n": 3}


def test_the_grammar_table_shows_median_and_range_per_library():
    report = {"vocab": 150000, "tokens": 36, "runs": 3, "libraries": {
        "llguidance": {"setup_s": span(1.2, 0.8, 1.5), "compile_s": span(0.001, 0.001, 0.002), "per_token_us": span(330, 240, 458)}}}
    lines = constrained_bench.library_lines(report)
    assert lines[0] == "vocabulary 150000 entries, document 36 tokens, 3 runs"
    assert lines[2].split()[0] == "llguidance" and "330 (240-458)" in lines[2] and "1.200 (0.800-1.500)" in lines[2]


def test_the_constrained_table_shows_median_mad_range_and_acceptance():
    report = {"tokens": 96, "rounds": 5, "depth": 3, "configs": {
        "drafter+schema": {"tok_s": {"median": 197.1, "mad": 36.1, "min": 160.9, "max": 295.4, "n": 5},
                           "tokens_per_run": 96.0, "drafted": 600, "accepted": 270}}}
    lines = constrained_bench.format_lines(report)
    assert "5 rounds (+1 warm-up discarded), depth 3" in lines[0]
    row = lines[2]
    assert row.startswith("drafter+schema") and "197.1 ± 36.1" in row and "160.9-295.4" in row and row.endswith("270/600")


def test_the_restart_bench_reads_the_write_seconds_a_stopping_disk_tier_logs(tmp_path, caplog):
    import logging

    import mlx.core as mx

    from mtpstack.worker.prefix_disk import DiskTier
    from mtpstack.worker.prefix_disk_format import chain_key

    agent_bench = load_script("agent_bench")
    tier = DiskTier(tmp_path / "cache", 1 << 30, {"target": "t"}).open()
    tier.store(chain_key(None, [1, 2]), None, 0, [1, 2], [mx.ones((1, 2, 2, 4))], [mx.ones((4,))])
    with caplog.at_level(logging.INFO, logger="mtpstack.worker"):
        tier.close()
    log = tmp_path / "worker.log"
    log.write_text("\n".join(r.getMessage() for r in caplog.records) + "\n")
    got = agent_bench.tier_writes(log)
    assert got["writes"] == 1 and 0 <= got["sync_s"] <= got["write_s"] and got["written_mb"] >= 0.0
    assert agent_bench.tier_writes(tmp_path / "none.log") == {}
    rounds = [{"restart_ttft_s": 1.0, "cold_ttft_s": 2.0, "restore_s": 0.1, "read_bytes": 1e8, "cached_tokens": 9,
               "prompt_tokens": 10, **got, "write_s": 0.5, "sync_s": 0.1}]
    summary = agent_bench.restart_summary(rounds)
    assert summary["sync_share"]["median"] == 0.2
    assert "of it syncing 0.100 s (0.100-0.100, n=1): 0.20 (0.20-0.20, n=1) of the write time" in "\n".join(
        agent_bench.format_lines({"rounds": 1, "warmup": 0, "summary": {"restart": summary}}))
