"""Cache-aware routing: a conversation's next request goes to the worker that served its last one.

A worker with a prefix cache answers a request whose prompt begins with one it served before
without prefilling that beginning again; with several workers per model that only helps when the
request reaches that worker. The proxy remembers, per model, which worker served which prompt
beginning, and prefers that worker when it has a free slot (`ModelAdmission.acquire(prefer=...)`):
a preference never makes a request wait, and a request that goes elsewhere moves the affinity
with it, since its prefix now lives there.

What identifies a conversation (`affinity_keys`), first found wins:
- the client's `prompt_cache_key` (OpenAI's field for exactly this), else its `user`;
- on Anthropic's Messages API, the `session_id` in `metadata.user_id` (Claude Code sends a JSON
  string holding `device_id` and `session_id`), else a plain `metadata.user_id`;
- else the prompt itself: the messages (chat `messages`; Responses `instructions` then
  `input`) or the prompt text (completions `prompt` as text or token ids, a Responses `input`
  string), hashed cumulatively at each message boundary, or for text at its first
  `TEXT_BEGINNING_BYTES` (its beginning), at every `TEXT_BLOCK_BYTES` after and at its end, up to
  `MAX_UNITS` messages or `MAX_TEXT_BYTES`. A request records the hashes at its last two
  boundaries and its first one (a shared system prompt, a file's shared beginning); the next turn
  of a conversation resends those messages or that text and more, so one of its last
  `LOOKUP_BOUNDARIES` boundaries hashes to what the previous turn recorded, and a prompt that only
  begins like an earlier one finds it by its first boundary.

When: the conversation's own hashes as the request gets its worker; its first unit's (`Keys.shared`)
only once that worker holds it, as its prefix cache would: at the answer's first chunk (a stream)
or its end (a plain answer), since a worker keeps a prompt's snapshots only once its first token
is sampled. So new conversations arriving together with one system prompt spread over the idle
workers, instead of following the first to a worker that is still prefilling it.

Bounded: `AFFINITY_ENTRIES` per model, least recently used out first; keys are stored as
16-byte digests, so a client's long key or prompt costs no more than a short one. Forgotten
per worker (`forget`) when it restarts or goes unhealthy and its cache is gone: not when its
cache outlives it (a disk tier: the same `prefix_cache.id` on `/identity` after the restart).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

from mtpstack.endpoints import BY_PATH

#: `proxy.routing`: `affinity` (this module), or `first-free`: the least-loaded worker, as before.
AFFINITY = "affinity"
FIRST_FREE = "first-free"

#: `mtpstack_proxy_routing_total{decision}`: the remembered worker had a free slot and got the
#: request; it was full and another free worker got it (the affinity moves); nothing was
#: remembered; or the routing is `first-free`.
Decision = Literal["affinity", "fallback_busy", "new", "first_free"]
#: The one decision of `first-free` routing.
FIRST_FREE_DECISION: Decision = "first_free"
DECISIONS: dict[str, tuple[Decision, ...]] = {AFFINITY: ("affinity", "fallback_busy", "new"), FIRST_FREE: (FIRST_FREE_DECISION,)}

#: Entries remembered per model. A keyed request takes one, a prompt three; an entry is a
#: 16-byte digest and a worker (250 bytes with the dict's own cost, measured with tracemalloc):
#: 4 MiB per model at most, thousands of conversations, more than a few workers' caches hold.
AFFINITY_ENTRIES = 16_384
#: Messages (or blocks of text) hashed per request at most. The whole prompt is hashed, not a
#: fixed beginning: an agent's system prompt alone can be 100 KB, shared by every conversation,
#: and what tells them apart comes after it. A conversation longer than this is keyed by its
#: first `MAX_UNITS` messages, which tell it apart as well; the bound keeps the worst body (1,024
#: messages each rendered as JSON) at about 4 ms, a plain agent conversation at about 25 us.
MAX_UNITS = 1024
#: Prompt text (not messages) has a boundary every this many bytes, so a turn that appends text
#: passes a boundary the previous turn also had.
TEXT_BLOCK_BYTES = 1024
#: Prompt text's first boundary: prompts that share this much of their beginning (a code-completion
#: client's file, a preamble) are one prefix to route by, as chat prompts sharing a system message are.
TEXT_BEGINNING_BYTES = 256
#: Prompt text hashed per request at most (1 MiB, the default body limit): what lies past it is not read.
MAX_TEXT_BYTES = MAX_UNITS * TEXT_BLOCK_BYTES
#: Boundaries looked up per request, from the longest prefix down: a next turn adds a few
#: messages (a tool call, its result, a user turn), never dozens.
LOOKUP_BOUNDARIES = 32
#: Digest size (SHA-256, cut): collisions among 16,384 entries of 128-bit digests do not happen.
DIGEST_BYTES = 16


def _digest(kind: bytes, value: str) -> bytes:
    return hashlib.sha256(kind + b"\0" + value.encode("utf-8", "surrogatepass")).digest()[:DIGEST_BYTES]


def _canonical(item: object) -> bytes:
    """One message as bytes the same on every turn that resends it (key order aside); a plain
    `{"role", "content"}` message, the most common by far, without a JSON rendering."""
    if isinstance(item, dict) and len(item) == 2 and isinstance(item.get("role"), str) and isinstance(item.get("content"), str):
        return b"m" + item["role"].encode("utf-8", "surrogatepass") + b"\0" + item["content"].encode("utf-8", "surrogatepass")
    try:
        return b"j" + json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        return b"r" + repr(item).encode("utf-8", "surrogatepass")


def _text_bytes(text: str) -> bytes:
    return text[:MAX_TEXT_BYTES].encode("utf-8", "surrogatepass")[:MAX_TEXT_BYTES]  # a character is a byte at least


def _message_units(payload: dict) -> Iterator[bytes]:
    messages = payload.get("messages")
    if isinstance(messages, list):
        yield from map(_canonical, messages)


def _responses_units(payload: dict) -> Iterator[bytes] | bytes:
    instructions = payload.get("instructions")
    items = payload.get("input")
    if isinstance(items, str):  # one text: the instructions, then the input
        head = _canonical({"instructions": instructions}) + b"\0" if isinstance(instructions, str) and instructions else b""
        return (head + _text_bytes(items))[:MAX_TEXT_BYTES]
    return _responses_messages(instructions, items)


def _responses_messages(instructions: object, items: object) -> Iterator[bytes]:
    if isinstance(instructions, str) and instructions:
        yield _canonical({"instructions": instructions})
    if isinstance(items, list):
        yield from map(_canonical, items)


def _prompt_text_units(payload: dict) -> bytes:
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return _text_bytes(prompt)
    if isinstance(prompt, list):
        return _token_bytes(prompt)[:MAX_TEXT_BYTES]
    return b""


def _unmarked(message: object) -> object:
    """An Anthropic message as it reads on every turn: without `cache_control` marks, and content of
    text blocks only as one string (Claude Code resends its system message so)."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    blocks = [{k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b for b in message["content"]]
    if all(isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) and len(b) == 2 for b in blocks):
        return {**message, "content": "".join(b["text"] for b in blocks)}
    return {**message, "content": blocks}


def _anthropic_units(payload: dict) -> Iterator[bytes]:
    system = payload.get("system")
    if system:
        yield _canonical({"system": _unmarked({"content": system})["content"] if isinstance(system, list) else system})
    messages = payload.get("messages")
    if isinstance(messages, list):
        yield from (_canonical(_unmarked(m)) for m in messages)


#: How a prompt is cut into units, by an endpoint's `units` (`mtpstack.endpoints`): messages (an
#: iterator of each one's bytes), or one text (bytes: boundaries by position, `_text_digests`).
UNITS: dict[str, Callable[[dict], Iterator[bytes] | bytes]] = {
    "messages": _message_units,
    "responses": _responses_units,
    "prompt": _prompt_text_units,
    "anthropic": _anthropic_units,
}


def prompt_units(path: str, payload: dict) -> Iterator[bytes] | bytes:
    """The prompt as messages whose ends are the boundaries hashed, or as one text, as the endpoint at
    `path` counts it (a path of no endpoint: a completion prompt). Lazy: a message past the first
    `MAX_UNITS` is never rendered."""
    endpoint = BY_PATH.get(path)
    return UNITS[endpoint.units if endpoint is not None else "prompt"](payload)


def _token_bytes(prompt: list) -> bytes:
    """A token-id prompt packed 8 bytes a token (`struct`: 131,072 ids in about 2 ms, where `array`
    takes 12 and a JSON rendering 20); a batch of prompts, or anything else, as JSON."""
    ids = prompt[: MAX_TEXT_BYTES // 8]
    try:
        return struct.pack(f"<{len(ids)}q", *ids)
    except struct.error:
        return _canonical(prompt)


def _prefix_digests(units: Iterable[bytes]) -> dict[int, bytes]:
    """The cumulative hash at the end of the first unit and of the last `LOOKUP_BOUNDARIES` of the
    first `MAX_UNITS`, by boundary index. The units are gathered first, so only the boundaries
    looked up cost a digest."""
    kept = list(itertools.islice(units, MAX_UNITS))
    tail = len(kept) - LOOKUP_BOUNDARIES  # the first boundary looked up after the first
    h = hashlib.sha256(b"p\0")
    out = {}
    for i, unit in enumerate(kept):
        h.update(len(unit).to_bytes(8, "big"))  # so ["ab", "c"] and ["a", "bc"] differ
        h.update(unit)
        if i >= tail or i == 0:
            out[i] = h.copy().digest()[:DIGEST_BYTES]
    return out


def _text_digests(data: bytes) -> dict[int, bytes]:
    """The hash of `data` up to each boundary looked up, by boundary index in position order: its
    first `TEXT_BEGINNING_BYTES`, then the last `LOOKUP_BOUNDARIES` of every `TEXT_BLOCK_BYTES` and its
    end. Boundaries sit at fixed positions, so the bytes between two looked up are hashed in one call:
    a megabyte costs one pass of the hash, not a Python step per block."""
    n = len(data)
    if not n:
        return {}
    ends = [*range(TEXT_BLOCK_BYTES, n, TEXT_BLOCK_BYTES), n][-LOOKUP_BOUNDARIES:]
    points = sorted({*ends, *([TEXT_BEGINNING_BYTES] if n > TEXT_BEGINNING_BYTES else [])})
    h = hashlib.sha256(b"t\0")
    view = memoryview(data)
    out, at = {}, 0
    for i, end in enumerate(points):
        h.update(view[at:end])
        at = end
        out[i] = h.copy().digest()[:DIGEST_BYTES]
    return out


class Keys:
    """What one request looks up (longest prefix first) and records for its worker: `record`, all of
    it; of that, `shared` (its first unit's hash, a beginning other conversations may share) only once
    the worker holds it (`recorded_at_admission` the rest, when the request gets its worker)."""

    __slots__ = ("lookup", "record", "shared")

    def __init__(self, lookup: list[bytes], record: list[bytes], shared: bytes | None = None):
        self.lookup = lookup
        self.record = record
        self.shared = shared

    @property
    def recorded_at_admission(self) -> list[bytes]:
        return [k for k in self.record if k != self.shared]


#: Longest `metadata.user_id` read as JSON for its session: Claude Code's is about 150 bytes.
MAX_USER_ID_JSON = 4096


def anthropic_session(payload: dict) -> str | None:
    """The conversation a Messages request names: `metadata.user_id`'s `session_id` when it is a JSON
    object holding one (Claude Code's), else the `user_id` itself."""
    meta = payload.get("metadata")
    user = meta.get("user_id") if isinstance(meta, dict) else None
    if not isinstance(user, str) or not user:
        return None
    if user.startswith("{") and len(user) <= MAX_USER_ID_JSON:
        try:
            session = json.loads(user).get("session_id")
        except (ValueError, AttributeError, RecursionError):
            session = None
        if isinstance(session, str) and session:
            return "session:" + session
    return "user:" + user


def affinity_keys(path: str, payload: dict) -> Keys:
    key = payload.get("prompt_cache_key")
    if isinstance(key, str) and key:
        d = _digest(b"k", key)
        return Keys([d], [d])
    user = payload.get("user")
    if isinstance(user, str) and user:
        d = _digest(b"u", user)
        return Keys([d], [d])
    endpoint = BY_PATH.get(path)
    session = anthropic_session(payload) if endpoint is not None and endpoint.units == "anthropic" else None
    if session is not None:
        d = _digest(b"a", session)
        return Keys([d], [d])
    units = prompt_units(path, payload)
    digests = _text_digests(units) if isinstance(units, bytes) else _prefix_digests(units)
    if not digests:
        return Keys([], [])
    last = max(digests)
    lookup = [digests[i] for i in sorted(digests, reverse=True)]  # the last boundaries, then the first
    record = list(dict.fromkeys([digests[last], *([digests[last - 1]] if last - 1 in digests else []), digests[0]]))
    return Keys(lookup, record, digests[0])


class Affinity:
    """Which worker (by name) served which key, for one model: a bounded LRU.

    A worker's entries are dropped all at once by `forget`, in O(1): each entry carries the
    worker's epoch at the time, and an entry from an older epoch is no entry."""

    def __init__(self, capacity: int = AFFINITY_ENTRIES):
        self.capacity = capacity
        self._entries: OrderedDict[bytes, tuple[str, int]] = OrderedDict()
        self._epochs: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def preferred(self, keys: Iterable[bytes]) -> str | None:
        """The worker remembered for the first key that has one, or None."""
        for k in keys:
            entry = self._entries.get(k)
            if entry is None:
                continue
            worker, epoch = entry
            if self._epochs.get(worker, 0) != epoch:
                del self._entries[k]
                continue
            self._entries.move_to_end(k)
            return worker
        return None

    def remember(self, keys: Iterable[bytes], worker: str) -> None:
        entry = (worker, self._epochs.get(worker, 0))
        for k in keys:
            self._entries[k] = entry
            self._entries.move_to_end(k)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def forget(self, worker: str) -> None:
        """The worker's cache is gone (a restart, or it went unhealthy): nothing routes to it for it."""
        self._epochs[worker] = self._epochs.get(worker, 0) + 1


def decision(preferred: str | None, chosen: str) -> Decision:
    if preferred is None:
        return "new"
    return "affinity" if preferred == chosen else "fallback_busy"


def hit_rate(counts: dict[str, float]) -> float | None:
    """Of the requests that had a remembered worker, the share that went there; None before any."""
    known = counts.get("affinity", 0) + counts.get("fallback_busy", 0)
    return counts.get("affinity", 0) / known if known else None
