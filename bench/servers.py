"""The servers the benchmarks measure (`CONFIGS`), started the same way by every script: a worker's command
line rendered from a validated profile as a deploy renders it (`worker_command`), all waited for until
healthy (`start_workers`); and the bench's one streaming client, `stream_chat`."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mtpstack.proxy.prometheus import parse_samples
from mtpstack.runtime import Process, Processes, free_port, url_of
from mtpstack.validator import WorkerProfile, worker_argv
from mtpstack.worker.launcher import resolve_command, worker_env

#: Configuration -> (server, with the head); `@baseline`: `native+mtp` run by another build (`--baseline PROGRAM`).
CONFIGS = {
    "native+mtp": ("native", True),
    "native": ("native", False),
    "mlx-vlm+mtp": ("mlx-vlm", True),
    "mlx-vlm": ("mlx-vlm", False),
    "mlx_lm.server": ("mlx-lm", False),
    "native+mtp@baseline": ("native", True),
}
#: Batch width of every server (4 clients at once).
WIDTH = 4
#: Bounds every HTTP exchange; a stuck server fails the run instead of hanging it.
REQUEST_TIMEOUT = 600


def worker_profile(target: Path, head: Path | None, depth: int, port: int, *, backend: str = "native",
                   width: int = WIDTH, **fields) -> dict:
    """A bench worker's profile as a fleet config holds it: the fp32 target, the MTP head (if any) at `depth`."""
    return {"model": "bench", "backend": backend, "target": {"path": str(target), "bits": "fp32"},
            "drafter": {"path": str(head), "bits": "fp32", "depth": depth, "kind": "mtp"} if head else None,
            "maxNumSeqs": width, "port": port, **fields}


def served_model(name: str, target: Path) -> str:
    """The model name configuration `name`'s server answers to: the profile's for the native worker, else its path."""
    return "bench" if CONFIGS[name][0] == "native" else str(target)


def worker_command(profile: dict, program: str | None = None) -> list[str]:
    """The command line a deploy renders for `profile`; `program`: another build's `mtpstack` runs it."""
    argv = resolve_command(worker_argv(WorkerProfile.model_validate(profile)))
    return on_program(program, argv) if program else argv


@functools.cache
def _worker_help(program: str) -> str:
    """`program worker --help`, once per program: a bench starts another build's workers round after round."""
    return subprocess.run([program, "worker", "--help"], capture_output=True, text=True, timeout=120).stdout


def on_program(program: str, argv: list[str]) -> list[str]:
    """A worker's `argv` run by `program`, less the flags (and values) its `worker --help` does not list:
    an older build does not know a flag this one renders."""
    helptext = _worker_help(program)
    args, out = iter(argv[argv.index("worker"):]), [program]
    for arg in args:
        if arg.startswith("--") and arg not in helptext:
            next(args, None)  # its value
        else:
            out.append(arg)
    return out


def server_argv(name: str, target: Path, head: Path, depth: int, port: int, baseline: str | None = None) -> list[str]:
    server, with_head = CONFIGS[name]
    if server == "mlx-vlm":
        argv = [sys.executable, "-m", "mlx_vlm.server", "--model", str(target), "--max-num-seqs", str(WIDTH),
                "--host", "127.0.0.1", "--port", str(port)]
        if with_head:
            argv += ["--draft-model", str(head), "--draft-kind", "mtp", "--draft-block-size", str(depth + 1)]
        return argv
    if name.endswith("@baseline") and not baseline:
        raise SystemExit(f"`{name}` needs `--baseline PROGRAM`: the `mtpstack` executable of the build to compare with")
    return worker_command(worker_profile(target, head if with_head else None, depth, port, backend=server),
                          baseline if name.endswith("@baseline") else None)


def start_workers(commands: dict[str, tuple[list[str], int]], logdir: Path, procs: Processes | None = None,
                  timeout: float = 300, cwd: Path | None = None) -> dict[str, Process]:
    """Each named command line serving on its loopback port, started together and waited for until
    healthy; if one is not, all are stopped (all of `procs` when given: the stack they belong to)."""
    env = worker_env()
    # mlx_lm.server answers /v1/models with an empty body when no HF cache dir exists.
    (logdir / "hf-cache").mkdir(parents=True, exist_ok=True)
    env.setdefault("HF_HUB_CACHE", str(logdir / "hf-cache"))
    procs = Processes() if procs is None else procs
    try:
        started = {name: procs.start(argv, log_path=logdir / f"{name.replace(' ', '-')}.log", name=name, kind="worker",
                                     url=url_of("127.0.0.1", port), env=env, cwd=cwd)
                   for name, (argv, port) in commands.items()}
        for proc in started.values():
            proc.wait_ready("/health", timeout, state="healthy")
    except BaseException:
        procs.stop_all()
        raise
    return started


def start_servers(target: Path, head: Path, depth: int, logdir: Path, names, baseline: str | None = None) -> dict:
    ports = {name: free_port() for name in names}
    return start_workers({name: (server_argv(name, target, head, depth, port, baseline), port)
                          for name, port in ports.items()}, logdir)


def metrics(url: str) -> dict:
    """A server's `/metrics`, parsed (`mtpstack.proxy.prometheus.sample` reads one series of it)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        return parse_samples(resp.read().decode())


class ServerError(RuntimeError):
    """A server's answer other than 200, or an error event inside its stream (`status` 200)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def stream_chat(session, url: str, model: str, messages: list | str, max_tokens: int, times: list | None = None,
                      headers: dict[str, str] | None = None, extra: dict | None = None, ignore_eos: bool | None = True,
                      on_content=None, path: str | None = None, tool_text: bool = False) -> dict:
    """One greedy completion streamed, chat or (`messages` a string) plain: its send, first token (of any kind;
    `empty`: none), end, text and usage; each token chunk's arrival appended to `times` and passed, with its
    piece, to `on_content`. `ignore_eos` (None: not sent; mlx_lm.server and mlx-vlm ignore it) runs every answer to
    `max_tokens`; `tool_text`: tool-call arguments join `text` (the sweep hashes what such a turn wrote)."""
    plain = isinstance(messages, str)
    body = {"model": model, ("prompt" if plain else "messages"): messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            **({} if ignore_eos is None else {"ignore_eos": ignore_eos}), **(extra or {})}
    path = path or ("/v1/completions" if plain else "/v1/chat/completions")
    start = time.perf_counter()
    first, text, usage, timings, finish, done = None, [], None, None, None, False
    async with session.post(url + path, json=body, headers=headers) as resp:
        if resp.status != 200:
            raise ServerError(resp.status, f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for line in resp.content:
            data = line[5:].strip() if line.startswith(b"data:") else b""
            done = done or data == b"[DONE]"
            if not data or done:
                continue
            payload = json.loads(data)
            if payload.get("error"):
                raise ServerError(resp.status, f"{url}: {json.dumps(payload['error'])[:300]}")
            usage = payload.get("usage") or usage
            timings = payload.get("timings") or timings  # mlx-vlm's: its speculative rounds
            for choice in payload.get("choices") or []:
                finish = choice.get("finish_reason") or finish
                delta = choice.get("delta") or {}
                piece = choice.get("text") if plain else delta.get("content")
                if tool_text and not piece:
                    calls = delta.get("tool_calls") or []
                    piece = "".join(str((c.get("function") or {}).get("arguments") or "") for c in calls)
                thought = delta.get("reasoning_content") or delta.get("reasoning")
                if piece or thought or delta.get("tool_calls"):
                    now = time.perf_counter()
                    first = first or now
                    if piece:
                        text.append(piece)
                    if on_content is not None and (piece or thought):
                        on_content(piece or thought, now)
                    if times is not None:
                        times.append(now)
    end = time.perf_counter()
    return {"ttft_s": (first or end) - start, "sent": start, "first": first or end, "end": end, "text": "".join(text),
            "usage": usage or {}, "timings": timings, "finish_reason": finish, "empty": first is None, "done": done}
