"""The servers the benchmarks measure, started the same way by every script, and the one streaming client.

- `CONFIGS`: each configuration a bench can name (the native worker with and without the head,
  mlx-vlm's server with and without it, `mlx_lm.server`, and `native+mtp@baseline`, another build);
- `server_argv` / `start_servers`: their command lines (the native worker's rendered from a validated
  profile, as a deploy renders it) and the processes, started together and waited for until healthy;
- `stream_chat`: one greedy chat completion streamed, timed at its send, first content and end.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

#: Configuration -> (server, with the head).
CONFIGS = {
    "native+mtp": ("native", True),
    "native": ("native", False),
    "mlx-vlm+mtp": ("mlx-vlm", True),
    "mlx-vlm": ("mlx-vlm", False),
    "mlx_lm.server": ("mlx-lm", False),
    # The same as `native+mtp`, run by another build of mtpstack (`--baseline PROGRAM`): before vs after a change.
    "native+mtp@baseline": ("native", True),
}
#: Batch width of every server (4 clients at once).
WIDTH = 4
#: Bounds every HTTP exchange; a stuck server fails the run instead of hanging it.
REQUEST_TIMEOUT = 600


def server_argv(name: str, target: Path, head: Path, depth: int, port: int, baseline: str | None = None) -> list[str]:
    from mtpstack.validator import WorkerProfile, worker_argv
    from mtpstack.worker.launcher import resolve_command

    server, with_head = CONFIGS[name]
    if server == "mlx-vlm":
        argv = [sys.executable, "-m", "mlx_vlm.server", "--model", str(target), "--max-num-seqs", str(WIDTH),
                "--host", "127.0.0.1", "--port", str(port)]
        if with_head:
            argv += ["--draft-model", str(head), "--draft-kind", "mtp", "--draft-block-size", str(depth + 1)]
        return argv
    profile = WorkerProfile.model_validate({
        "model": "bench", "backend": server,
        "target": {"path": str(target), "bits": "fp32"},
        "drafter": {"path": str(head), "bits": "fp32", "depth": depth, "kind": "mtp"} if with_head else None,
        "maxNumSeqs": WIDTH, "port": port,
    })
    argv = resolve_command(worker_argv(profile))
    if name.endswith("@baseline"):
        if not baseline:
            raise SystemExit(f"`{name}` needs `--baseline PROGRAM`: the `mtpstack` executable of the build to compare with")
        argv = [baseline, *_known_to(baseline, argv[1:])]
    return argv


def _known_to(program: str, args: list[str]) -> list[str]:
    """`args` less the flags (with their values) that `program worker --help` does not list:
    an older build does not know a flag this one renders."""
    import subprocess

    helptext = subprocess.run([program, "worker", "--help"], capture_output=True, text=True, timeout=120).stdout
    out, i = [], 0
    while i < len(args):
        if args[i].startswith("--") and args[i] not in helptext:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def start_servers(target: Path, head: Path, depth: int, logdir: Path, names, baseline: str | None = None) -> dict:
    from mtpstack.runtime import Process, free_port, url_of
    from mtpstack.worker.launcher import worker_env

    servers = {}
    env = worker_env()
    # mlx_lm.server answers /v1/models with an empty body when no HF cache dir exists.
    hf_cache = logdir / "hf-cache"
    hf_cache.mkdir(exist_ok=True)
    env.setdefault("HF_HUB_CACHE", str(hf_cache))
    for name in names:
        port = free_port()
        servers[name] = Process(server_argv(name, target, head, depth, port, baseline), log_path=logdir / f"{name}.log", name=name,
                                kind="worker", url=url_of("127.0.0.1", port), env=env)
    try:
        for proc in servers.values():
            proc.start()
        for proc in servers.values():
            proc.wait_ready("/health", 300, state="healthy")
    except Exception:
        for proc in servers.values():
            proc.stop()
        raise
    return servers


async def stream_chat(session, url: str, model: str, messages: list, max_tokens: int, times: list | None = None,
                      headers: dict[str, str] | None = None, extra: dict | None = None, ignore_eos: bool = True,
                      on_content=None) -> dict:
    """One greedy chat completion streamed: when it was sent, its first content, its end, its text and usage
    (each content chunk's arrival time appended to `times` when given). `ignore_eos`: every answer runs
    to `max_tokens`, so runs decode the same number of tokens whether or not the model ends its turn
    (mlx_lm.server and mlx-vlm ignore the field, and stop at their model's end of turn; without it every
    server stops there, so all decode the same text). The first token is the first
    of the answer or of its reasoning; `text` is the answer's content, what a client sends back. `extra`:
    more fields of the body (`chat_template_kwargs`); `on_content(piece, arrival)` is called with each piece of content or reasoning."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos, **(extra or {})}
    start = time.perf_counter()
    first, text, usage, timings, finish = None, [], None, None, None
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            payload = json.loads(line[6:])
            usage = payload.get("usage") or usage
            timings = payload.get("timings") or timings  # mlx-vlm's: its speculative rounds
            for choice in payload.get("choices") or []:
                finish = choice.get("finish_reason") or finish
                delta = choice.get("delta") or {}
                piece = delta.get("content")
                if piece or delta.get("reasoning_content") or delta.get("reasoning"):
                    now = time.perf_counter()
                    first = first or now
                    if piece:
                        text.append(piece)
                    if on_content is not None:
                        on_content(piece or delta.get("reasoning_content") or delta.get("reasoning"), now)
                    if times is not None:
                        times.append(now)
    end = time.perf_counter()
    return {"ttft_s": (first or end) - start, "sent": start, "first": first or end, "end": end, "text": "".join(text),
            "usage": usage or {}, "timings": timings, "finish_reason": finish}
