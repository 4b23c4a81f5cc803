"""`bench/scripts/load_bench.py proxy`'s pure parts (`bench/scripts/load_report.py`): percentiles, the summary over
rounds, the table."""

from __future__ import annotations

from devkit.scripts import load_script
from mtpstack.bench.stats import percentile

_script = load_script("load_report")
summarize = _script.proxy_summary
table_lines = _script.proxy_table


def test_nearest_rank_percentile():
    v = [float(i) for i in range(1, 101)]
    assert percentile(v, 50) == 50.0
    assert percentile(v, 99) == 99.0
    assert percentile([3.0], 99) == 3.0


def _cell(lat: float, cpu: float, n: int = 10, first: float | None = None) -> dict:
    return {
        "latency": [lat] * n,
        "first_chunk": [] if first is None else [first] * n,
        "chunk_delay": [],
        "count": n,
        "cpu": cpu,
    }


def test_summary_subtracts_the_direct_path_of_the_same_round_and_gives_ratios():
    rounds = [
        {"plain/instant/1c": {"direct": _cell(1.0e-3, 0.001), "nginx": _cell(1.1e-3, 0.001), "mtpstack": _cell(1.5e-3, 0.004)}},
        {"plain/instant/1c": {"direct": _cell(2.0e-3, 0.001), "nginx": _cell(2.2e-3, 0.002), "mtpstack": _cell(2.4e-3, 0.004)}},
    ]
    s = summarize(rounds, ["nginx", "mtpstack"])["plain/instant/1c"]
    added = s["mtpstack"]["added_p50"]
    assert abs(added["min"] - 0.4e-3) < 1e-9 and abs(added["max"] - 0.5e-3) < 1e-9
    assert s["mtpstack_vs_nginx"]["cpu_per_request"]["max"] == 4.0
    assert s["direct"]["upstream_cpu_per_request"]["median"] == 0.0001
    text = "\n".join(table_lines({"plain/instant/1c": s}, ["nginx", "mtpstack"]))
    assert "mtpstack/nginx" in text and "450 (400..500)" in text


def test_two_loops_of_the_proxy_get_each_a_ratio_to_nginx_and_one_to_each_other():
    rounds = [{"plain/instant/4c": {
        "direct": _cell(1.0e-3, 0.001), "nginx": _cell(1.1e-3, 0.001),
        "mtpstack-uvloop": _cell(1.6e-3, 0.003), "mtpstack-asyncio": _cell(1.9e-3, 0.004),
    }}]
    proxies = ["nginx", "mtpstack-uvloop", "mtpstack-asyncio"]
    s = summarize(rounds, proxies)["plain/instant/4c"]
    assert s["mtpstack-uvloop_vs_nginx"]["cpu_per_request"]["median"] == 3.0
    assert s["mtpstack-uvloop_vs_mtpstack-asyncio"]["cpu_per_request"]["median"] == 0.75
    assert abs(s["mtpstack-uvloop_vs_mtpstack-asyncio"]["added_p50"]["median"] - 0.6 / 0.9) < 1e-9
    assert "mtpstack-asyncio_vs_mtpstack-uvloop" not in s
    text = "\n".join(table_lines({"plain/instant/4c": s}, proxies))
    assert "mtpstack-uvloop/mtpstack-asyncio: cpu_per_request 0.75x" in text
