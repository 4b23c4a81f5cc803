"""The load bench's report: pure functions from its result (the JSON `bench/scripts/load_bench.py`
writes) to the table, the checks every run must pass, and the lines printed. Tested by
`tests/bench/test_load_bench_format.py`."""

from __future__ import annotations

#: A client waiting longer than this for its next step (first chunk, end, error) is hung.
HANG_SECONDS = 20.0
#: Time for slots and gauges to come back to 0 after a fault before it counts as a leak.
SETTLE_SECONDS = 10.0


def table(headers: list[str], rows: list[list]) -> list[str]:
    """Left-aligned columns, two spaces apart; None shows as `-`."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def mib(kib: int | None) -> str | None:
    return None if kib is None else f"{kib / 1024:.1f}"


def _statuses(r: dict) -> str:
    parts = [f"{r['statuses'].get('200', 0)} x 200"]
    for code, n in sorted(r.get("error_codes", {}).items()):
        parts.append(f"{n} x {code}")
    return ", ".join(parts)


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
        rss = r["proxy_rss_kib"]
        out.append([r["target"], r["gate"], r["upstreams"], r["clients"], r["max_waiting"], r["sent"], _statuses(r), r["unanswered"],
                    f"{r['streams_done']}/{r['streams']}", conc, _int(inflight),
                    "/".join(mib(rss.get(k)) or "-" for k in ("before", "half", "after", "peak")), r["requests_per_second"], r["seconds"]])
    return table(headers, out)


def _int(v) -> int | None:
    return None if v is None else int(v)


def _outcomes(d: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(d.items(), key=lambda kv: -kv[1]))


def fault_lines(result: dict) -> list[str]:
    rows = []
    for key in ("fake_kills", "real_kills"):
        r = result.get(key)
        if r:
            leaked = f"{r['rounds_with_leaked_slot']} rounds; after: {_slots(r['slots_after'])}"
            rows.append(["worker SIGKILL mid-stream", r["target"], r["kills"], r["clients"], r["hung"], leaked, _outcomes(r["outcomes"]), None])
    r = result.get("fake_failover")
    if r:
        leaked = f"{r['rounds_with_leaked_slot']} rounds; after: {_slots(r['slots_after'])}"
        after = r["requests_after_failure"]
        answered = ", ".join(f"{n} x {k}" for k, n in sorted(after["statuses"].items())) or "none"
        rows.append(["SIGKILL, 1 of 2 workers", r["target"], r["kills"], r["clients"], r["hung"], leaked, _outcomes(r["outcomes"]),
                     f"then {answered} of {after['sent']}"])
    r = result.get("real_failover")
    if r:
        errors = ", ".join(f"{n} x {k}" for k, n in sorted(r["errors"].items())) or "none"
        kinds = ", ".join(f"{r['kill_kinds'].count(k)} {k}" for k in ("busy", "idle") if k in r.get("kill_kinds", ()))
        rows.append(["SIGKILL under load, 1 of 2 workers" + (f" ({kinds})" if kinds else ""), r["target"], r["kills"], r["clients"], None, None,
                     f"{r['ok']} ok of {r['requests']}; {r['failed_over']} sent on to the survivor",
                     f"errors: {r['errors_taken_by_dead']} taken by the dead worker, {r['errors_not_taken']} not ({errors})"])
    for key in ("fake_disconnects", "real_disconnects"):
        r = result.get(key)
        if r:
            logged = ", ".join(f"{n} x {k}" for k, n in sorted(r.get("proxy_logged", {}).items())) or None
            rows.append(["client disconnect", r["target"], r["disconnects"], r["disconnects"], r["hung"], f"after: {_slots(r['slots_after'])}",
                         _outcomes(r["kinds"]), logged])
    return table(["fault", "target", "count", "clients", "hung", "leaked proxy slots", "client outcomes", "proxy logged"], rows)


def failover_counts(outcomes: dict[str, str], logged: dict[str, dict], kills: list[float], dead: str) -> dict:
    """Pure: what the clients saw while `dead` was killed (at the wall-clock `kills`) under load.
    `outcomes`: request id -> "ok" or what went wrong; `logged`: request id -> the proxy's request
    line (`worker`, `failed_over`, `code`, `sent` and `ended` in wall-clock seconds). A request the
    dead worker had taken is one sent to it before a kill and ended after it; every other error
    counts against the goal of none."""
    out = {"requests": len(outcomes), "ok": 0, "errors_taken_by_dead": 0, "errors_not_taken": 0, "failed_over": 0,
           "errors": {}, "errors_not_taken_ids": []}
    for rid, outcome in outcomes.items():
        line = logged.get(rid)
        if line is not None and dead in (line.get("failed_over") or ()):
            out["failed_over"] += 1
        if outcome == "ok":
            out["ok"] += 1
            continue
        out["errors"][outcome] = out["errors"].get(outcome, 0) + 1
        taken = line is not None and line.get("worker") == dead and any(line["sent"] <= k <= line["ended"] for k in kills)
        if taken:
            out["errors_taken_by_dead"] += 1
        else:
            out["errors_not_taken"] += 1
            out["errors_not_taken_ids"].append(rid)
    out["errors_not_taken_ids"] = out["errors_not_taken_ids"][:20]
    return out


def _slots(v) -> str:
    if not isinstance(v, dict):
        return str(v)
    return f"inflight {_int(v.get('inflight'))}, queued {_int(v.get('queue_depth'))}"


def kill_checks(name: str, r: dict) -> list[tuple[bool, str]]:
    """What every kill phase must show: each kill done in time, no hung client, no leaked slot."""
    return [
        (r["kills"] == r["requested"], f"{name}: kills done before the deadline: {r['kills']}"),
        (r["hung"] == 0, f"{name}: hung clients: {r['hung']}"),
        (r["rounds_with_leaked_slot"] == 0 and not r["leaked_after"],
         f"{name}: leaked slots: {r['rounds_with_leaked_slot']} rounds, after settling {r['slots_after']}"),
    ]


def checks(result: dict) -> list[tuple[bool, str]]:
    """(passed, sentence) for every property the run must show."""
    out: list[tuple[bool, str]] = []
    for r in result.get("load", []):
        name = f"{r['target']} gate {r['gate']}, maxWaiting {r['max_waiting']}"
        out.append((r["unanswered"] == 0, f"{name}: requests unanswered: {r['unanswered']}"))
        out.append((r.get("complete", True), f"{name}: all {r['requested']} requests sent before the deadline: {r['sent']}"))
        if r["target"] == "fake":
            conc = list(r["upstream_max_concurrency"].values())
            out.append((all(c == r["gate"] for c in conc), f"{name}: largest concurrency each upstream saw equals the gate {r['gate']}: {conc}"))
            out.append((r["upstream_violations"] == 0, f"{name}: requests an upstream refused above its gate: {r['upstream_violations']}"))
            out.append((r["inflight_after"] == 0, f"{name}: proxy inflight after the run: {r['inflight_after']}"))
        else:
            active = r["sampled_max"].get("worker_active_sequences")
            out.append((active is not None and active <= r["gate"], f"{name}: worker active sequences never above the gate (sampled max): {_int(active)}"))
            out.append((r["worker_full_rejections"] == 0, f"{name}: worker_full 429s from the worker: {r['worker_full_rejections']}"))
        inflight = [v for k, v in r["sampled_max"].items() if "inflight" in k]
        out.append((all(v is not None and v <= r["gate"] for v in inflight), f"{name}: proxy inflight never above the gate (sampled max): {[_int(v) for v in inflight]}"))
        others = {k: n for k, n in r["error_codes"].items() if k != "429 queue_full"}
        out.append((not others, f"{name}: answers other than 200 and 429 queue_full: {others or 0}"))
        qf = r["error_codes"].get("429 queue_full", 0)
        if r["queue_bound_reachable"]:
            out.append((qf > 0 and r["retry_after_missing"] == 0, f"{name}: the queue bound was hit and every 429 queue_full had Retry-After: {qf} (without: {r['retry_after_missing']}; values: {r.get('retry_after_values') or {}})"))
        else:
            out.append((qf == 0, f"{name}: 429 queue_full while the queue had room for every client: {qf}"))
        out.append((r["stream_errors"] + r["stream_truncated"] == 0, f"{name}: streams ending without [DONE]: {r['stream_errors'] + r['stream_truncated']}"))
    for key in ("fake_kills", "real_kills"):
        r = result.get(key)
        if r:
            name = f"{r['target']} worker kills ({r['kills']} of {r['requested']})"
            out += kill_checks(name, r)
            out.append((r["admitted_streams_cut_without_error_event"] == 0, f"{name}: streams cut without an error event: {r['admitted_streams_cut_without_error_event']}"))
    r = result.get("fake_failover")
    if r:
        name = f"fake failover ({r['kills']} of {r['requested']})"
        out += kill_checks(name, r)
        want = {"done": r["kills"], "error_event": r["kills"]}
        out.append((r["outcomes"] == want, f"{name}: the stream on the dead worker ends with an error event, the one on the survivor with [DONE]: {r['outcomes']}"))
        after = r["requests_after_failure"]
        out.append((after["sent"] > 0 and after["statuses"].get("200", 0) == after["sent"],
                    f"{name}: requests right after the failure answered 200 (by the survivor): {after['statuses'].get('200', 0)} of {after['sent']} {after['error_codes'] or ''}".rstrip()))
    r = result.get("real_failover")
    if r:
        name = f"real failover under load ({r['kills']} of {r['requested']} kills)"
        out.append((r["kills"] == r["requested"], f"{name}: kills done before the deadline: {r['kills']}"))
        out.append((r["errors_not_taken"] == 0,
                    f"{name}: errors for requests the dead worker had not taken: {r['errors_not_taken']} {r['errors_not_taken_ids'] or ''}".rstrip()))
        out.append((r["ok"] > 0 and r["requests"] > 0, f"{name}: requests answered: {r['ok']} of {r['requests']}"))
    for key in ("fake_disconnects", "real_disconnects"):
        r = result.get(key)
        if r:
            name = f"{r['target']} client disconnects ({r['disconnects']} of {r['requested']})"
            out.append((r["disconnects"] == r["requested"], f"{name}: disconnects done before the deadline: {r['disconnects']}"))
            out.append((r["hung"] == 0, f"{name}: hung clients: {r['hung']}"))
            out.append((not r["leaked_after"], f"{name}: leaked proxy slots after settling: {r['slots_after']}"))
            if "upstream_active_after" in r:
                active = sum((v or 0) for v in r["upstream_active_after"].values())
                out.append((active == 0, f"{name}: requests still active in the upstreams after settling: {active}"))
            if "worker_active_sequences_after" in r:
                out.append((not r["worker_leaked_after"], f"{name}: worker active sequences after settling: {_int(r['worker_active_sequences_after'])}"))
            if "proxy_logged" in r:
                other = {k: n for k, n in r["proxy_logged"].items() if k != "499"}
                out.append((not other, f"{name}: disconnects the proxy logged with a status other than 499: {other or 0}"))
            if "tokens_generated" in r:
                out.append((r["tokens_generated"] < r["tokens_if_never_stopped"],
                            f"{name}: tokens the worker generated for them: {r['tokens_generated']} (at most {r['tokens_if_never_stopped']} if it never stopped)"))
            again = r.get("serves_again") or {}
            out.append((again.get("unanswered", 1) == 0 and again.get("statuses", {}).get("200", 0) == again.get("sent", -1),
                        f"{name}: every model serves again afterwards: {again.get('statuses')}"))
    return out


def report_lines(result: dict) -> list[str]:
    meta = result["meta"]
    lines = [f"mtpstack load bench, {meta['date']}", f"command: {meta['command']}",
             f"machine: {meta['cpus']} CPUs, {meta['platform']}, Python {meta['python']}, commit {meta['commit']}, {meta['seconds']} s"]
    if meta.get("modified"):
        lines.append("uncommitted changes in the checkout: " + ", ".join(meta["modified"]))
    lines.append("")
    lines += ["Load (answers by status; streams ok = streamed requests that ended with [DONE])", *load_lines(result.get("load", [])), ""]
    lines += ["Faults (hung = no end, error or status within %g s; leaked = proxy inflight or queue not back to 0 within %g s)" % (HANG_SECONDS, SETTLE_SECONDS),
              *fault_lines(result), ""]
    cs = checks(result)
    lines.append(f"Checks: {sum(ok for ok, _ in cs)} of {len(cs)} hold")
    lines += [f"  {'ok  ' if ok else 'FAIL'}  {text}" for ok, text in cs]
    for note in result.get("errors", []):
        lines.append(f"  FAIL  phase did not finish: {note}")
    return lines
