"""Hostile input at volume: generated configs through `validate`, malformed requests to a real
proxy and a real worker, slow clients, and hostile requests on the agent surfaces (tools,
`tool_choice`, Responses items, JSON schemas). Counts what must stay 0: tracebacks, 5xx, hangs,
crashes, leaked slots, refusals not in OpenAI's shape or naming no field; and measures how long
compiling hostile schemas holds `/health` and a plain stream, against idle.

    .venv/bin/python bench/scripts/hostile_bench.py [--configs 10000] [--requests 2000] [--slow 200]
        [--agent 600] [--cut 40] [--stall-repeats 5] [--seed 1] [--json]

The proxy runs as `mtpstack proxy` in front of a fake worker (`devkit.fake_upstream`) with
`clientSeconds` 2; the worker runs as `mtpstack worker` on the bundled demo pair, and for the
agent surfaces on the agent pair (`devkit.demo.agent`: a template with a tool-call format), built
at start. Requests are sent one at a time on fresh connections (`devkit.raw_http`), slow clients
all at once in threads (`devkit.raw_http.slow_client`), the stall measured by `devkit.stall`. A
benchmark script, not a test: it takes minutes.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout root on sys.path, for devkit)

import argparse
import asyncio
import contextlib
import io
import json
import random
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from devkit.demo.agent import build_agent_pair
from devkit.fake_fleet import proxy_before_fake
from devkit.hostile import (AGENT_SEEDS, agent_stream, anthropic_refusal_names_a_field, random_agent_request, random_body,
                            random_config, random_http, random_messages_request, seed_request)
from devkit.raw_http import SLOW_KINDS, json_answer, leave_streams, raw_exchange, request_bytes, slow_client
from devkit.stall import measure, plain_stream, send_schemas
from mtpstack.bench.stats import summarize
from mtpstack.runtime import Process, free_port, url_of
from mtpstack.worker.demo import DEMO_HEAD, DEMO_TARGET

ROOT = _checkout.ROOT
#: The proxy's deadline in this bench: short, so 200 slow clients finish in seconds.
CLIENT_SECONDS = 2.0
#: A request unanswered this long is a hang (the demo worker answers a 2-token request in ~0.1 s).
HANG_SECONDS = 30.0
#: Paths and methods no route serves: each must be answered in OpenAI's error shape.
UNROUTED = [("GET", "/nope"), ("POST", "/v1/embeddings"), ("GET", "/v1/chat/completions"), ("DELETE", "/v1/responses"),
            ("PUT", "/health"), ("GET", "/v1/chat/completions/../../etc/passwd")]
#: The stall measurement: hostile schemas sent this many at a time, this many per repeat, after
#: this long idle (`devkit.stall`).
STALL_WIDTH, STALL_SCHEMAS, STALL_IDLE_SECONDS = 8, 16, 1.5


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def configs(n: int, seed: int, tmp: Path) -> dict:
    from mtpstack.cli import main

    counts = {"configs": n, "exit_0": 0, "exit_1": 0, "exit_2": 0, "tracebacks": 0, "internal_errors": 0, "no_json": 0}
    started = time.monotonic()
    for i in range(n):
        suffix, content = random_config(random.Random(seed * 1_000_003 + i))
        path = tmp / f"fleet{suffix}"
        path.write_bytes(content)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(["validate", str(path), "--format", "json"])
        except Exception:
            counts["tracebacks"] += 1
            continue
        try:
            json.loads(out.getvalue())
        except ValueError:
            counts["no_json"] += 1
        if code == 3:
            counts["internal_errors"] += 1
        elif code in (0, 1, 2):
            counts[f"exit_{code}"] += 1
    counts["seconds"] = round(time.monotonic() - started, 1)
    return counts


def requests(host: str, port: int, n: int, seed: int, model: str, alive) -> dict:
    rng = random.Random(seed)
    counts = {"requests": n, "answered": 0, "closed_without_answer": 0, "4xx": 0, "2xx": 0, "5xx": 0, "hangs": 0}
    statuses: dict[int, int] = {}
    started = time.monotonic()
    for _ in range(n):
        path = rng.choice(["/v1/completions", "/v1/chat/completions"])
        data = random_http(rng, path, model) if rng.random() < 0.5 else request_bytes(path, random_body(rng, model))
        got = raw_exchange(host, port, data, timeout=HANG_SECONDS)
        if got.timed_out:
            counts["hangs"] += 1
        elif got.status is None:
            counts["closed_without_answer"] += 1
        else:
            counts["answered"] += 1
            statuses[got.status] = statuses.get(got.status, 0) + 1
            counts[f"{got.status // 100}xx"] = counts.get(f"{got.status // 100}xx", 0) + 1
    counts["crashed"] = int(not alive())
    counts["statuses"] = dict(sorted(statuses.items()))
    counts["seconds"] = round(time.monotonic() - started, 1)
    return counts


def slow(host: str, port: int, n: int) -> dict:
    kinds = [SLOW_KINDS[i % len(SLOW_KINDS)] for i in range(n)]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(lambda k: slow_client(host, port, k, 0.1, CLIENT_SECONDS + HANG_SECONDS), kinds))
    held = sorted(r.seconds for r in results)
    return {
        "slow_clients": n,
        "hangs": sum(r.timed_out for r in results),
        "answered_408": sum(r.status == 408 for r in results),
        "closed": sum(r.status is None and not r.timed_out for r in results),
        "5xx": sum(1 for r in results if r.status is not None and r.status >= 500),
        "held_seconds_median": round(held[len(held) // 2], 2),
        "held_seconds_max": round(held[-1], 2),
        "seconds": round(time.monotonic() - started, 1),
    }


def _log_lines(path: Path) -> tuple[int, int, int]:
    """(lines, lines that are not one JSON object, lines carrying a traceback)."""
    lines = path.read_text(errors="replace").splitlines()
    bad = tracebacks = 0
    for line in lines:
        try:
            entry = json.loads(line)
            ok = isinstance(entry, dict)
        except ValueError:
            ok = False
        bad += not ok
        tracebacks += "Traceback" in line
    return len(lines), bad, tracebacks


def unrouted(url: str) -> int:
    """How many requests to paths and methods no route serves were answered other than in OpenAI's error shape."""
    wrong = 0
    for method, path in UNROUTED:
        try:
            status, _, payload = json_answer(url + path, method, body=b"{}" if method in ("POST", "PUT") else None, timeout=10)
            wrong += not (status in (404, 405) and isinstance(payload, dict) and payload["error"]["code"])
        except (ValueError, KeyError, TypeError, OSError):
            wrong += 1
    return wrong


def agent_requests(url: str, n: int, seed: int, model: str) -> dict:
    """`n` generated hostile agent requests, one at a time (a third of them on `/v1/messages`):
    statuses, and refusals that are not JSON in their API's shape or (400s) name no field."""
    rng = random.Random(seed)
    counts = {"requests": n, "messages": 0, "5xx": 0, "hangs": 0, "not_json": 0, "unnamed_400": 0}
    statuses: dict[int, int] = {}
    started = time.monotonic()
    for i in range(n):
        # One in three on Anthropic's Messages API, whose refusals take its own shape.
        anthropic = i % 3 == 2
        path, body = random_messages_request(rng, model) if anthropic else random_agent_request(rng, model)
        counts["messages"] += anthropic
        try:
            status, _, payload = json_answer(url + path, "POST", {"Content-Type": "application/json"}, body, timeout=HANG_SECONDS)
        except ValueError:
            counts["not_json"] += 1
            continue
        except OSError:  # a timeout, or the connection dropped
            counts["hangs"] += 1
            continue
        statuses[status] = statuses.get(status, 0) + 1
        counts["5xx"] += status >= 500
        if status == 400 and not (anthropic_refusal_names_a_field(payload) if anthropic
                                  else isinstance(payload, dict) and payload.get("error", {}).get("param")):
            counts["unnamed_400"] += 1
    counts["statuses"] = dict(sorted(statuses.items()))
    counts["seconds"] = round(time.monotonic() - started, 1)
    return counts


def run_proxy(tmp: Path, n: int, n_slow: int, n_agent: int, seed: int) -> dict:
    with proxy_before_fake(tmp, CLIENT_SECONDS) as running:
        proc, port, log = running.proxy, running.port, running.log
        out = {"malformed": requests("127.0.0.1", port, n, seed, "m", proc.alive),
               "slow": slow("127.0.0.1", port, n_slow),
               "agent": agent_requests(f"http://127.0.0.1:{port}", n_agent, seed, "m"),
               "unrouted_not_json": unrouted(f"http://127.0.0.1:{port}")}
        time.sleep(0.5)
        ready = _get(f"http://127.0.0.1:{port}/readyz")
        out["leaked_slots"] = sum(w["inflight"] for w in ready["workers"].values()) + sum(m["waiting"] for m in ready["models"].values())
        out["crashed"] = int(not proc.alive())
    lines, not_json, tracebacks = _log_lines(log)
    out["log"] = {"lines": lines, "not_one_json_object": not_json, "with_traceback_field": tracebacks}
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    out["log"]["internal_errors"] = sum(e.get("code") == "internal_error" for e in entries)
    out["log"]["logged_5xx"] = sum(e.get("event") == "request" and e.get("status", 0) >= 500 for e in entries)
    return out


@contextlib.contextmanager
def _worker(target: Path, drafter: Path, log: Path):
    """`mtpstack worker` on this pair, 2 slots, served as `tiny`, healthy; stopped on exit."""
    from mtpstack.worker.launcher import worker_env

    port = free_port()
    proc = Process(
        [sys.executable, "-m", "mtpstack", "worker", "--model", str(target), "--draft-model", str(drafter),
         "--max-num-seqs", "2", "--served-model-name", "tiny", "--port", str(port)],
        log_path=log, name="tiny", kind="worker", url=url_of("127.0.0.1", port), cwd=ROOT, env=worker_env(),
    ).start()
    try:
        proc.wait_ready("/health", 120, state="healthy")
        yield proc, port
    finally:
        proc.stop(30)


def run_worker(tmp: Path, n: int, seed: int) -> dict:
    log = tmp / "worker.log"
    with _worker(DEMO_TARGET, DEMO_HEAD, log) as (proc, port):
        out = {"malformed": requests("127.0.0.1", port, n, seed, "tiny", proc.alive),
               "unrouted_not_json": unrouted(proc.url)}
        time.sleep(0.5)
        out["leaked_slots"] = _get(f"{proc.url}/health")["active"]
        out["crashed"] = int(not proc.alive())
    out["log_tracebacks"] = log.read_text(errors="replace").count("Traceback")
    return out


def stall(url: str, repeats: int) -> dict:
    """Per repeat: `/health`'s slowest answer and a plain stream's largest gap, idle and while
    `STALL_SCHEMAS` hostile schemas (`devkit.stall.fuel_schema`) compile."""
    out = {"repeats": repeats, "idle_health_max": [], "loaded_health_max": [], "idle_gap_max": [], "loaded_gap_max": [],
           "refused": 0}
    for r in range(repeats):
        schemas = range(r * STALL_SCHEMAS, (r + 1) * STALL_SCHEMAS)  # none from the cache
        idle, loaded, statuses = measure(url, plain_stream(3500), STALL_IDLE_SECONDS,
                                         lambda: send_schemas(url, schemas, STALL_WIDTH, HANG_SECONDS))
        out["refused"] += statuses.count(400)
        for phase, m in (("idle", idle), ("loaded", loaded)):
            out[f"{phase}_health_max"].append(round(m.health_max, 3))
            out[f"{phase}_gap_max"].append(round(m.stream_gap_max, 3))
    return out


def run_agent(tmp: Path, n: int, n_cut: int, repeats: int, seed: int) -> dict:
    """The agent surfaces on a worker whose template has a tool-call format."""
    target, drafter = build_agent_pair(tmp / "agent", seed=0)
    log = tmp / "agent-worker.log"
    with _worker(target, drafter, log) as (proc, port):
        wrong_seeds = []
        for name in sorted(AGENT_SEEDS):
            path, body, param = seed_request(name, "tiny")
            status, _, payload = json_answer(proc.url + path, "POST", {"Content-Type": "application/json"}, body, timeout=HANG_SECONDS)
            if (status, payload.get("error", {}).get("param")) != (400, param):
                wrong_seeds.append(name)
        out = {"seeds": len(AGENT_SEEDS), "seeds_not_named": len(wrong_seeds),
               "requests": agent_requests(proc.url, n, seed, "tiny")}
        asyncio.run(leave_streams("127.0.0.1", port, [agent_stream(i) for i in range(n_cut)]))
        out["cut_streams"] = n_cut
        out["stall"] = stall(proc.url, repeats)
        time.sleep(1.0)  # the cut streams' sequences are dropped within a step
        out["leaked_slots"] = _get(f"{proc.url}/health")["active"]
        out["crashed"] = int(not proc.alive())
    _, out["log_not_json"], tracebacks = _log_lines(log)
    out["log_errors"] = tracebacks + sum('"level": "error"' in line for line in log.read_text(errors="replace").splitlines())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=2_000, help="malformed requests to each of proxy and worker")
    parser.add_argument("--slow", type=int, default=200, help="slow clients, all at once, against the proxy")
    parser.add_argument("--agent", type=int, default=600, help="hostile agent-surface requests to each of proxy and worker")
    parser.add_argument("--cut", type=int, default=40, help="agent streams the client leaves mid-way")
    parser.add_argument("--stall-repeats", type=int, default=5, help="repeats of the idle/loaded stall measurement")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the raw counts as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        result = {
            "seed": args.seed,
            "validate": configs(args.configs, args.seed, tmp),
            "proxy": run_proxy(tmp, args.requests, args.slow, args.agent, args.seed),
            "worker": run_worker(tmp, args.requests, args.seed),
            "agent": run_agent(tmp, args.agent, args.cut, args.stall_repeats, args.seed),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for line in report(result):
            print(line)
    return 0 if all(v == 0 for v in must_be_zero(result).values()) else 1


def must_be_zero(r: dict) -> dict[str, int]:
    """The counts the hardening promises are 0."""
    v, p, w, a = r["validate"], r["proxy"], r["worker"], r["agent"]
    return {
        "validate tracebacks": v["tracebacks"] + v["internal_errors"] + v["no_json"],
        "proxy 5xx": p["malformed"]["5xx"] + p["slow"]["5xx"] + p["log"]["logged_5xx"],
        "proxy log lines not JSON": p["log"]["not_one_json_object"],
        "proxy log tracebacks": p["log"]["with_traceback_field"],
        "proxy internal errors": p["log"]["internal_errors"],
        "proxy hangs": p["malformed"]["hangs"] + p["slow"]["hangs"],
        "proxy crashes": p["crashed"] + p["malformed"]["crashed"],
        "proxy leaked slots": p["leaked_slots"],
        "worker 5xx": w["malformed"]["5xx"],
        "worker tracebacks": w["log_tracebacks"],
        "worker hangs": w["malformed"]["hangs"],
        "worker crashes": w["crashed"] + w["malformed"]["crashed"],
        "worker leaked slots": w["leaked_slots"],
        "refusals not in OpenAI's shape": p["unrouted_not_json"] + w["unrouted_not_json"] + p["agent"]["not_json"]
        + a["requests"]["not_json"],
        "agent 5xx (proxy, worker)": p["agent"]["5xx"] + a["requests"]["5xx"],
        "agent hangs": p["agent"]["hangs"] + a["requests"]["hangs"],
        "agent 400s naming no field": a["requests"]["unnamed_400"] + a["seeds_not_named"],
        "agent worker log errors, not JSON": a["log_errors"] + a["log_not_json"],
        "agent worker crashes, slots": a["crashed"] + a["leaked_slots"],
    }


def report(r: dict) -> list[str]:
    """Pure: the lines printed for a result."""
    v, p, w, a = r["validate"], r["proxy"], r["worker"], r["agent"]
    st = a["stall"]
    lines = [
        f"validate: {v['configs']} configs in {v['seconds']} s: exit 0/1/2 = {v['exit_0']}/{v['exit_1']}/{v['exit_2']}",
        f"proxy: {p['malformed']['requests']} malformed requests in {p['malformed']['seconds']} s, statuses {p['malformed']['statuses']}, "
        f"{p['malformed']['closed_without_answer']} closed without an answer",
        f"proxy: {p['slow']['slow_clients']} slow clients at once: {p['slow']['answered_408']} answered 408, {p['slow']['closed']} closed; "
        f"held {p['slow']['held_seconds_median']} s median, {p['slow']['held_seconds_max']} s max (deadline {CLIENT_SECONDS:g} s)",
        f"proxy log: {p['log']['lines']} lines",
        f"worker: {w['malformed']['requests']} malformed requests in {w['malformed']['seconds']} s, statuses {w['malformed']['statuses']}, "
        f"{w['malformed']['closed_without_answer']} closed without an answer",
        f"agent: {a['requests']['requests']} hostile requests ({a['requests'].get('messages', 0)} on /v1/messages) to the "
        f"worker in {a['requests']['seconds']} s, statuses "
        f"{a['requests']['statuses']}; to the proxy, statuses {p['agent']['statuses']}; {a['seeds']} seeds; "
        f"{a['cut_streams']} streams cut",
        f"agent: while {STALL_SCHEMAS} hostile schemas compile, {STALL_WIDTH} at a time ({st['repeats']} repeats, "
        f"median (min-max)): /health {_span(st['loaded_health_max'])} s at worst (idle {_span(st['idle_health_max'])}), "
        f"a plain stream's largest gap {_span(st['loaded_gap_max'])} s (idle {_span(st['idle_gap_max'])})",
        "",
    ]
    lines += [f"{name:>32}: {count}" for name, count in must_be_zero(r).items()]
    return lines


def _span(values: list[float]) -> str:
    s = summarize(values)
    return f"{s.median:.2f} ({s.min:.2f}-{s.max:.2f})"


if __name__ == "__main__":
    raise SystemExit(main())
