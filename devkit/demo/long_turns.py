"""Training and checking the demo target on turns after an agent's long prompt, at a cost a CPU can pay.

An agent's turn is 16k-23k demo tokens (Codex CLI's, Claude Code's first requests), of which the
system prompt and tools are the same for every turn of a recording and the answer is a few dozen
tokens. A forward and backward pass over all of it for every example is out of reach on 2 cores, so
an episode (`devkit.demo.agent_turns.Episode`) is learned in three parts:

- the system part (`Episode.system` tokens) is run once per recording without gradients
  (`prefill`), refreshed every few steps, and kept as the layers' caches (`State`);
- from there, the rest of the prompt the turns share is run without gradients too (`prepare`),
  keeping its keys, values and recurrent state; when the user's request is far from the end (Claude
  Code puts about 4,300 tokens of its environment after it), the request is run again with
  gradients and the tokens between it and the last TAIL tokens are spliced in as they were computed,
  so the answer learns to look back at the request through attention;
- the last TAIL tokens of the shared prompt and each turn's own tokens and answer are run with
  gradients (`loss`), the answer's tokens weighted.

Forward values are exactly those of one pass over the whole turn (with the weights of the step its
constant parts were computed at); only the gradients are cut at the constant parts. The gated-delta
layers run in chunks (`devkit.demo.fast_delta`).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

#: Prompt tokens at the end of the shared prompt run with gradients, before each turn's own tokens.
TAIL = 32
#: A request at least this far from the end of the shared prompt is spliced (above); a nearer one is
#: simply part of the tokens run with gradients.
SPLICE_GAP = 512
#: Tokens after the request still run with gradients (the line break and the next words).
REQUEST_AFTER = 8
#: Prompt tokens run at once without gradients (what mlx-lm's prefill takes).
PREFILL_CHUNK = 2048


@dataclass
class State:
    """Every layer's cache after some tokens: keys and values for a full-attention layer, the
    convolution's last inputs and the recurrent state for a gated-delta layer."""

    layers: list[tuple[mx.array, mx.array]]
    length: int

    def caches(self, model) -> list:
        """mlx-lm caches holding this state (new objects: using them leaves the state as it is)."""
        from mlx_lm.models.cache import ArraysCache, KVCache

        out = []
        for layer, (a, b) in zip(_layers(model), self.layers):
            if layer.is_linear:
                c = ArraysCache(2)
                c[0], c[1] = a, b
            else:
                c = KVCache()
                c.state = (a, b, a.shape[2])
            out.append(c)
        return out


class _Spliced:
    """A full-attention layer's keys and values for a pass with gradients: each call appends by
    concatenation, so gradients reach every appended part that carries them."""

    def __init__(self, keys: mx.array, values: mx.array):
        self.keys, self.values, self.offset = keys, values, keys.shape[2]

    def update_and_fetch(self, keys, values):
        self.keys = mx.concatenate([self.keys, keys], axis=2)
        self.values = mx.concatenate([self.values, values], axis=2)
        self.offset += keys.shape[2]
        return self.keys, self.values

    def make_mask(self, n: int, **kwargs):
        from mlx_lm.models.cache import create_attention_mask

        return create_attention_mask(n, offset=self.offset, **kwargs)


def _layers(model):
    return model.language_model.model.layers


def _state_of(model, caches, length: int) -> State:
    layers = []
    for layer, c in zip(_layers(model), caches):
        if layer.is_linear:
            layers.append((c[0], c[1]))
        else:
            layers.append((c.keys[..., : c.offset, :], c.values[..., : c.offset, :]))
    return State(layers, length)


def prefill(model, tokens: list[int], state: State | None = None) -> State:
    """The layers' state after `tokens` (after `state`'s tokens when given), without gradients."""
    caches = state.caches(model) if state is not None else model.make_cache()
    for i in range(0, len(tokens), PREFILL_CHUNK):
        model(mx.array([tokens[i : i + PREFILL_CHUNK]]), cache=caches)
        mx.eval([c.state for c in caches])
    return _state_of(model, caches, (state.length if state is not None else 0) + len(tokens))


@dataclass
class Splice:
    """The constant part of a prompt between the request and the tail: its tokens, then per layer its
    keys and values (full attention; these tokens' only) or the state after it (gated delta)."""

    tokens: list[int]
    layers: list[tuple[mx.array, mx.array]]


def splice_after(model, system: State, request: list[int], tokens: list[int]) -> Splice:
    """`tokens` run without gradients after `system` and `request`."""
    state = prefill(model, request + tokens, system)
    start = system.length + len(request)
    layers = [(a, b) if layer.is_linear else (a[..., start:, :], b[..., start:, :])
              for layer, (a, b) in zip(_layers(model), state.layers)]
    return Splice(tokens, layers)


@dataclass
class Context:
    """What the episodes of one recording share, computed without gradients and refreshed now and
    then: the state after the client's system part, and the constant part after the recording's own
    request (reused for an episode whose constant part is the same tokens: the forward values then
    differ from one pass over the episode only in what that part read of the request)."""

    system: State
    splice: Splice | None = None


def context(model, system_tokens: list[int], episode=None) -> Context:
    """The context of a recording: its system part, and the constant part of `episode` (the
    recording's own request) when its request is far from the end."""
    system = prefill(model, system_tokens)
    if episode is None:
        return Context(system)
    request, rest = _split(episode)
    return Context(system, splice_after(model, system, request, rest) if rest else None)


def _split(episode) -> tuple[list[int], list[int]]:
    """(the tokens from the system part's end to just after the request, the constant part after them:
    empty when the request is within SPLICE_GAP of the tail)."""
    shared = episode.shared
    request_end = min(episode.request + REQUEST_AFTER, len(shared) - TAIL)
    if len(shared) - TAIL - request_end < SPLICE_GAP:
        return [], []
    return shared[episode.system : request_end], shared[request_end : len(shared) - TAIL]


@dataclass
class Prepared:
    """An episode made ready for `loss`: where its gradient passes start, and what they are spliced onto."""

    system: State  # after the system part
    request: list[int]  # tokens run with gradients on top of `system` (empty when nothing is spliced)
    splice: Splice | None  # the constant part after them
    tails: list[tuple[list[int], list[float]]]  # per turn: tokens after the splice, label weights


def prepare(model, episode, ctx: Context, weights) -> Prepared:
    """`episode` made ready on its recording's context; its constant part is computed now (without
    gradients) unless the context's is the same tokens. `weights(turn, n_prompt)` gives a turn's label
    weights for its tokens after the splice (the turn's own prompt tokens, then its answer)."""
    request, rest = _split(episode)
    splice = None
    if rest:
        n = len(ctx.splice.tokens) if ctx.splice is not None else 0
        at = episode.system + len(request)
        if n and episode.shared[at : at + n] == ctx.splice.tokens:
            splice = ctx.splice
        else:
            splice = splice_after(model, ctx.system, request, rest)
        start = at + len(splice.tokens)
    else:
        start = episode.system
    tails = []
    for turn in episode.turns:
        tokens = turn.prompt[start:] + turn.answer
        tails.append((tokens, weights(turn, len(turn.prompt) - start)))
    return Prepared(ctx.system, request, splice, tails)


def _grad_caches(model, prepared: Prepared) -> list:
    """Caches for the passes with gradients: the system part, the request run again (with gradients),
    then the constant part's keys and values and its final recurrent state."""
    from mlx_lm.models.cache import ArraysCache

    caches = []
    for layer, (a, b) in zip(_layers(model), prepared.system.layers):
        if layer.is_linear:
            c = ArraysCache(2)
            c[0], c[1] = a, b
        else:
            c = _Spliced(a, b)
        caches.append(c)
    if prepared.splice is None:
        return caches
    model(mx.array([prepared.request]), cache=caches)
    out = []
    for layer, c, (a, b) in zip(_layers(model), caches, prepared.splice.layers):
        if layer.is_linear:
            s = ArraysCache(2)
            s[0], s[1] = a, b
            out.append(s)
        else:
            out.append(_Spliced(mx.concatenate([c.keys, a], axis=2), mx.concatenate([c.values, b], axis=2)))
    return out


def _copy(caches: list) -> list:
    from mlx_lm.models.cache import ArraysCache

    out = []
    for c in caches:
        if isinstance(c, _Spliced):
            out.append(_Spliced(c.keys, c.values))
        else:
            a = ArraysCache(2)
            a[0], a[1] = c[0], c[1]
            out.append(a)
    return out


def loss(model, prepared: Prepared) -> mx.array:
    """Weighted next-token cross-entropy over the episode's tails, with gradients into the request's
    keys and values through attention (the rest of the prompt is constant)."""
    caches = _grad_caches(model, prepared)
    total = weight = 0.0
    for tokens, w in prepared.tails:
        ids = mx.array([tokens])
        logits = model(ids[:, :-1], cache=_copy(caches))
        ws = mx.array([w[1:]])
        total = total + (nn.losses.cross_entropy(logits, ids[:, 1:], reduction="none") * ws).sum()
        weight = weight + ws.sum()
    return total / weight


def greedy(model, state: State, tokens: list[int], *, max_tokens: int, stop: set[int]) -> list[int]:
    """The model's greedy answer to `tokens` after `state` (as the worker decodes it, without drafts)."""
    caches = state.caches(model)
    for i in range(0, len(tokens) - 1, PREFILL_CHUNK):
        model(mx.array([tokens[i : min(i + PREFILL_CHUNK, len(tokens) - 1)]]), cache=caches)
        mx.eval([c.state for c in caches])
    out, last = [], tokens[-1]
    for _ in range(max_tokens):
        nxt = int(model(mx.array([[last]]), cache=caches)[0, -1].argmax().item())
        out.append(nxt)
        if nxt in stop:
            break
        last = nxt
    return out
