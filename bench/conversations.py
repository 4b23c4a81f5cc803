"""The multi-turn driver of `agent_bench` and `fleet_bench`: sessions (`mtpstack.bench.workloads`) sent as an
agent sends them, each turn timed; a server's error, a 429 or a timeout is a row, not an exception."""

from __future__ import annotations

import asyncio
import sys
import time

from mtpstack.bench.servers import ServerError, stream_chat
from mtpstack.bench.workloads import Session, turn_messages

#: How a turn ended.
STATUSES = ("ok", "error", "429", "timeout")
#: Bounds one turn; a turn still unanswered then counts as a timeout.
REQUEST_TIMEOUT = 900
#: The API key every request carries (LiteLLM's master key in the fleet bench; the others ignore it).
API_KEY = "sk-fleet-bench"


async def one_turn(http, base_url: str, model: str, messages: list[dict], max_tokens: int, *,
                   timeout: float = REQUEST_TIMEOUT, rid: str | None = None, extra: dict | None = None) -> dict:
    """One turn to `base_url` (`.../v1`): its times, usage and text, how it ended its `status`."""
    import aiohttp

    headers = {"Authorization": f"Bearer {API_KEY}", **({"X-Request-Id": rid} if rid else {})}
    start, r, status, error, http_status = time.perf_counter(), {}, "ok", None, None
    try:
        async with asyncio.timeout(timeout):
            r = await stream_chat(http, base_url, model, messages, max_tokens, headers=headers, extra=extra,
                                  ignore_eos=None, path="/chat/completions")
        http_status = 200
        if not r["done"]:
            status, error = "error", "the stream ended without `data: [DONE]`"
    except ServerError as e:
        status, error, http_status = "429" if e.status == 429 else "error", str(e), e.status
    except TimeoutError:
        status, error = "timeout", f"no whole answer within {timeout:g} s"
    except (aiohttp.ClientError, ValueError) as e:
        status, error = "error", f"{type(e).__name__}: {e}"[:300]
    end, usage = time.perf_counter(), r.get("usage") or {}
    return {"status": status, "http_status": http_status, "error": error, "start": start,
            "ttft_s": None if r.get("empty", True) else r["first"] - start, "total_s": end - start,
            "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"), "text": r.get("text", "")}


def answered(rows: list[dict]) -> list[dict]:
    """`rows`, every turn answered, else an error naming the first that was not (for benches that stop there)."""
    failed = next((r for r in rows if r["status"] != "ok"), None)
    if failed:
        raise RuntimeError(f"{failed['request_id']}: {failed['status']}: {failed['error']}")
    return rows


async def run_sessions(base_url: str, model: str, sessions: list[Session], max_tokens: int, *, labels: dict, tag: str,
                       extra: dict | None = None, timeout: float = REQUEST_TIMEOUT) -> list[dict]:
    """Every session at once, each from its arrival, each turn after the previous answer and its think time;
    rows carry `labels`, the session, the turn, the request id (`tag-SESSION-TURN`) and times from the start."""
    import aiohttp

    t0 = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:

        async def agent(s: Session) -> list[dict]:
            await asyncio.sleep(max(0.0, t0 + s.arrival_s - time.perf_counter()))
            rows, messages, answer = [], [], ""
            for k, turn in enumerate(s.turns, 1):
                await asyncio.sleep(turn.think_s)
                rid = f"{tag}-{s.index}-{k}"
                messages = turn_messages(messages, turn, answer)
                r = await one_turn(http, base_url, model, messages, max_tokens, timeout=timeout, rid=rid, extra=extra)
                answer = r.pop("text")
                r["sent_s"] = r.pop("start") - t0
                rows.append({**labels, "session": s.index, "turn": k, "request_id": rid, **r})
                ttft = "-" if r["ttft_s"] is None else f"{r['ttft_s']:.2f}"
                print(f"  {tag} session {s.index} turn {k}: {r['status']} ttft {ttft} s, {r['total_s']:.2f} s, "
                      f"prompt {r['prompt_tokens']} (cached {r['cached_tokens']}), out {r['completion_tokens']}",
                      file=sys.stderr)
            return rows

        per_session = await asyncio.gather(*(agent(s) for s in sessions))
    return [r for rows in per_session for r in rows]
