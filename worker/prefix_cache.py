"""The prefix cache: a prompt's state at points along it, reused by any later prompt that begins the same way.

Agents resend their whole conversation every turn; without this each turn
prefills it all again. A hybrid target's gated-delta layers keep a recurrent
state that cannot be trimmed back to an earlier position, so the cache keeps
*snapshots*: the complete state of every layer at chosen points of a prompt
(every prefill-chunk boundary, the chat template's message boundaries, the
prompt's end, less one token). A new prompt resumes from the deepest snapshot whose tokens
are all its own first tokens, and prefills only the rest.

The entries form a tree. A node is the stretch of tokens between two
snapshots of one prompt and holds what that stretch added: the attention
layers' keys and values over the stretch, the drafter's entries over it, and
at its end the gated-delta layers' state and the target's last hidden state
(from which the first token is sampled and an MTP head drafts). A node's
stretch is only valid after its parent's, so resuming at a node concatenates
the stretches from the root: shared prefixes (a system prompt with its tools)
are stored once.

Memory is bounded by `max_bytes`, by least recent use. The state at a node's
end (the larger part on hybrid targets) is needed only to resume *there*; an
inner node's stretch is needed by every node below it. So eviction drops the
oldest resumable point first: a leaf goes whole, an inner node only loses its
end state (its stretch stays for its children); a leaf left without a state
or children goes too. A byte figure per node counts its arrays and its
tokens.

Only the generation thread touches it (no lock): it looks up when a sequence
starts prefilling and inserts the sequence's snapshots once its whole prompt
is in, so a cancelled or failed prefill never leaves anything behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

#: Bytes counted per token a node keeps (a Python int in a tuple): the tokens of a
#: hostile flood of distinct prompts count against the budget too.
TOKEN_BYTES = 36


def nbytes(parts) -> int:
    """Bytes of the arrays in a nested list/tuple of arrays (None counts nothing)."""
    if parts is None:
        return 0
    if isinstance(parts, (list, tuple)):
        return sum(nbytes(p) for p in parts)
    return int(parts.nbytes)


@dataclass
class Stretch:
    """What one stretch of a prompt adds: the arrays over its tokens, and the state at its end."""

    tokens: tuple[int, ...]
    segment: object  # per layer (keys, values) over the stretch, for layers that keep every position
    end_state: object | None  # what resuming at the end needs besides the segments (None: dropped)

    @property
    def nbytes(self) -> int:
        return nbytes(self.segment) + nbytes(self.end_state) + TOKEN_BYTES * len(self.tokens)


@dataclass(eq=False)
class Node:
    parent: "Node | None"
    start: int
    stretch: Stretch | None  # None only at the root
    children: dict[int, list["Node"]] = field(default_factory=dict)
    used: int = 0

    @property
    def end(self) -> int:
        return self.start + (len(self.stretch.tokens) if self.stretch else 0)

    @property
    def resumable(self) -> bool:
        return self.stretch is not None and self.stretch.end_state is not None

    def kids(self):
        for group in self.children.values():
            yield from group


@dataclass
class Hit:
    """Where a prompt resumes: `length` tokens in, with the stretches from the root to there."""

    length: int
    path: list[Node]

    @property
    def node(self) -> Node | None:
        return self.path[-1] if self.path else None

    @property
    def segments(self) -> list:
        return [n.stretch.segment for n in self.path]

    @property
    def end_state(self):
        return self.path[-1].stretch.end_state if self.path else None


@dataclass
class Stats:
    lookups: int = 0
    hits: int = 0
    tokens_reused: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0


class PrefixCache:
    """Snapshots of prompts in a tree of stretches, bounded by bytes, least recently used out first."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max(0, int(max_bytes))
        self.root = Node(parent=None, start=0, stretch=None)
        self.stats = Stats()
        self._clock = count(1)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    # -- lookup --------------------------------------------------------------------------

    def lookup(self, prompt: list[int]) -> Hit | None:
        """The deepest resumable snapshot whose tokens begin `prompt` (a whole prompt counts), or None."""
        if not self.enabled:
            return None
        self.stats.lookups += 1
        path = self._walk(prompt)
        while path and not path[-1].resumable:
            path.pop()
        if not path:
            return None
        now = next(self._clock)
        for node in path:
            node.used = now
        hit = Hit(path[-1].end, path)
        self.stats.hits += 1
        self.stats.tokens_reused += hit.length
        return hit

    def _walk(self, prompt: list[int]) -> list[Node]:
        """The nodes whose stretches, one after the other, begin `prompt`: at each level the longest."""
        path, node, pos = [], self.root, 0
        while pos < len(prompt):
            best = None
            for child in node.children.get(prompt[pos], ()):
                n = len(child.stretch.tokens)
                if (best is None or n > len(best.stretch.tokens)) and pos + n <= len(prompt) \
                        and tuple(prompt[pos : pos + n]) == child.stretch.tokens:
                    best = child
            if best is None:
                break
            path.append(best)
            node, pos = best, best.end
        return path

    # -- insert --------------------------------------------------------------------------

    def insert(self, parent: Node | None, stretches: list[Stretch]) -> None:
        """Add a prompt's snapshots, in order, below `parent` (the node it resumed from; None: the root).

        A stretch already present (the same tokens at the same place, e.g. two
        requests with one system prompt prefilled at once) is kept as it was and
        the new one dropped.
        """
        if not self.enabled or not stretches:
            return
        node = parent if parent is not None and self._attached(parent) else None
        if node is None and parent is not None:
            return  # what it resumed from was evicted meanwhile: its stretches have no place to hang
        node = node or self.root
        now = next(self._clock)
        for stretch in stretches:
            if not stretch.tokens:
                continue
            same = next((c for c in node.children.get(stretch.tokens[0], ()) if c.stretch.tokens == stretch.tokens), None)
            if same is None:
                same = Node(parent=node, start=node.end, stretch=stretch)
                node.children.setdefault(stretch.tokens[0], []).append(same)
                self.stats.bytes += stretch.nbytes
                self.stats.entries += 1
            elif same.stretch.end_state is None and stretch.end_state is not None:
                same.stretch.end_state = stretch.end_state  # a dropped snapshot comes back
                self.stats.bytes += nbytes(stretch.end_state)
            same.used = now
            node = same
        self._evict()

    def _attached(self, node: Node) -> bool:
        while node.parent is not None:
            group = node.parent.children.get(node.stretch.tokens[0], [])
            if not any(c is node for c in group):
                return False
            node = node.parent
        return node is self.root

    # -- eviction ------------------------------------------------------------------------

    def _nodes(self):
        stack = list(self.root.kids())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.kids())

    def _evict(self) -> None:
        while self.stats.bytes > self.max_bytes:
            victim = min((n for n in self._nodes() if n.resumable), key=lambda n: n.used, default=None)
            if victim is None:
                break
            self.stats.evictions += 1
            if any(True for _ in victim.kids()):
                self.stats.bytes -= nbytes(victim.stretch.end_state)
                victim.stretch.end_state = None
            else:
                self._remove(victim)

    def _remove(self, node: Node) -> None:
        """Drop a leaf, then each ancestor left as a leaf that cannot be resumed from."""
        while node.parent is not None and not node.children:
            group = node.parent.children[node.stretch.tokens[0]]
            group.remove(node)
            if not group:
                del node.parent.children[node.stretch.tokens[0]]
            self.stats.bytes -= node.stretch.nbytes
            self.stats.entries -= 1
            parent = node.parent
            node.parent = None
            if parent.resumable:
                break
            node = parent

    def clear(self) -> None:
        self.root = Node(parent=None, start=0, stretch=None)
        self.stats.bytes = self.stats.entries = 0
