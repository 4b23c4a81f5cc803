"""Hostile input at volume: generated configs through `validate`, malformed requests to a real
proxy and a real worker, slow clients, and hostile requests on the agent surfaces (tools,
`tool_choice`, Responses items, JSON schemas). Counts what must stay 0: tracebacks, 5xx, hangs,
crashes, leaked slots, refusals not in OpenAI's shape or naming no field; and measures how long
compiling hostile schemas holds `/health` and a plain stream, against idle. The grammar flood: 120
distinct hostile schemas sent at once, and 0.5 s later tiny benign schemas from another client
(address), from the flooding client, and one compiled before: their statuses and latencies, and
`/health` and a plain stream meanwhile; `--against PYTHON` floods a worker run by another checkout's
Python too, in alternate order, for a before/after in one run.

    .venv/bin/python bench/scripts/hostile_bench.py [--configs 10000] [--requests 2000] [--slow 200]
        [--agent 600] [--cut 40] [--stall-repeats 5] [--flood 120] [--flood-repeats 5]
        [--against /work/main/.venv/bin/python] [--only flood ...] [--seed 1] [--json]

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
import os
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
from devkit.stall import BENIGN_SCHEMA, flood, flood_bodies, measure, plain_stream, post, schema_request, send_schemas
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
#: The grammar flood: the probes go this long after the flood began (issue 40's adversarial run);
#: "another client" comes from a second loopback address (a worker tells clients apart by address).
FLOOD_PROBE_DELAY, OTHER_CLIENT = 0.5, "127.0.0.2"
#: A schema the worker compiled before the flood (the cached fast path).
WARM_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
#: The bound issue 40 sets for `/health` and a plain stream's largest gap during the flood, seconds.
FLOOD_STALL_GOAL = 1.0
PHASES = ("validate", "proxy", "worker", "agent", "flood")


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
def _worker(target: Path, drafter: Path, log: Path, python: str = sys.executable, width: int = 2):
    """`mtpstack worker` on this pair (run by `python`: another checkout's, to compare), `width`
    slots, served as `tiny`, healthy; stopped on exit."""
    from mtpstack.worker.launcher import worker_env

    port = free_port()
    proc = Process(
        [python, "-m", "mtpstack", "worker", "--model", str(target), "--draft-model", str(drafter),
         "--max-num-seqs", str(width), "--served-model-name", "tiny", "--port", str(port)],
        # Not the checkout as its directory: `-m mtpstack` would import this checkout's base package
        # before the other Python's own install.
        log_path=log, name="tiny", kind="worker", url=url_of("127.0.0.1", port), cwd=log.parent, env=worker_env(),
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


def flood_round(url: str, n: int, first: int, tag: str) -> dict:
    """One flood of `n` hostile schemas (`fuel_schema(first ...)`) with the probes, measured against idle."""
    benign = {**BENIGN_SCHEMA, "title": tag}  # new to the worker each round
    probes = {"another client": (FLOOD_PROBE_DELAY, schema_request(benign, 16), OTHER_CLIENT),
              "same client": (FLOOD_PROBE_DELAY, schema_request({**benign, "description": "own"}, 16), None),
              "compiled before": (FLOOD_PROBE_DELAY, schema_request(WARM_SCHEMA, 16), None)}
    idle, loaded, result = measure(url, plain_stream(3500), STALL_IDLE_SECONDS,
                                   lambda: flood(url, flood_bodies(range(first, first + n)), probes, timeout=HANG_SECONDS * 2))
    kinds: dict[str, int] = {}
    for a in result.hostile:
        kind = flood_answer_kind(a.status, a.error())
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "hostile": dict(sorted(kinds.items())),
        "probes": {name: {"status": a.status, "seconds": round(a.seconds, 3), "code": a.error().get("code")}
                   for name, a in result.probes.items()},
        "idle_health_max": round(idle.health_max, 3), "loaded_health_max": round(loaded.health_max, 3),
        "idle_gap_max": round(idle.stream_gap_max, 3), "loaded_gap_max": round(loaded.stream_gap_max, 3),
        "flood_seconds": round(loaded.seconds, 2),
    }


def run_flood(tmp: Path, n: int, repeats: int, against: str | None) -> dict:
    """`repeats` grammar floods on a worker of this checkout (and on one run by `against`, the two in
    alternate order each repeat), each with its own schemas; the agent pair, 4 slots (the plain stream
    and three probes)."""
    target, drafter = build_agent_pair(tmp / "flood", seed=0)
    arms = {"this": sys.executable, **({"against": against} if against else {})}
    out: dict = {"hostile": n, "repeats": repeats, "arms": {a: [] for a in arms}, "against": against}
    with contextlib.ExitStack() as stack:
        urls = {}
        for arm, python in arms.items():
            proc, _ = stack.enter_context(_worker(target, drafter, tmp / f"flood-{arm}.log", python, width=4))
            urls[arm] = proc.url
            post(proc.url, schema_request(WARM_SCHEMA, 16))
        for r in range(repeats):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for arm in order:
                first = (r * len(arms) + list(arms).index(arm)) * n
                out["arms"][arm].append(flood_round(urls[arm], n, first, f"r{r}"))
                say(f"flood: repeat {r + 1}/{repeats} on {arm}: {out['arms'][arm][-1]['probes']}")
    return out


#: The phases' sizes, each an integer option: its default and what it counts.
COUNTS = {
    "configs": (10_000, "random fleet configs the validator judges"),
    "requests": (2_000, "malformed requests to each of proxy and worker"),
    "slow": (200, "slow clients, all at once, against the proxy"),
    "agent": (600, "hostile agent-surface requests to each of proxy and worker"),
    "cut": (40, "agent streams the client leaves mid-way"),
    "stall-repeats": (5, "repeats of the idle/loaded stall measurement"),
    "flood": (120, "hostile schemas sent at once in the grammar flood"),
    "flood-repeats": (5, "repeats of the grammar flood"),
}


def say(text: str) -> None:
    print(f"hostile-bench: {text}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for option, (default, what) in COUNTS.items():
        parser.add_argument(f"--{option}", type=int, default=default, help=f"{what} (default: {default})")
    parser.add_argument("--against", metavar="PYTHON", help="also flood a worker run by this Python (another checkout's venv)")
    parser.add_argument("--only", nargs="+", choices=PHASES, default=PHASES, help="run only these phases")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the raw counts as JSON")
    args = parser.parse_args()
    phases = {
        "validate": lambda tmp: configs(args.configs, args.seed, tmp),
        "proxy": lambda tmp: run_proxy(tmp, args.requests, args.slow, args.agent, args.seed),
        "worker": lambda tmp: run_worker(tmp, args.requests, args.seed),
        "agent": lambda tmp: run_agent(tmp, args.agent, args.cut, args.stall_repeats, args.seed),
        "flood": lambda tmp: run_flood(tmp, args.flood, args.flood_repeats, args.against),
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        result = {"seed": args.seed, "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
        for name in PHASES:
            if name in args.only:
                result[name] = phases[name](tmp)
        result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for line in report(result):
            print(line)
    return 0 if all(v == 0 for v in must_be_zero(result).values()) else 1


def _count(r: dict, *paths: str) -> int:
    """The sum of the counts at `paths` (`phase.key.key`), a phase that did not run counting 0."""
    total = 0
    for path in paths:
        node = r
        for key in path.split("."):
            node = node.get(key, {}) if isinstance(node, dict) else {}
        total += node if isinstance(node, int) else 0
    return total


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
#: What each hostile request of the grammar flood may get (`flood_answer_kind`).
FLOOD_EXPECTED = ("400 schema", "429 busy", "503 busy")


def must_be_zero(r: dict) -> dict[str, int]:
    """The counts the hardening promises are 0, for the phases that ran."""
    out = {name: _count(r, *paths) for name, phases, paths in ZEROS if any(p in r for p in phases)}
    if "flood" in r:
        rounds = r["flood"]["arms"]["this"]
        out["flood: probes not answered 200"] = sum(p["status"] != 200 for x in rounds for p in x["probes"].values())
        out["flood: answers but a fuel 400 or worker_busy"] = sum(
            n for x in rounds for kind, n in x["hostile"].items() if kind not in FLOOD_EXPECTED)
    return out


def report(r: dict) -> list[str]:
    """Pure: the lines printed for a result."""
    lines = []
    if "validate" in r:
        v = r["validate"]
        lines.append(f"validate: {v['configs']} configs in {v['seconds']} s: exit 0/1/2 = {v['exit_0']}/{v['exit_1']}/{v['exit_2']}")
    if "proxy" in r:
        p = r["proxy"]
        lines += [
            f"proxy: {p['malformed']['requests']} malformed requests in {p['malformed']['seconds']} s, statuses {p['malformed']['statuses']}, "
            f"{p['malformed']['closed_without_answer']} closed without an answer",
            f"proxy: {p['slow']['slow_clients']} slow clients at once: {p['slow']['answered_408']} answered 408, {p['slow']['closed']} closed; "
            f"held {p['slow']['held_seconds_median']} s median, {p['slow']['held_seconds_max']} s max (deadline {CLIENT_SECONDS:g} s)",
            f"proxy log: {p['log']['lines']} lines",
        ]
    if "worker" in r:
        w = r["worker"]
        lines.append(f"worker: {w['malformed']['requests']} malformed requests in {w['malformed']['seconds']} s, statuses "
                     f"{w['malformed']['statuses']}, {w['malformed']['closed_without_answer']} closed without an answer")
    if "agent" in r:
        a = r["agent"]
        st = a["stall"]
        proxy_statuses = f"; to the proxy, statuses {r['proxy']['agent']['statuses']}" if "proxy" in r else ""
        lines += [
            f"agent: {a['requests']['requests']} hostile requests ({a['requests'].get('messages', 0)} on /v1/messages) to the "
            f"worker in {a['requests']['seconds']} s, statuses "
            f"{a['requests']['statuses']}{proxy_statuses}; {a['seeds']} seeds; {a['cut_streams']} streams cut",
            f"agent: while {STALL_SCHEMAS} hostile schemas compile, {STALL_WIDTH} at a time ({st['repeats']} repeats, "
            f"median (min-max)): /health {_span(st['loaded_health_max'])} s at worst (idle {_span(st['idle_health_max'])}), "
            f"a plain stream's largest gap {_span(st['loaded_gap_max'])} s (idle {_span(st['idle_gap_max'])})",
        ]
    if "flood" in r:
        lines += flood_lines(r["flood"])
    lines.append("")
    lines += [f"{name:>50}: {count}" for name, count in must_be_zero(r).items()]
    return lines


def flood_lines(f: dict) -> list[str]:
    """Pure: the grammar flood's figures, per worker, median (min-max) over the repeats."""
    lines = [f"flood: {f['hostile']} hostile schemas at once, probes {FLOOD_PROBE_DELAY:g} s later, {f['repeats']} repeats, "
             f"median (min-max); goal: probes 200, /health and the stream's gap within {FLOOD_STALL_GOAL:g} s"]
    for arm, rounds in f["arms"].items():
        if not rounds:
            continue
        lines.append(f"  {'this checkout' if arm == 'this' else 'against ' + str(f['against'])}:")
        kinds = sorted({k for x in rounds for k in x["hostile"]})
        lines.append("    hostile answers per repeat: " + ", ".join(
            f"{kind} {_span([x['hostile'].get(kind, 0) for x in rounds], '.0f')}" for kind in kinds))
        for name in rounds[0]["probes"]:
            answers = [x["probes"][name] for x in rounds]
            statuses: dict[str, int] = {}
            for a in answers:
                label = f"{a['status']}" + (f" {a['code']}" if a["code"] else "")
                statuses[label] = statuses.get(label, 0) + 1
            counted = ", ".join(f"{n} x {label}" for label, n in sorted(statuses.items()))
            lines.append(f"    {name}: {counted}, answered in {_span([a['seconds'] for a in answers])} s")
        lines.append(f"    /health at worst {_span([x['loaded_health_max'] for x in rounds])} s "
                     f"(idle {_span([x['idle_health_max'] for x in rounds])}), a plain stream's largest gap "
                     f"{_span([x['loaded_gap_max'] for x in rounds])} s (idle {_span([x['idle_gap_max'] for x in rounds])})")
    return lines


def _span(values: list[float], fmt: str = ".2f") -> str:
    s = summarize(values)
    return f"{s.median:{fmt}} ({s.min:{fmt}}-{s.max:{fmt}})"


if __name__ == "__main__":
    raise SystemExit(main())
