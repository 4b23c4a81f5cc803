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

With a disk tier (`mtpstack.worker.prefix_disk`), every node inserted is also
written there, behind the generation thread's back: what memory evicts stays
on disk under its own budget, and a lookup that memory cannot answer as deeply
is read back (`mtpstack.worker.snapshots`), here or after a restart.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from mtpstack.worker.prefix_disk import DiskTier
from mtpstack.worker.prefix_disk_format import chain_key

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
    #: It ends at a message boundary (the chat template's: where the system messages or the
    #: conversation end), where later prompts resume: kept resumable longer than the prompt's other
    #: snapshots (`PrefixCache.insert`).
    boundary: bool = False

    @property
    def nbytes(self) -> int:
        return nbytes(self.segment) + nbytes(self.end_state) + TOKEN_BYTES * len(self.tokens)


@dataclass(eq=False)
class Node:
    parent: "Node | None"
    start: int
    stretch: Stretch | None  # None only at the root
    #: Children by their stretch's length, then by its tokens: a lookup slices the prompt once per
    #: distinct length (at most PREFILL_CHUNK of them) instead of comparing every child.
    children: dict[int, dict[tuple[int, ...], "Node"]] = field(default_factory=dict)
    #: Its name on the disk tier (`prefix_disk_format.chain_key`); None at the root and without a disk tier.
    key: bytes | None = None

    @property
    def end(self) -> int:
        return self.start + (len(self.stretch.tokens) if self.stretch else 0)

    @property
    def resumable(self) -> bool:
        return self.stretch is not None and self.stretch.end_state is not None

    def child(self, tokens: tuple[int, ...]) -> "Node | None":
        return self.children.get(len(tokens), {}).get(tokens)

    def adopt(self, node: "Node") -> None:
        self.children.setdefault(len(node.stretch.tokens), {})[node.stretch.tokens] = node

    def disown(self, node: "Node") -> None:
        group = self.children.get(len(node.stretch.tokens), {})
        if group.get(node.stretch.tokens) is node:
            del group[node.stretch.tokens]
            if not group:
                del self.children[len(node.stretch.tokens)]


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

    def __init__(self, max_bytes: int, disk: DiskTier | None = None):
        self.max_bytes = max(0, int(max_bytes))
        #: Where every snapshot also goes, written behind (`prefix_disk`): what memory evicts stays
        #: there, and a restarted worker finds it. None: memory only.
        self.disk = disk if disk is not None and disk.enabled and self.max_bytes > 0 else None
        self.root = Node(parent=None, start=0, stretch=None)
        self.stats = Stats()
        #: The resumable nodes, least recently used first: eviction takes the first, in O(1)
        #: however many small entries a flood of distinct prompts leaves.
        self._lru: OrderedDict[Node, None] = OrderedDict()

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
        for node in path:
            self._touch(node)
        if self.disk is not None:
            self.disk.touch([node.key for node in path])
        hit = Hit(path[-1].end, path)
        self.stats.hits += 1
        self.stats.tokens_reused += hit.length
        return hit

    def joined(self, found: int | None, length: int) -> None:
        """Count a prompt that resumed `length` tokens in from a row still being prefilled, after
        `lookup` found `found` tokens here (None: nothing)."""
        if self.enabled:
            self.stats.hits += found is None
            self.stats.tokens_reused += length - (found or 0)

    def walk(self, prompt: list[int]) -> list[Node]:
        """The nodes whose stretches begin `prompt`, resumable or not, counting and touching nothing."""
        return self._walk(prompt) if self.enabled else []

    def _walk(self, prompt: list[int]) -> list[Node]:
        """The nodes whose stretches, one after the other, begin `prompt`: at each level the longest."""
        path, node, pos = [], self.root, 0
        while pos < len(prompt):
            best = None
            for n in sorted(node.children, reverse=True):
                if pos + n <= len(prompt) and (best := node.children[n].get(tuple(prompt[pos : pos + n]))) is not None:
                    break
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
        boundaries = []
        for stretch in stretches:
            if not stretch.tokens:
                continue
            same = node.child(stretch.tokens)
            if same is None:
                key = chain_key(node.key, stretch.tokens) if self.disk is not None else None
                same = Node(parent=node, start=node.end, stretch=stretch, key=key)
                node.adopt(same)
                self.stats.bytes += stretch.nbytes
                self.stats.entries += 1
                self._to_disk(same)
            elif same.stretch.end_state is None and stretch.end_state is not None:
                same.stretch.end_state = stretch.end_state  # a dropped snapshot comes back
                self.stats.bytes += nbytes(stretch.end_state)
                self._to_disk(same)
            self._touch(same)
            if stretch.boundary:
                boundaries.append(same)
            node = same
        for same in boundaries:  # most recent: the next turn resumes at the conversation's end, not one token before the prompt's
            self._touch(same)
        self._evict()

    def _to_disk(self, node: Node) -> None:
        """Queue what the disk tier lacks of `node` (it is written behind; nothing waits for it)."""
        if self.disk is not None:
            st = node.stretch
            self.disk.store(node.key, node.parent.key, node.start, st.tokens, st.segment, st.end_state, st.boundary)

    def _touch(self, node: Node) -> None:
        if node.resumable:
            self._lru[node] = None
            self._lru.move_to_end(node)

    def _attached(self, node: Node) -> bool:
        while node.parent is not None:
            if node.parent.child(node.stretch.tokens) is not node:
                return False
            node = node.parent
        return node is self.root

    # -- eviction ------------------------------------------------------------------------

    def _evict(self) -> None:
        while self.stats.bytes > self.max_bytes and self._lru:
            victim, _ = self._lru.popitem(last=False)
            self.stats.evictions += 1
            self._to_disk(victim)  # already there, unless its write was dropped: then now
            if victim.children:
                self.stats.bytes -= nbytes(victim.stretch.end_state)
                victim.stretch.end_state = None
            else:
                self._remove(victim)

    def _remove(self, node: Node) -> None:
        """Drop a leaf, then each ancestor left as a leaf that cannot be resumed from."""
        while node.parent is not None and not node.children:
            node.parent.disown(node)
            self.stats.bytes -= node.stretch.nbytes
            self.stats.entries -= 1
            self._lru.pop(node, None)
            parent = node.parent
            node.parent = None
            if parent.resumable:
                break
            node = parent
