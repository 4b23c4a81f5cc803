"""Cache-aware routing: a conversation's next request goes to the worker that served its last one.

A worker with a prefix cache answers a request whose prompt begins with one it served before
without prefilling that beginning again; with several workers per model that only helps when the
request reaches that worker. The proxy remembers, per model, which worker served which prompt
beginning, and prefers that worker when it has a free slot (`ModelAdmission.acquire(prefer=...)`):
a preference never makes a request wait, and a request that goes elsewhere moves the affinity
with it, since its prefix now lives there.

What identifies a conversation (`affinity_keys`), first found wins:
- the client's `prompt_cache_key` (OpenAI's field for exactly this), else its `user`;
- else the prompt itself: the rendered messages (chat `messages`; Responses `instructions`
  then `input`) or the prompt text in blocks (completions `prompt`, a Responses `input`
  string), hashed cumulatively at each message or block boundary over the first
  `PREFIX_BYTES`. A request records the hashes at its last two boundaries and its first one
  (a shared system prompt); the next turn of a conversation resends those messages and more,
  so one of its boundaries hashes to what the previous turn recorded.

Bounded: `AFFINITY_ENTRIES` per model, least recently used out first; keys are stored as
16-byte digests, so a client's long key or prompt costs no more than a short one. Forgotten
per worker (`forget`) when it restarts or goes unhealthy: its cache is gone.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Literal

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
#: Only the prompt's beginning is hashed: two prompts alike over 64 KiB share their cached
#: prefix's worth of work anyway, and hashing stops there however large the body.
PREFIX_BYTES = 64 * 1024
#: Prompt text (not messages) is cut into blocks this long, so a turn that appends text ends on
#: a boundary the previous turn also had.
TEXT_BLOCK_BYTES = 1024
#: Boundaries looked up per request, from the longest prefix down: a next turn adds a few
#: messages (a tool call, its result, a user turn), never dozens.
LOOKUP_BOUNDARIES = 32
#: Digest size: collisions among 16,384 entries of 128-bit digests do not happen.
DIGEST_BYTES = 16


def _digest(kind: bytes, value: str) -> bytes:
    return hashlib.blake2b(kind + b"\0" + value.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES).digest()


def _canonical(item: object) -> bytes:
    """One message as bytes the same on every turn that resends it (key order aside)."""
    try:
        return json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        return repr(item).encode("utf-8", "surrogatepass")


def _blocks(text: str) -> Iterator[bytes]:
    data = text[:PREFIX_BYTES].encode("utf-8", "surrogatepass")[:PREFIX_BYTES]  # a character is at least a byte
    return (data[i : i + TEXT_BLOCK_BYTES] for i in range(0, len(data), TEXT_BLOCK_BYTES))


def prompt_units(path: str, payload: dict) -> Iterator[bytes]:
    """The prompt as units whose ends are the boundaries hashed: messages, or blocks of text.
    Lazy: only what the first `PREFIX_BYTES` need is ever rendered, however many messages come."""
    if path.endswith("/chat/completions"):
        messages = payload.get("messages")
        if isinstance(messages, list):
            yield from map(_canonical, messages)
        return
    if path.endswith("/responses"):
        instructions = payload.get("instructions")
        if isinstance(instructions, str) and instructions:
            yield _canonical({"instructions": instructions})
        items = payload.get("input")
        if isinstance(items, list):
            yield from map(_canonical, items)
        elif isinstance(items, str):
            yield from _blocks(items)
        return
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        yield from _blocks(prompt)
    elif isinstance(prompt, list):  # token ids, or a batch of prompts: their text form (an item renders to a byte at least)
        yield from _blocks(_canonical(prompt[:PREFIX_BYTES]).decode("utf-8", "surrogatepass"))


def _prefix_digests(units: Iterable[bytes]) -> list[bytes]:
    """The cumulative hash at each unit's end, over at most `PREFIX_BYTES`."""
    h = hashlib.blake2b(b"p\0", digest_size=DIGEST_BYTES)
    out, total = [], 0
    for unit in units:
        unit = unit[: PREFIX_BYTES - total]
        total += len(unit)
        h.update(len(unit).to_bytes(4, "big"))  # so ["ab", "c"] and ["a", "bc"] differ
        h.update(unit)
        out.append(h.copy().digest())
        if total >= PREFIX_BYTES:
            break
    return out


class Keys:
    """What one request looks up (longest prefix first) and records once it has a worker."""

    __slots__ = ("lookup", "record")

    def __init__(self, lookup: list[bytes], record: list[bytes]):
        self.lookup = lookup
        self.record = record


def affinity_keys(path: str, payload: dict) -> Keys:
    key = payload.get("prompt_cache_key")
    if isinstance(key, str) and key:
        d = _digest(b"k", key)
        return Keys([d], [d])
    user = payload.get("user")
    if isinstance(user, str) and user:
        d = _digest(b"u", user)
        return Keys([d], [d])
    digests = _prefix_digests(prompt_units(path, payload))
    if not digests:
        return Keys([], [])
    lookup = digests[::-1][:LOOKUP_BOUNDARIES]
    if digests[0] not in lookup:
        lookup.append(digests[0])
    record = list(dict.fromkeys([digests[-1], *digests[-2:-1], digests[0]]))
    return Keys(lookup, record)


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
