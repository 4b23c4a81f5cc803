"""Claude Code's turns against `mtpstack up`'s demo: time to first token and the prefix cache's reuse, per turn.

Each round starts the demo fleet as `mtpstack up` ships it, a recording relay before its proxy, and
Claude Code headless (`claude -p`) in a fresh home: `TURNS` (a cold first turn of about 12k demo tokens,
two next turns, then another conversation's first turn on the same system prompt and tools). The relay
times each `/v1/messages` to the stream's first content block and reads `message_start`'s `usage`; a
turn's request after its tool's result gets a row of its own. The fleet stops after each round:

    flock /work/bench.lock python bench/scripts/claude_code_bench.py --rounds 3 --out claude.json

`--first-party` runs Claude Code in its first-party mode, as against a gateway it takes for Anthropic's
own address: its `_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL` (read in its bundle beside the base-URL check,
`api.anthropic.com`) set, so its first system block, the billing line, carries per-request fields
(`cch=`, `cc_prompt_id=`, `cc_turn_index=`, ...); the report then names the fields the relay saw change.

Needs Claude Code (`scripts/bootstrap-npm`, run by `scripts/test`: `.claude-code/`, or `--claude`).
Prints per turn the median and min-max over rounds, and the load average before and after.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (the checkout's root on sys.path)

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, web

from mtpstack.bench.parts import spread
from mtpstack.runtime import Process, StartError, free_port, url_of
from mtpstack.up import DEMO_MODEL, default_fleet

ROOT = _checkout.ROOT
CLAUDE = ROOT / ".claude-code" / "node_modules" / ".bin" / "claude"
#: The turns of a round, in order: (label, prompt, continue the conversation, folder).
TURNS = [("first", "list the files", False, "a"), ("next 1", "and the tests?", True, "a"),
         ("next 2", "thanks", True, "a"), ("new conversation", "list the files", False, "b")]
#: A cold first turn prefills about 12k tokens: a few minutes on 2 busy cores.
TURN_SECONDS = 900


class Recorder:
    """A relay in front of the proxy that records, per `/v1/messages`, its time to the first content
    block and the usage `message_start` reports; it serves while the round awaits Claude Code's turns."""

    def __init__(self, upstream: str):
        self.upstream, self.records, self.port = upstream, [], free_port()

    async def __aenter__(self) -> "Recorder":
        self._session = ClientSession(timeout=ClientTimeout(total=None, sock_read=TURN_SECONDS))
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._session.close()
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return url_of("127.0.0.1", self.port)

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        record = {"path": request.path, "status": None, "ttft_s": None, "usage": None, "final_usage": None,
                  "billing": billing_of(body)}
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body, headers=headers) as up:
            record["status"] = up.status
            resp = web.StreamResponse(status=up.status, headers={k: v for k, v in up.headers.items()
                                                                 if k.lower() not in ("content-length", "transfer-encoding")})
            await resp.prepare(request)
            buffer = b""
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
                buffer += chunk
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    observe(record, event, time.perf_counter() - arrived)
            await resp.write_eof()
        if request.path.startswith("/v1/messages") and not request.path.endswith("count_tokens"):
            self.records.append(record)
        return resp


def billing_of(body: bytes) -> str | None:
    """The billing line Claude Code sends as its first system block, if any (pure)."""
    try:
        system = json.loads(body).get("system")
    except (ValueError, AttributeError):
        return None
    first = system[0] if isinstance(system, list) and system and isinstance(system[0], dict) else {}
    text = first.get("text")
    return text if isinstance(text, str) and text.startswith("x-anthropic-billing-header:") else None


def changing_fields(lines: list[str | None]) -> list[str]:
    """The fields of the billing lines that differ between requests, in the order first seen (pure)."""
    seen: dict[str, set[str]] = {}
    for line in lines:
        for field in (line or "").split(":", 1)[-1].split(";"):
            key, _, value = field.strip().partition("=")
            if key:
                seen.setdefault(key, set()).add(value)
    return [k for k, values in seen.items() if len(values) > 1]


def observe(record: dict, event: bytes, elapsed: float) -> None:
    """Fold one server-sent event into a request's record (pure: tested in tests/bench)."""
    data = next((line[6:] for line in event.split(b"\n") if line.startswith(b"data: ")), None)
    if data is None:
        return
    try:
        payload = json.loads(data)
    except ValueError:
        return
    kind = payload.get("type") if isinstance(payload, dict) else None
    if kind == "message_start":
        record["usage"] = payload["message"]["usage"]
    elif kind == "content_block_start" and record["ttft_s"] is None:
        record["ttft_s"] = round(elapsed, 3)
    elif kind == "message_delta":
        record["final_usage"] = payload.get("usage")


def _prompt(r: dict) -> int:
    return r["usage"]["input_tokens"] + r["usage"].get("cache_read_input_tokens", 0)


def turn_requests(records: list[dict]) -> list[dict]:
    """A turn's own requests, in order: those with a prompt at least half the longest (Claude Code may
    send small side requests). The first is the turn's; one after it carries a tool's result."""
    full = [r for r in records if r["usage"]]
    longest = max((_prompt(r) for r in full), default=0)
    return [r for r in full if _prompt(r) * 2 >= longest]


#: The label of a turn's request after the tool's result.
AFTER_RESULT = "{}, after the tool's result"


def turn_row(label: str, turns: list[dict]) -> str:
    """One line of the report: a turn's TTFT and cache reuse over the rounds (pure)."""
    ttft, read, prompt = (spread([t[key] for t in turns])
                          for key in ("ttft_s", "cache_read_input_tokens", "prompt_tokens"))
    return (f"| {label} | {prompt['median']:,.0f} | {ttft['median']:.2f} ({ttft['min']:.2f}-{ttft['max']:.2f}) | "
            f"{read['median']:,.0f} ({read['min']:,.0f}-{read['max']:,.0f}) | {len(turns)} |")


def report(result: dict) -> list[str]:
    lines = ["| turn | prompt tokens | TTFT s, median (min-max) | cache_read_input_tokens, median (min-max) | n |",
             "|---|---|---|---|---|"]
    for label in (x for t, *_ in TURNS for x in (t, AFTER_RESULT.format(t))):
        turns = [r[label] for r in result["rounds"] if r.get(label)]
        if turns:
            lines.append(turn_row(label, turns))
    mode = "first-party mode, billing fields changing per request: " + (", ".join(result.get("changing_fields") or []) or "none") \
        if result.get("first_party") else "default mode"
    lines.append(f"Claude Code {result['claude_version']} ({mode}); load average before {result['loadavg_before']}, "
                 f"after {result['loadavg_after']}.")
    return lines


#: Claude Code's own switch for its first-party mode (it otherwise checks the base URL for `api.anthropic.com`).
FIRST_PARTY_ENV = {"_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL": "1"}


async def one_round(claude: Path, work: Path, first_party: bool = False) -> dict:
    config = default_fleet()
    config["proxy"]["port"], config["workers"]["demo"]["port"] = free_port(), free_port()
    (work / "fleet.json").write_text(json.dumps(config))
    up = Process([sys.executable, "-m", "mtpstack", "up", str(work / "fleet.json"), "--run-dir", str(work / "run")],
                 log_path=work / "up.log", name="demo", kind="up", url=url_of("127.0.0.1", config["proxy"]["port"]))
    up.start()
    try:
        try:
            up.wait_ready("/readyz", 300)  # the proxy `mtpstack up` starts, ready once its worker is
        except StartError as e:
            raise SystemExit(f"error: `mtpstack up` was not ready: {e}") from None
        out: dict = {}
        async with Recorder(up.url) as rec:
            home = work / "home"
            home.mkdir()
            for label, prompt, again, folder in TURNS:
                cwd = work / folder
                cwd.mkdir(exist_ok=True)
                (cwd / "a.txt").write_text("hello\n")
                env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "NO_COLOR": "1",
                       "ANTHROPIC_BASE_URL": rec.url, "ANTHROPIC_AUTH_TOKEN": "bench", "ANTHROPIC_MODEL": DEMO_MODEL,
                       "ANTHROPIC_SMALL_FAST_MODEL": DEMO_MODEL, "DISABLE_TELEMETRY": "1",
                       "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", **(FIRST_PARTY_ENV if first_party else {})}
                before = len(rec.records)
                argv = [str(claude), *(["-c"] if again else []), "-p", prompt, "--max-turns", "3", "--allowedTools", "Bash,Read"]
                done = await asyncio.to_thread(subprocess.run, argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                               capture_output=True, text=True, timeout=TURN_SECONDS)
                requests = turn_requests(rec.records[before:])
                if done.returncode != 0 or not requests:
                    raise SystemExit(f"error: turn `{label}`: claude exited {done.returncode}, "
                                     f"{len(rec.records) - before} requests\n{done.stderr[-2000:]}")
                for name, request in zip((label, AFTER_RESULT.format(label)), requests):
                    u = request["usage"]
                    out[name] = {"ttft_s": request["ttft_s"], "cache_read_input_tokens": u.get("cache_read_input_tokens", 0),
                                 "prompt_tokens": _prompt(request),
                                 "output_tokens": (request["final_usage"] or {}).get("output_tokens"),
                                 "requests": len(rec.records) - before, "exit": done.returncode}
                    print(f"  {name}: {json.dumps(out[name])}", file=sys.stderr, flush=True)
            out["billing"] = [r["billing"] for r in rec.records]
        return out
    finally:
        up.interrupt()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds, each on a fresh fleet (default: 3)")
    p.add_argument("--claude", type=Path, default=Path(os.environ.get("MTPSTACK_CLAUDE") or CLAUDE),
                   help="the `claude` binary (default: .claude-code/, from scripts/bootstrap-npm)")
    p.add_argument("--out", type=Path, help="where to write every turn (JSON)")
    p.add_argument("--first-party", action="store_true", help="Claude Code in its first-party mode (per-request billing fields)")
    args = p.parse_args(argv)
    if not args.claude.exists() and shutil.which(str(args.claude)) is None:
        p.error(f"no Claude Code at {args.claude}; run scripts/bootstrap-npm or pass --claude")
    version = subprocess.run([str(args.claude), "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    result = {"claude_version": version, "first_party": args.first_party,
              "loadavg_before": Path("/proc/loadavg").read_text().split()[:3], "rounds": []}
    for i in range(args.rounds):
        print(f"round {i + 1} of {args.rounds}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="claude-bench-") as tmp:
            result["rounds"].append(asyncio.run(one_round(args.claude, Path(tmp), args.first_party)))
    result["changing_fields"] = changing_fields([b for r in result["rounds"] for b in r.pop("billing")])
    result["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print("\n".join(report(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
