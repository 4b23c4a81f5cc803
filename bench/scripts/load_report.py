"""The load bench's reports: pure functions from a result (the JSON `bench/scripts/load_bench.py` writes in each
mode) to its tables, the checks every run must pass, and the lines printed."""

from __future__ import annotations

import statistics
from collections import Counter
from functools import partial

from mtpstack.bench.parts import fmt, spread
from mtpstack.bench.stats import percentile

#: A client waiting longer than this for its next step (first chunk, end, error) is hung.
HANG_SECONDS = 20.0
#: Time for slots and gauges to come back to 0 after a fault before it counts as a leak.
SETTLE_SECONDS = 10.0


def table(headers: list[str], rows: list[list]) -> list[str]:
    """Left-aligned columns, two spaces apart; None shows as `-`."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def _int(v) -> int | None:
    return None if v is None else int(v)


def _times(d: dict, sort_by_count: bool = False) -> str:
    """`{"200": 8}` as `8 x 200`; by count, largest first, as `8 200` with `sort_by_count`."""
    if sort_by_count:
        return ", ".join(f"{n} {k}" for k, n in sorted(d.items(), key=lambda kv: -kv[1]))
    return ", ".join(f"{n} x {k}" for k, n in sorted(d.items()))


def _spread(values: list[float]) -> dict:
    return spread([x for x in values if x == x])  # NaN: a percentile of no samples


#: A spread as `median (min..max)`, `-` for none; `_us` in microseconds, `_ratio` a ratio.
cell = partial(fmt, digits=0, sep="..", count=False, missing="-")
_us, _ratio = partial(cell, scale=1e6), partial(cell, digits=2, unit="x")


def _dash(values: list[float], digits: int = 2) -> str:
    return cell(_spread(values), digits=digits, sep="-")


def _slots(v) -> str:
    if not isinstance(v, dict):
        return str(v)
    return f"inflight {_int(v.get('inflight'))}, queued {_int(v.get('queue_depth'))}"


# -- faults (the default mode) ------------------------------------------------------------------
def load_lines(rows: list[dict]) -> list[str]:
    headers = ["target", "gate", "ups", "clients", "maxWaiting", "requests", "answers", "unanswered", "streams ok",
               "max conc. per upstream", "proxy inflight max", "proxy RSS MiB before/half/after/peak", "req/s", "s"]
    out = []
    for r in rows:
        if r.get("target") == "fake":
            conc = ", ".join(str(v) for v in r["upstream_max_concurrency"].values())
            inflight = max((v or 0) for k, v in r["sampled_max"].items() if k.startswith("inflight"))
        else:
            conc = f"{_int(r['sampled_max'].get('worker_active_sequences'))} (sampled)"
            inflight = r["sampled_max"].get("proxy_inflight{worker=w0}")
        rss = "/".join("-" if (v := r["proxy_rss_kib"].get(k)) is None else f"{v / 1024:.1f}"
                       for k in ("before", "half", "after", "peak"))
        answers = ", ".join(filter(None, [f"{r['statuses'].get('200', 0)} x 200", _times(r["error_codes"])]))
        out.append([r["target"], r["gate"], r["upstreams"], r["clients"], r["max_waiting"], r["sent"], answers,
                    r["unanswered"], f"{r['streams_done']}/{r['streams']}", conc, _int(inflight), rss,
                    r["requests_per_second"], r["seconds"]])
    return table(headers, out)


def fault_lines(result: dict) -> list[str]:
    rows = []
    for key in ("fake_kills", "real_kills", "fake_failover"):
        if r := result.get(key):
            leaked = f"{r['rounds_with_leaked_slot']} rounds; after: {_slots(r['slots_after'])}"
            then = None
            if after := r.get("requests_after_failure"):
                then = f"then {_times(after['statuses']) or 'none'} of {after['sent']}"
            name = "SIGKILL, 1 of 2 workers" if key == "fake_failover" else "worker SIGKILL mid-stream"
            rows.append([name, r["target"], r["kills"], r["clients"], r["hung"], leaked, _times(r["outcomes"], True),
                         then])
    if r := result.get("real_failover"):
        kinds = ", ".join(f"{r['kill_kinds'].count(k)} {k}" for k in ("busy", "idle") if k in r.get("kill_kinds", ()))
        rows.append(["SIGKILL under load, 1 of 2 workers" + (f" ({kinds})" if kinds else ""), r["target"], r["kills"],
                     r["clients"], None, None,
                     f"{r['ok']} ok of {r['requests']}; {r['failed_over']} sent on to the survivor",
                     f"errors: {r['errors_taken_by_dead']} taken by the dead worker, {r['errors_not_taken']} not "
                     f"({_times(r['errors']) or 'none'})"])
    for key in ("fake_disconnects", "real_disconnects"):
        if r := result.get(key):
            rows.append(["client disconnect", r["target"], r["disconnects"], r["disconnects"], r["hung"],
                         f"after: {_slots(r['slots_after'])}", _times(r["kinds"], True),
                         _times(r.get("proxy_logged", {})) or None])
    headers = ["fault", "target", "count", "clients", "hung", "leaked proxy slots", "client outcomes", "proxy logged"]
    return table(headers, rows)


def failover_counts(outcomes: dict[str, str], logged: dict[str, dict], kills: list[float], dead: str) -> dict:
    """What the clients saw (`outcomes`: request id -> "ok" or what went wrong) while `dead` was killed at the
    wall-clock `kills`, by the proxy's request lines (`logged`). An error the dead worker had taken was sent to it
    before a kill and ended after; every other counts against the goal of none."""
    out = {"requests": len(outcomes), "ok": 0, "errors_taken_by_dead": 0, "errors_not_taken": 0, "failed_over": 0}
    errors, not_taken = Counter(), []
    for rid, outcome in outcomes.items():
        line = logged.get(rid, {})
        out["failed_over"] += dead in (line.get("failed_over") or ())
        if outcome == "ok":
            out["ok"] += 1
            continue
        errors[outcome] += 1
        if line.get("worker") == dead and any(line["sent"] <= k <= line["ended"] for k in kills):
            out["errors_taken_by_dead"] += 1
        else:
            out["errors_not_taken"] += 1
            not_taken.append(rid)
    return {**out, "errors": dict(errors), "errors_not_taken_ids": not_taken[:20]}


def finished(name: str, r: dict, key: str) -> tuple[bool, str]:
    return r[key] == r["requested"], f"{name}: {key} done before the deadline: {r[key]}"


def kill_checks(name: str, r: dict) -> list[tuple[bool, str]]:
    return [
        finished(name, r, "kills"), (r["hung"] == 0, f"{name}: hung clients: {r['hung']}"),
        (r["rounds_with_leaked_slot"] == 0 and not r["leaked_after"],
         f"{name}: leaked slots: {r['rounds_with_leaked_slot']} rounds, after settling {r['slots_after']}"),
    ]


def load_checks(r: dict) -> list[tuple[bool, str]]:
    """Every request answered, the gates held, 429s only where the queue bound allows."""
    name = f"{r['target']} gate {r['gate']}, maxWaiting {r['max_waiting']}"
    out = [(r["unanswered"] == 0, f"{name}: requests unanswered: {r['unanswered']}"),
           (r.get("complete", True), f"{name}: all {r['requested']} requests sent before the deadline: {r['sent']}")]
    if r["target"] == "fake":
        conc = list(r["upstream_max_concurrency"].values())
        out += [(all(c == r["gate"] for c in conc),
                 f"{name}: largest concurrency each upstream saw equals the gate {r['gate']}: {conc}"),
                (r["upstream_violations"] == 0,
                 f"{name}: requests an upstream refused above its gate: {r['upstream_violations']}"),
                (r["inflight_after"] == 0, f"{name}: proxy inflight after the run: {r['inflight_after']}")]
    else:
        active = r["sampled_max"].get("worker_active_sequences")
        out += [(active is not None and active <= r["gate"],
                 f"{name}: worker active sequences never above the gate (sampled max): {_int(active)}"),
                (r["worker_full_rejections"] == 0,
                 f"{name}: worker_full 429s from the worker: {r['worker_full_rejections']}")]
    inflight = [v for k, v in r["sampled_max"].items() if "inflight" in k]
    out.append((all(v is not None and v <= r["gate"] for v in inflight),
                f"{name}: proxy inflight never above the gate (sampled max): {[_int(v) for v in inflight]}"))
    others = {k: n for k, n in r["error_codes"].items() if k != "429 queue_full"}
    out.append((not others, f"{name}: answers other than 200 and 429 queue_full: {others or 0}"))
    qf = r["error_codes"].get("429 queue_full", 0)
    if r["queue_bound_reachable"]:
        out.append((qf > 0 and r["retry_after_missing"] == 0,
                    f"{name}: the queue bound was hit and every 429 queue_full had Retry-After: {qf} "
                    f"(without: {r['retry_after_missing']}; values: {r.get('retry_after_values') or {}})"))
    else:
        out.append((qf == 0, f"{name}: 429 queue_full while the queue had room for every client: {qf}"))
    cut = r["stream_errors"] + r["stream_truncated"]
    return out + [(cut == 0, f"{name}: streams ending without [DONE]: {cut}")]


def disconnect_checks(r: dict) -> list[tuple[bool, str]]:
    name = f"{r['target']} client disconnects ({r['disconnects']} of {r['requested']})"
    out = [finished(name, r, "disconnects"), (r["hung"] == 0, f"{name}: hung clients: {r['hung']}"),
           (not r["leaked_after"], f"{name}: leaked proxy slots after settling: {r['slots_after']}")]
    if "upstream_active_after" in r:
        active = sum((v or 0) for v in r["upstream_active_after"].values())
        out.append((active == 0, f"{name}: requests still active in the upstreams after settling: {active}"))
    if "worker_active_sequences_after" in r:
        out.append((not r["worker_leaked_after"],
                    f"{name}: worker active sequences after settling: {_int(r['worker_active_sequences_after'])}"))
    if "proxy_logged" in r:
        other = {k: n for k, n in r["proxy_logged"].items() if k != "499"}
        out.append((not other, f"{name}: disconnects the proxy logged with a status other than 499: {other or 0}"))
    if "tokens_generated" in r:
        out.append((r["tokens_generated"] < r["tokens_if_never_stopped"], f"{name}: tokens the worker generated for "
                    f"them: {r['tokens_generated']} (at most {r['tokens_if_never_stopped']} if it never stopped)"))
    again = r.get("serves_again") or {}
    out.append((again.get("unanswered", 1) == 0 and again.get("statuses", {}).get("200", 0) == again.get("sent", -1),
                f"{name}: every model serves again afterwards: {again.get('statuses')}"))
    return out


def checks(result: dict) -> list[tuple[bool, str]]:
    """(passed, sentence) for every property the run must show."""
    out: list[tuple[bool, str]] = [c for r in result.get("load", []) for c in load_checks(r)]
    for key in ("fake_kills", "real_kills"):
        if r := result.get(key):
            name = f"{r['target']} worker kills ({r['kills']} of {r['requested']})"
            cut = r["admitted_streams_cut_without_error_event"]
            out += [*kill_checks(name, r), (cut == 0, f"{name}: streams cut without an error event: {cut}")]
    if r := result.get("fake_failover"):
        name = f"fake failover ({r['kills']} of {r['requested']})"
        after, want = r["requests_after_failure"], {"done": r["kills"], "error_event": r["kills"]}
        ok = after["statuses"].get("200", 0)
        out += [*kill_checks(name, r),
                (r["outcomes"] == want, f"{name}: the stream on the dead worker ends with an error event, the one on "
                 f"the survivor with [DONE]: {r['outcomes']}"),
                (after["sent"] > 0 and ok == after["sent"], f"{name}: requests right after the failure answered 200 "
                 f"(by the survivor): {ok} of {after['sent']} {after['error_codes'] or ''}".rstrip())]
    if r := result.get("real_failover"):
        name = f"real failover under load ({r['kills']} of {r['requested']} kills)"
        out += [finished(name, r, "kills"),
                (r["errors_not_taken"] == 0, f"{name}: errors for requests the dead worker had not taken: "
                 f"{r['errors_not_taken']} {r['errors_not_taken_ids'] or ''}".rstrip()),
                (r["ok"] > 0 and r["requests"] > 0, f"{name}: requests answered: {r['ok']} of {r['requests']}")]
    for key in ("fake_disconnects", "real_disconnects"):
        if r := result.get(key):
            out += disconnect_checks(r)
    return out


def report_lines(result: dict) -> list[str]:
    meta = result["meta"]
    lines = [f"mtpstack load bench, {meta['finished']}", f"command: {meta['command']}",
             f"machine: {meta['cpus']} CPUs, {meta['machine']}, commit {meta['commit']}, {meta['seconds']} s",
             *(["uncommitted changes in the checkout: " + ", ".join(meta["modified"])] if meta.get("modified") else []),
             "",
             "Load (answers by status; streams ok = streamed requests that ended with [DONE])",
             *load_lines(result.get("load", [])), "",
             f"Faults (hung = no end, error or status within {HANG_SECONDS:g} s; leaked = proxy inflight or queue not "
             f"back to 0 within {SETTLE_SECONDS:g} s)", *fault_lines(result), ""]
    cs = checks(result)
    lines.append(f"Checks: {sum(ok for ok, _ in cs)} of {len(cs)} hold")
    lines += [f"  {'ok  ' if ok else 'FAIL'}  {text}" for ok, text in cs]
    return lines + [f"  FAIL  phase did not finish: {note}" for note in result.get("errors", [])]


# -- hostile --------------------------------------------------------------------------------------
#: The proxy's deadline in the hostile mode: short, so 200 slow clients finish in seconds.
CLIENT_SECONDS = 2.0
#: The stall measurement: hostile schemas sent this many at a time, this many per repeat, after
#: this long idle (`devkit.stall`).
STALL_WIDTH, STALL_SCHEMAS, STALL_IDLE_SECONDS = 8, 16, 1.5
#: The grammar flood: the probes go this long after the flood began (issue 40's adversarial run).
FLOOD_PROBE_DELAY = 0.5
#: The bound issue 40 sets for `/health` and a plain stream's largest gap during the flood, seconds.
FLOOD_STALL_GOAL = 1.0
#: What each hostile request of the grammar flood may get (`flood_answer_kind`).
FLOOD_EXPECTED = ("400 schema", "429 busy", "503 busy")
#: Each promised zero: its name, the phases it needs (any of them ran: it is reported), its counts.
ZEROS = [
    ("validate tracebacks", ("validate",), ("validate.tracebacks", "validate.internal_errors", "validate.no_json")),
    ("proxy 5xx", ("proxy",), ("proxy.malformed.5xx", "proxy.slow.5xx", "proxy.log.logged_5xx")),
    ("proxy log lines not JSON", ("proxy",), ("proxy.log.not_one_json_object",)),
    ("proxy log tracebacks", ("proxy",), ("proxy.log.with_traceback_field",)),
    ("proxy internal errors", ("proxy",), ("proxy.log.internal_errors",)),
    ("proxy hangs", ("proxy",), ("proxy.malformed.hangs", "proxy.slow.hangs")),
    ("proxy crashes", ("proxy",), ("proxy.crashed", "proxy.malformed.crashed")),
    ("proxy leaked slots", ("proxy",), ("proxy.leaked_slots",)),
    ("worker 5xx", ("worker",), ("worker.malformed.5xx",)),
    ("worker tracebacks", ("worker",), ("worker.log_tracebacks",)),
    ("worker hangs", ("worker",), ("worker.malformed.hangs",)),
    ("worker crashes", ("worker",), ("worker.crashed", "worker.malformed.crashed")),
    ("worker leaked slots", ("worker",), ("worker.leaked_slots",)),
    ("refusals not in OpenAI's shape", ("proxy", "worker", "agent"),
     ("proxy.unrouted_not_json", "worker.unrouted_not_json", "proxy.agent.not_json", "agent.requests.not_json")),
    ("agent 5xx (proxy, worker)", ("agent",), ("proxy.agent.5xx", "agent.requests.5xx")),
    ("agent hangs", ("agent",), ("proxy.agent.hangs", "agent.requests.hangs")),
    ("agent 400s naming no field", ("agent",), ("agent.requests.unnamed_400", "agent.seeds_not_named")),
    ("agent worker log errors, not JSON", ("agent",), ("agent.log_errors", "agent.log_not_json")),
    ("agent worker crashes, slots", ("agent",), ("agent.crashed", "agent.leaked_slots")),
]


def flood_answer_kind(status: int | None, error: dict) -> str:
    """What one hostile request of the flood got: its fuel refusal (the schema's own fault), the
    worker busy, a 400 blaming the compile deadline (the fault issue 40 removes), or anything else."""
    message = error.get("message") or ""
    if status == 400 and "did not compile within" in message:
        return "400 deadline"
    if status == 400 and error.get("param") in ("response_format", "tool_choice"):
        return "400 schema"
    if status in (429, 503) and error.get("code") == "worker_busy":
        return f"{status} busy"
    return f"{status} other"


def _total(r: dict, *paths: str) -> int:
    """The sum of the counts at `paths` (`phase.key.key`); a phase that did not run counts 0."""
    total = 0
    for path in paths:
        node = r
        for key in path.split("."):
            node = node.get(key, {}) if isinstance(node, dict) else {}
        total += node if isinstance(node, int) else 0
    return total


def must_be_zero(r: dict) -> dict[str, int]:
    """The counts the hardening promises are 0, for the phases that ran."""
    out = {name: _total(r, *paths) for name, phases, paths in ZEROS if any(p in r for p in phases)}
    if "flood" in r:
        rounds = r["flood"]["arms"]["this"]
        out["flood: probes not answered 200"] = sum(p["status"] != 200 for x in rounds for p in x["probes"].values())
        out["flood: answers but a fuel 400 or worker_busy"] = sum(
            n for x in rounds for kind, n in x["hostile"].items() if kind not in FLOOD_EXPECTED)
    return out


def hostile_lines(r: dict) -> list[str]:
    lines = []
    if v := r.get("validate"):
        lines.append(f"validate: {v['configs']} configs in {v['seconds']} s: "
                     f"exit 0/1/2 = {v['exit_0']}/{v['exit_1']}/{v['exit_2']}")
    for name in ("proxy", "worker"):
        if m := r.get(name, {}).get("malformed"):
            lines.append(f"{name}: {m['requests']} malformed requests in {m['seconds']} s, statuses {m['statuses']}, "
                         f"{m['closed_without_answer']} closed without an answer")
        if s := r.get(name, {}).get("slow"):
            lines += [f"proxy: {s['slow_clients']} slow clients at once: {s['answered_408']} answered 408, "
                      f"{s['closed']} closed; held {s['held_seconds_median']} s median, {s['held_seconds_max']} s max "
                      f"(deadline {CLIENT_SECONDS:g} s)",
                      f"proxy log: {r['proxy']['log']['lines']} lines"]
    if a := r.get("agent"):
        st, q = a["stall"], a["requests"]
        proxy_statuses = f"; to the proxy, statuses {r['proxy']['agent']['statuses']}" if "proxy" in r else ""
        lines += [f"agent: {q['requests']} hostile requests ({q.get('messages', 0)} on /v1/messages) to the worker in "
                  f"{q['seconds']} s, statuses {q['statuses']}{proxy_statuses}; {a['seeds']} seeds; "
                  f"{a['cut_streams']} streams cut",
                  f"agent: while {STALL_SCHEMAS} hostile schemas compile, {STALL_WIDTH} at a time ({st['repeats']} "
                  f"repeats, median (min-max)): /health {_dash(st['loaded_health_max'])} s at worst "
                  f"(idle {_dash(st['idle_health_max'])}), a plain stream's largest gap "
                  f"{_dash(st['loaded_gap_max'])} s (idle {_dash(st['idle_gap_max'])})"]
    if "flood" in r:
        lines += flood_lines(r["flood"])
    return [*lines, "", *(f"{name:>50}: {n}" for name, n in must_be_zero(r).items())]


def flood_lines(f: dict) -> list[str]:
    lines = [f"flood: {f['hostile']} hostile schemas at once, probes {FLOOD_PROBE_DELAY:g} s later, {f['repeats']} "
             f"repeats, median (min-max); goal: probes 200, /health and the stream's gap within {FLOOD_STALL_GOAL:g} s"]
    for arm, rounds in f["arms"].items():
        if not rounds:
            continue
        lines.append(f"  {'this checkout' if arm == 'this' else 'against ' + str(f['against'])}:")
        kinds = sorted({k for x in rounds for k in x["hostile"]})
        lines.append("    hostile answers per repeat: " + ", ".join(
            f"{kind} {_dash([x['hostile'].get(kind, 0) for x in rounds], 0)}" for kind in kinds))
        for name in rounds[0]["probes"]:
            answers = [x["probes"][name] for x in rounds]
            statuses = Counter(f"{a['status']}" + (f" {a['code']}" if a["code"] else "") for a in answers)
            lines.append(f"    {name}: {_times(statuses)}, answered in {_dash([a['seconds'] for a in answers])} s")
        each = {k: _dash([x[k] for x in rounds]) for k in rounds[0] if k.endswith("_max")}
        lines.append(f"    /health at worst {each['loaded_health_max']} s (idle {each['idle_health_max']}), a plain "
                     f"stream's largest gap {each['loaded_gap_max']} s (idle {each['idle_gap_max']})")
    return lines


# -- proxy ----------------------------------------------------------------------------------------
#: Chunks of each stream the proxy mode's upstreams write.
PROXY_CHUNKS = 256


def comparisons(proxies: list[str]) -> list[tuple[str, str]]:
    """The per-round ratios reported: each mtpstack proxy to nginx, and the first mtpstack proxy
    (`--loops`' first loop) to each other one."""
    ours = [p for p in proxies if p.startswith("mtpstack")]
    return [(p, "nginx") for p in ours if "nginx" in proxies] + [(ours[0], p) for p in ours[1:]]


def _proxy_round(m: dict, direct: dict, kind: str) -> dict:
    """One proxy's figures in one round of a cell: its latencies less the direct path's, its CPU per unit."""
    added = lambda key, q: percentile(m[key], q) - percentile(direct[key], q)  # noqa: E731
    out = {"added_p50": added("latency", 50), "added_p99": added("latency", 99),
           "cpu_per_request": m["cpu"] / max(1, m["count"])}
    if kind == "sse":
        out.update(added_first_chunk_p50=added("first_chunk", 50), first_chunk_p50=percentile(m["first_chunk"], 50),
                   cpu_per_chunk=m["cpu"] / max(1, m["count"] * PROXY_CHUNKS))
        if m.get("chunk_delay") and direct.get("chunk_delay"):
            out.update(added_chunk_delay_p50=added("chunk_delay", 50), added_chunk_delay_p99=added("chunk_delay", 99))
        out["throughput_vs_direct"] = statistics.median(direct["latency"]) / statistics.median(m["latency"])
    return out


def proxy_summary(rounds: list[dict], proxies: list[str]) -> dict:
    """Per cell: per-round added latencies and CPU per unit, then their spread over rounds."""
    out: dict = {}
    for key in rounds[0]:
        per: dict[str, dict[str, list[float]]] = {p: {} for p in proxies}
        for rnd in rounds:
            for p in proxies:
                if p in rnd[key]:
                    for name, v in _proxy_round(rnd[key][p], rnd[key]["direct"], key.split("/")[0]).items():
                        per[p].setdefault(name, []).append(v)
        cell = {p: {k: _spread(v) for k, v in per[p].items()} for p in proxies if per[p]}
        direct = [r[key]["direct"] for r in rounds]
        cell["direct"] = {"upstream_cpu_per_request": _spread([d["cpu"] / max(1, d["count"]) for d in direct])}
        for a, b in comparisons(proxies):
            if per.get(a) and per.get(b):
                cell[f"{a}_vs_{b}"] = {k: _spread([x / y for x, y in zip(per[a][k], per[b][k]) if y > 0])
                                       for k in ("cpu_per_request", "cpu_per_chunk", "added_p50") if k in per[a]}
        out[key] = cell
    return out


#: The proxy table's columns after the cell's and the proxy's: heading -> the summary's key.
PROXY_COLUMNS = {"added p50 us": "added_p50", "added p99 us": "added_p99", "first chunk +us": "added_first_chunk_p50",
                 "CPU/req us": "cpu_per_request", "CPU/chunk us": "cpu_per_chunk"}


def proxy_table(summary: dict, proxies: list[str]) -> list[str]:
    """One row per cell and proxy, then each cell's stream figures and ratios; microseconds, median (min..max)."""
    rows, notes = [], []
    for key, figs in summary.items():
        if up := figs.get("direct", {}).get("upstream_cpu_per_request"):
            rows.append([key, "(direct)", None, None, None, _us(up), None])
        rows += [[key, p, *(_us(figs[p].get(k)) for k in PROXY_COLUMNS.values())] for p in proxies if p in figs]
        for p, c in ((p, figs[p]) for p in proxies if "throughput_vs_direct" in figs.get(p, {})):
            delay = (f"; added per-chunk delay p50 {_us(c['added_chunk_delay_p50'])} us, p99 "
                     f"{_us(c['added_chunk_delay_p99'])} us") if "added_chunk_delay_p50" in c else ""
            notes.append(f"{key} {p}: stream throughput vs direct {_ratio(c['throughput_vs_direct'])}{delay}")
        for a, b in comparisons(proxies):
            if r := figs.get(f"{a}_vs_{b}"):
                notes.append(f"{key} ratio {a}/{b}: " + ", ".join(f"{k} {_ratio(v)}" for k, v in r.items()))
    return [*table(["cell", "proxy", *PROXY_COLUMNS], rows), *notes]


def _load(meta: dict) -> str:
    return f"load average {meta['loadavg_start'][0]:.1f} -> {meta['loadavg'][0]:.1f} on {meta['cpus']} CPUs"


def proxy_lines(result: dict) -> list[str]:
    meta = result["meta"]
    lines = [f"{meta['rounds']} interleaved rounds; times in microseconds, median (min..max) over rounds; added = "
             f"proxied minus direct in the same round; (direct): the upstream's own CPU; {_load(meta)}",
             *proxy_table(result["summary"], result["proxies"])]
    if (poll := meta["dashboard_poll"]) is not None:
        lines.append(f"dashboard: one page polled /v1/fleet/status {poll['polls']} times ({poll['failed']} failed)")
    return lines


# -- tenant ---------------------------------------------------------------------------------------
#: Fair queueing on and off, each a proxy of its own.
TENANT_MODES = {"fair": True, "fifo": False}


def tenant_lines(result: dict) -> list[str]:
    rounds, rows = result["rounds"], []
    for mode, fair in TENANT_MODES.items():
        per = [r[mode] for r in rounds]
        ms = lambda key, q: cell(_spread([percentile(p[key], q) for p in per]), scale=1000)  # noqa: E731
        rows.append(["on" if fair else "off", ms("steady_queue_wait", 50), ms("steady_queue_wait", 95),
                     ms("steady_latency", 50), cell(spread([p["flood_served"] for p in per])),
                     sum(p["steady_errors"] + p["flood_errors"] for p in per)])
    headers = ["fair queueing", "steady p50", "steady p95", "steady latency p50", "flood streams served", "errors"]
    return [f"{len(rounds)} rounds; tenant `steady`'s queue wait in ms, per phase p50 / p95, median (min..max) over "
            f"rounds; {_load(result['meta'])}", *table(headers, rows)]
