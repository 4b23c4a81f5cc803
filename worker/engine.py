"""Batched speculative decoding on mlx-lm: load, tokenize, draft, verify, accept.

mlx-lm provides the models, tokenizer, chat template and top-p filtering; this
module owns the step. Decoding sequences are rows of one resident batch
(`Batch`): each step the drafter (an MTP head or a separate draft model,
`mtpstack.worker.drafting`) proposes up to k tokens per row, the target verifies every
row in one forward, and each row keeps its own accepted prefix: attention
caches by length, gated-delta state by the state saved after that position
(`mtpstack.worker.caches`). Drafted and accepted tokens are counted by position, a
request's depth is honoured per row, and a sequence can be stopped between any
two steps.

Acceptance rule (documented in docs/worker.md): the target samples a token at
every verified position from its own distribution (argmax when greedy); a
drafted token is accepted when it equals the target's own sample there, and the
first disagreement emits the target's sample instead. Every emitted token is
therefore a sample of the target given the accepted prefix, so the output
distribution is exactly the target's (and greedy output is exactly the
target's greedy output) at every depth. The drafter always proposes its argmax,
the proposal most likely to match.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p
from mlx_lm.utils import load_model, load_tokenizer

from mtpstack.validator import DEPTH_DEFAULT, DEPTH_MAX, DRAFTER_KINDS, bits_disagreement, config_value, detect_drafter_kind, head_mismatch, model_facts
from mtpstack.worker.caches import CacheNotSupported, add_row, batch_caches, install_rollback, commit, filter_rows, prepare_chunk, take_row
from mtpstack.worker.drafting import HeadDrafter, ModelDrafter
from mtpstack.worker.prefix_cache import Hit, PrefixCache, Stretch
from mtpstack.worker.mtp.load import HeadLoadError, load_head
from mtpstack.worker.proof import hash_weights, resolve_model_path

log = logging.getLogger("mtpstack.worker")

#: The most prompt tokens a row prefills in one step, and the prefix cache's snapshot
#: interval: a chunk never crosses a multiple of it, so every prompt is snapshotted at
#: the same absolute positions and two prompts that share 1,100 tokens share two snapshots.
PREFILL_CHUNK = 512
#: Tokens one step runs while any row decodes: the decoding rows' drafted positions
#: first, the rest shared by the rows being prefilled. It bounds how much prompts
#: arriving can stretch the other rows' time between tokens (vLLM's default budget for
#: chunked prefill is the same 2,048); at 512, three prompts arriving beside one decoding
#: row took 2.5x longer to their first token than mlx_lm.server's plain batching.
STEP_TOKENS = 2048
#: The fewest prompt tokens a prefilling row gets per step however busy the batch.
MIN_PREFILL_SHARE = 16


@dataclass
class LoadedModel:
    """One loaded model and what `/identity` says about it."""

    path: str  # as given on the command line
    resolved_path: Path
    model: object
    config: dict
    bits: str | None  # the command line's claim (`--target-bits`)
    sha256: str
    kind: str | None = None  # a drafter's kind: `mtp` (a head) or `model` (a separate draft model)
    bundled: bool = False  # an MTP head read from the target's own checkpoint
    family: str | None = None  # an MTP head's family (its head `model_type` in the family table)

    @property
    def quantization(self) -> dict | None:
        q = self.config.get("quantization") or self.config.get("quantization_config")
        return q if isinstance(q, dict) else None

    def identity(self) -> dict:
        return {
            "path": self.path,
            "resolved_path": str(self.resolved_path),
            "bits": self.bits,
            "quantization": self.quantization,
            "sha256": self.sha256,
            # Non-null when the command line's bits claim contradicts config.json.
            "bits_mismatch": bits_mismatch(self),
            **({"kind": self.kind, "bundled": self.bundled, "family": self.family} if self.kind else {}),
        }


def load_one(path: str, bits: str | None, prepare=None) -> LoadedModel:
    """`prepare(model)`, when given, runs on the lazily loaded model before its weights are read
    (a distributed worker shards it there, so each rank reads only its part)."""
    resolved = resolve_model_path(path)
    # Hash first: what /identity reports is the content of the files read next.
    digest = hash_weights(resolved)
    model, config = load_model(resolved, lazy=prepare is not None)
    if prepare is not None:
        prepare(model)
        mx.eval(model.parameters())
    return LoadedModel(path=path, resolved_path=resolved, model=model, config=config, bits=bits, sha256=digest)


def bits_mismatch(m: LoadedModel) -> str | None:
    """Why the command line's bits claim contradicts config.json, or None (`validate --deep` makes the same comparison)."""
    recorded = bits_disagreement(m.bits, m.config)
    return None if recorded is None else f"claimed {m.bits}, config.json records {recorded}"


class TargetParts:
    """The target's embedding, its body up to the final norm, and its LM head, used separately.

    Speculative verification needs the final hidden state as well as the logits
    (an MTP head drafts from it), so the engine runs the body and the head itself.
    """

    def __init__(self, model):
        lm = getattr(model, "language_model", model)
        self.body = lm.model if hasattr(lm, "model") else lm.backbone  # Nemotron-H calls its body `backbone`
        self.embed = getattr(self.body, "embed_tokens", None) or self.body.embeddings
        tied = getattr(getattr(lm, "args", None), "tie_word_embeddings", False)
        self.lm_head = self.embed.as_linear if tied or not hasattr(lm, "lm_head") else lm.lm_head

    def hidden(self, tokens: mx.array, cache: list) -> mx.array:
        return self.body(tokens, cache=cache)


class Engine:
    """A target, an optional drafter (an MTP head or a separate draft model), and their shared tokenizer."""

    def __init__(self, target: LoadedModel, drafter: LoadedModel | None, tokenizer, draft_depth: int, *, cache_kinds: list[str], drafter_factory=None):
        self.target = target
        self.drafter = drafter
        self.draft_kind = drafter.kind if drafter is not None else None
        self.tokenizer = tokenizer
        self.draft_depth = draft_depth if drafter is not None else 0
        self.context_length: int | None = config_value(target.config, "max_position_embeddings")
        self.eos_token_ids = set(tokenizer.eos_token_ids)
        self.parts = TargetParts(target.model)
        #: Rows of the target's logits, computed once (request checks, grammars, drafter checks read it):
        #: config.json's `vocab_size` (or its `text_config`'s), else the embedding table's rows.
        size = config_value(target.config, "vocab_size")
        self.vocab_size: int = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 \
            else int(self.parts.embed.weight.shape[0])
        self.cache_kinds = cache_kinds
        self._drafter_factory = drafter_factory
        #: A distributed worker's agreement (`mtpstack.worker.distributed`): token arrays in, rank 0's
        #: values out on every rank, so every rank's rows advance alike; None on one host.
        self.agree = None

    @classmethod
    def load(
        cls,
        target: str,
        drafter: str | None = None,
        *,
        draft_depth: int = DEPTH_DEFAULT,
        target_bits: str | None = None,
        drafter_bits: str | None = None,
        draft_kind: str = "auto",
        prepare_target=None,
    ) -> "Engine":
        if not 0 <= draft_depth <= DEPTH_MAX:
            raise ValueError(f"draft depth must be between 0 and {DEPTH_MAX}: {draft_depth}")
        if draft_kind not in DRAFTER_KINDS:
            raise ValueError(f"draft kind must be one of {', '.join(DRAFTER_KINDS)}: {draft_kind}")
        t = load_one(target, target_bits, prepare_target)
        refuse_unrunnable_experts(t.model, target)
        try:
            kinds = install_rollback(t.model)
        except CacheNotSupported as e:
            raise ValueError(f"the target cannot be served: {e}: `{target}`") from None
        d, impl = None, None
        if drafter:
            d, impl = _load_drafter(drafter, drafter_bits, draft_kind, t)
            refuse_unrunnable_experts(d.model, drafter)
        for role, m in (("target", t), ("drafter", d)):
            if m is not None and (problem := bits_mismatch(m)):
                log.warning("the %s's --%s-bits disagrees with its config.json: %s", role, role, problem)
        tokenizer = load_tokenizer(t.resolved_path, eos_token_ids=t.config.get("eos_token_id"))
        return cls(t, d, tokenizer, draft_depth, cache_kinds=kinds, drafter_factory=impl)

    def make_drafter(self):
        """A drafter with batch caches of its own, for one `Batch`; None without a drafter."""
        return self._drafter_factory(self) if self._drafter_factory is not None else None

    # -- prompts -----------------------------------------------------------------------

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """The target's chat template applied to `messages`, with the generation prompt."""
        if not self.tokenizer.has_chat_template:
            text = "".join(f"{m.get('role', 'user')}: {m.get('content', '')}\n" for m in messages) + "assistant:"
            return list(self.tokenizer.encode(text))
        tokens = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(tokens, dict):  # a BatchEncoding from some transformers versions
            tokens = tokens["input_ids"]
        return [int(t) for t in tokens]

    def text_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        return list(self.tokenizer.encode(prompt))

    def new_sequence(self, prompt: list[int], params: "SamplingParams") -> "Sequence":
        return Sequence(self, prompt, params)


#: Whether this mlx's `gather_qmm` takes the `global_scale` mlx-lm's quantized expert layers pass
#: (mlx 0.32 does; 0.31.2, the Nix package's pin on Linux, does not).
GATHER_QMM_TAKES_GLOBAL_SCALE = "global_scale" in (mx.gather_qmm.__doc__ or "")


def refuse_unrunnable_experts(model, path: str, runs: bool = GATHER_QMM_TAKES_GLOBAL_SCALE) -> None:
    """Refuses, at start rather than at the first prefill, a model with quantized MoE experts on an
    mlx whose `gather_qmm` cannot run mlx-lm's quantized expert layers."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    if runs or not any(isinstance(m, QuantizedSwitchLinear) for _, m in model.named_modules()):
        return
    raise ValueError(
        f"`{path}` has quantized MoE experts, which mlx {mx.__version__} cannot run with this mlx-lm "
        "(its `gather_qmm` takes no `global_scale`)\n\nhint: install mlx>=0.32, or serve an unquantized copy"
    )


def _load_drafter(path: str, bits: str | None, kind: str, target: LoadedModel):
    """The drafter as a LoadedModel and a factory for its batched implementation."""
    resolved = resolve_model_path(path)
    detected = detect_drafter_kind(resolved, target.resolved_path)
    if kind == "auto":
        kind = detected
    elif kind == "model" and detected == "mtp":
        raise ValueError(
            f"`--draft-kind model` names an MTP head folder (it has no embeddings or LM head of its own): `{path}`"
            "\n\nhint: use `--draft-kind mtp` or `auto`"
        )
    digest = hash_weights(resolved)
    if kind == "mtp":
        try:
            head = load_head(resolved, target.resolved_path)
        except HeadLoadError as e:
            raise ValueError(str(e)) from None
        head_facts = model_facts(resolved, head.config)
        target_facts = model_facts(target.resolved_path, target.config)
        if head_facts and target_facts and (problem := head_mismatch(head_facts, target_facts)):
            raise ValueError(f"the MTP head does not fit the target: {problem}: `{path}`")
        loaded = LoadedModel(path=path, resolved_path=resolved, model=head.module, config=head.config, bits=bits,
                             sha256=digest, kind="mtp", bundled=head.bundled, family=head.family.head_type)
        return loaded, lambda engine: HeadDrafter(head.module, engine.parts)
    model, config = load_model(resolved)
    loaded = LoadedModel(path=path, resolved_path=resolved, model=model, config=config, bits=bits, sha256=digest, kind="model")
    tv, dv = (f.vocab_size if f is not None else None
              for f in (model_facts(target.resolved_path, target.config), model_facts(resolved, config)))
    if tv is not None and dv is not None and tv != dv:
        raise ValueError(f"the drafter's vocabulary ({dv}) differs from the target's ({tv}): `{path}`")
    try:
        kinds = install_rollback(model)
    except CacheNotSupported as e:
        raise ValueError(f"the draft model cannot be rolled back: {e}: `{path}`") from None
    if any(kind != "kv" for kind in kinds):
        # Refused here, before /health ever answers 200, not at the first request.
        raise ValueError(
            f"the draft model `{path}` keeps recurrent (gated-delta or Mamba2) state, which a separate draft model's rejected "
            f"drafts cannot be rolled back from; the target `{target.path}` may be a hybrid, its draft model may not"
            "\n\nhint: use the target's MTP head (`--draft-kind mtp`), or a draft model with attention layers only"
        )
    return loaded, lambda engine: ModelDrafter(model, kinds)


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    depth: int = 0  # already capped at the worker's depth
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class StepResult:
    """What one step of one sequence did."""

    drafted: int = 0  # tokens the drafter proposed
    accepted: int = 0  # of those, how many the target confirmed
    tokens: int = 0  # tokens added to the output (after EOS/stop/max_tokens cuts)
    prefill: int = 0  # prompt tokens processed


class Sequence:
    """One request's decoding state.

    While its prompt is prefilled (a chunk per step) the sequence owns its
    caches; once the prompt is in and its first token sampled, it joins the
    scheduler's batch as a row and its state lives there. Between any two steps
    it can be dropped without affecting any other sequence.
    """

    def __init__(self, engine: Engine, prompt: list[int], params: SamplingParams):
        if not prompt:
            raise ValueError("empty prompt")
        self.engine = engine
        self.prompt = list(prompt)
        self.params = params
        self.use_drafter = engine.drafter is not None and params.depth > 0
        self._prefilled = 0  # prompt tokens in the caches
        self.carry = None  # the target's final hidden state at the last prefilled position [1, 1, H]
        #: Positions besides the multiples of PREFILL_CHUNK where the prefix cache snapshots the
        #: prompt (the chat template's message boundaries); one token before its end always is one.
        self.snapshot_at: set[int] = set()
        self.cached_tokens = 0  # prompt tokens taken from the prefix cache
        self._resumed: Hit | None = None
        self._snapshots: list[Stretch] = []
        self._snap_from = 0
        self.prefilling = False  # a row of the scheduler's prefill batch
        self.y: int | None = None  # the last emitted token, the target's next input
        self.draft = None  # the drafter's own state for this row (`mtpstack.worker.drafting`); opaque here
        self.in_batch = False
        self.tokens: list[int] = []
        self.text = ""
        self.sent = 0
        self.finish_reason: str | None = None
        self.drafted = 0
        self.accepted = 0
        self._detok = engine.tokenizer.detokenizer
        self.cancelled = False  # set from another thread; honoured before the next step
        self.handle = None  # the server's per-request bridge
        # Optional per-request view of the target's logits (mtpstack.worker.protocol.hooks): `constrain(logits,
        # drafted)` returns the [n, vocab] logits to sample from (a grammar mask), `observe(logits,
        # tokens)` sees the raw logits of the tokens just emitted (logprobs, the grammar's advance).
        self.hook = None
        self._stop_scan = 0
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        # The key is made on first use, in the generation thread: only that thread touches mlx.
        self._seed = params.seed if params.seed is not None else random.getrandbits(63)
        self._key = None
        self._solo: Scheduler | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def decoding(self) -> bool:
        """True once the prompt is in and the sequence is a row of the batch."""
        return self.in_batch and not self.finished

    def step(self) -> StepResult:
        """Advance this sequence alone (a one-row scheduler of its own); the server uses `Scheduler`."""
        if self._solo is None:
            self._solo = Scheduler(1)
            self._solo.add(self)
        for seq, result, error in self._solo.step():
            if error is not None:
                raise error
            if seq is self and result is not None:
                return result
        return StepResult()

    def next_chunk(self, share: int, snapshots: bool = False) -> list[int]:
        """The prompt tokens this row prefills next: at most `share`, never past a multiple of
        PREFILL_CHUNK nor (`snapshots`: a prefix cache takes them) past another snapshot point."""
        start = self._prefilled
        end = min(len(self.prompt), start + share, (start // PREFILL_CHUNK + 1) * PREFILL_CHUNK)
        for point in self._points() if snapshots else ():
            if start < point < end:
                end = point
        return self.prompt[start:end]

    def _points(self) -> set[int]:
        """Where the prompt is snapshotted besides the multiples of PREFILL_CHUNK: the hints, and one
        token before its end. Not at the end itself: a tokenizer may merge the prompt's last token
        (`assistant\n`) with the answer's first (`\n\n`) when the answer comes back in the next
        turn's history, which then shares all but the last token; resuming one token earlier costs
        a one-token prefill on an exact repeat."""
        return self.snapshot_at | ({len(self.prompt) - 1} if len(self.prompt) > 1 else set())

    def at_snapshot_point(self) -> bool:
        pos = self._prefilled
        return pos > self._snap_from and (pos % PREFILL_CHUNK == 0 or pos in self._points())

    def plan(self) -> int:
        """How many tokens this row drafts next step: never more than could be emitted (k + 1 <= left)."""
        if not self.use_drafter:
            return 0
        return max(0, min(self.params.depth, self.params.max_tokens - len(self.tokens) - 1))

    def _sample(self, logits: mx.array) -> mx.array:
        """One token per row of `logits` ([n, vocab]) from the target's distribution."""
        p = self.params
        if p.temperature <= 0:
            return mx.argmax(logits, axis=-1).astype(mx.uint32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if 0 < p.top_p < 1:
            logprobs = apply_top_p(logprobs, p.top_p)
        if self._key is None:
            self._key = mx.random.key(self._seed)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(logprobs * (1.0 / p.temperature), key=sub).astype(mx.uint32)

    # -- output ------------------------------------------------------------------------

    def _emit(self, tokens: list[int]) -> int:
        count = 0
        for tok in tokens:
            if tok in self.engine.eos_token_ids and not self.params.ignore_eos:
                self._finish("stop")
                break
            self.tokens.append(tok)
            count += 1
            self._detok.add_token(tok)
            self.text += self._detok.last_segment
            if self._check_stop():
                break
            if len(self.tokens) >= self.params.max_tokens:
                self._finish("length")
                break
        return count

    def _check_stop(self) -> bool:
        if not self.params.stop:
            return False
        start = max(0, self._stop_scan - self._hold)
        hits = [i for i in (self.text.find(s, start) for s in self.params.stop) if i >= 0]
        self._stop_scan = len(self.text)
        if hits:
            self.text = self.text[: min(hits)]
            self.finish_reason = "stop"
            return True
        return False

    def _finish(self, reason: str) -> None:
        self._detok.finalize()
        self.text += self._detok.last_segment
        if not self._check_stop():
            self.finish_reason = reason

    def cancel(self) -> None:
        if not self.finished:
            self.finish_reason = "cancelled"

    def take_text(self) -> str:
        """Text not handed out yet; while running, a possible stop-string prefix is held back."""
        end = len(self.text) if self.finished else max(self.sent, len(self.text) - self._hold)
        out = self.text[self.sent : end]
        self.sent = end
        return out



class Batch:
    """The resident batch: one row per decoding sequence, in the target's and the drafter's caches."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.caches = batch_caches(engine.cache_kinds)
        self.drafter = engine.make_drafter()
        self.rows: list[Sequence] = []

    def join(self, seq: Sequence, target: list[tuple], draft: list[tuple] | None) -> None:
        """A sequence whose prompt is in becomes a row, with its caches' rows (`caches.take_row`)."""
        add_row(self.caches, target)
        if self.drafter is not None:
            add_row(self.drafter.caches, draft)
            self.drafter.start(seq)
        seq.in_batch = True
        seq.carry = None  # the prompt's last hidden state: only the prefix cache needed it
        self.rows.append(seq)

    def remove_finished(self) -> None:
        keep = [i for i, seq in enumerate(self.rows) if not seq.finished]
        if len(keep) == len(self.rows):
            return
        filter_rows(self.caches, keep)
        if self.drafter is not None:
            self.drafter.filter(keep)
        for seq in self.rows:
            if seq.finished:
                seq.in_batch = False
        self.rows = [self.rows[i] for i in keep]

    def decode(self) -> list[tuple[StepResult | None, BaseException | None]]:
        """One draft-and-verify step of every row: one target forward for the whole batch.

        Each row's result, or the error its own work raised (its sampling hook, its output): such a
        row ends ("error") and the others' steps stand. An error of the shared forward is raised."""
        rows, engine = self.rows, self.engine
        plans = [seq.plan() for seq in rows]
        depth = max(plans)
        inputs = mx.array([[seq.y] for seq in rows], dtype=mx.uint32)
        drafts = self.drafter.draft(rows, depth) if depth else None
        if drafts is not None and engine.agree is not None:
            drafts = engine.agree(drafts)
        if drafts is not None:
            inputs = mx.concatenate([inputs, drafts], axis=1)
        hidden = engine.parts.hidden(inputs, self.caches)
        logits = engine.parts.lm_head(hidden)
        proposed = drafts.tolist() if drafts is not None and any(seq.hook for seq in rows) else None
        errors: dict[int, BaseException] = {}
        picks = []
        for i, (seq, k) in enumerate(zip(rows, plans)):
            try:  # a request's own sampling hook (its grammar) may fail: that row alone
                picks.append(seq._sample(seq.hook.constrain(logits[i], proposed[i][:k] if proposed else []) if seq.hook else logits[i]))
            except Exception as e:
                errors[i] = e
                picks.append(mx.argmax(logits[i], axis=-1).astype(mx.uint32))  # a stand-in: the row leaves after this step
        sampled = mx.stack(picks)
        if engine.agree is not None:
            # Rank 0's tokens on every rank, and which rows it failed (the last column), so they end everywhere.
            failed = mx.array([[int(i in errors)] for i in range(len(rows))], dtype=sampled.dtype)
            agreed = engine.agree(mx.concatenate([sampled, failed], axis=1))
            sampled = agreed[:, :-1]
            for i, flag in enumerate(agreed[:, -1].tolist()):
                if flag:
                    errors.setdefault(i, RuntimeError("rank 0 failed this row"))
        mx.eval(sampled, drafts if drafts is not None else [])
        s = sampled.tolist()
        d = drafts.tolist() if drafts is not None else [[] for _ in rows]
        accepted = []
        for i, (k, s_row, d_row) in enumerate(zip(plans, s, d)):
            n = 0
            while n < k and i not in errors and s_row[n] == d_row[n]:
                n += 1
            accepted.append(n)
        commit(self.caches, [n + 1 for n in accepted], depth + 1)
        # The kept states now, so the step's per-position states are freed before the next step
        # makes its own (left lazy, both steps' would be alive at once).
        mx.eval([c.state for c in self.caches])
        if depth:
            self.drafter.accept(rows, depth, accepted, sampled, drafts, hidden)
        results: list[tuple[StepResult | None, BaseException | None]] = []
        for i, (seq, k, n, s_row) in enumerate(zip(rows, plans, accepted, s)):
            try:
                if i in errors:
                    raise errors[i]
                seq.drafted += k
                seq.accepted += n
                seq.y = s_row[n]
                emitted = seq._emit(s_row[: n + 1])
                if seq.hook is not None:
                    seq.hook.observe(logits[i, :emitted], s_row[:emitted])
                results.append((StepResult(drafted=k, accepted=n, tokens=emitted), None))
            except Exception as e:  # this row's own work failed: it ends, the others go on
                log.error("a row's step failed: %s: %s", type(e).__name__, e)
                seq.finish_reason = "error"
                results.append((None, e))
        return results


class PrefillBatch:
    """The rows whose prompts are being prefilled: one target forward (and one drafter forward) a step for all.

    Each row runs a chunk of its prompt per step, chunks of different lengths
    padded on the right (`caches`: attention rows keep their own lengths, the
    gated-delta layers skip padded positions). A row may start from a prefix
    cache hit. When its last chunk is in, its first token is sampled, the
    snapshots it took go into the prefix cache, and it moves to the decoding
    batch (`Batch.join`).
    """

    def __init__(self, engine: Engine, drafter):
        self.engine = engine
        self.caches = batch_caches(engine.cache_kinds, prefill=True)
        self.drafter = drafter  # the decoding batch's drafter: the same module, its own prefill caches here
        self.draft_caches = drafter.prefill_caches() if drafter is not None else []
        self.rows: list[Sequence] = []

    def admit(self, seq: Sequence, cache: PrefixCache | None) -> None:
        """A new row, resumed from the deepest prefix-cache snapshot its prompt begins with."""
        hit = cache.lookup(seq.prompt) if cache is not None else None
        target = draft = None
        if hit is not None:
            target, draft, seq.carry = _restore(hit, self.engine.cache_kinds)
            seq._prefilled = seq._snap_from = seq.cached_tokens = hit.length
            seq._resumed = hit
        add_row(self.caches, target)
        add_row(self.draft_caches, draft)
        seq.prefilling = True
        self.rows.append(seq)

    def remove_finished(self) -> None:
        keep = [i for i, seq in enumerate(self.rows) if seq.prefilling and not seq.finished]
        if len(keep) == len(self.rows):
            return
        for seq in self.rows:
            if seq.finished:
                seq.prefilling = False
                seq._snapshots = []  # a prefill that did not complete leaves nothing behind
        filter_rows(self.caches, keep)
        filter_rows(self.draft_caches, keep)
        self.rows = [self.rows[i] for i in keep]

    def step(self, share: int, batch: Batch, cache: PrefixCache | None) -> list[tuple[Sequence, StepResult | None, BaseException | None]]:
        """One chunk of every row (at most `share` tokens each); rows whose prompt is in join `batch`."""
        engine, rows = self.engine, self.rows
        chunks = [seq.next_chunk(share, cache is not None and cache.enabled) for seq in rows]
        lengths = [len(c) for c in chunks]
        width = max(lengths)
        hidden = None
        if width:
            ids = mx.array([c + [0] * (width - len(c)) for c in chunks], dtype=mx.uint32)
            prepare_chunk(self.caches, lengths)
            hidden = engine.parts.hidden(ids, self.caches)
            commit(self.caches, lengths, width)
        last = [hidden[r : r + 1, n - 1 : n] if n else seq.carry for r, (seq, n) in enumerate(zip(rows, lengths))]
        finals, logits, errors = {}, {}, {}
        for r, (seq, n) in enumerate(zip(rows, lengths)):
            if seq._prefilled + n < len(seq.prompt):
                continue
            try:  # a request's own sampling hook (its grammar) may fail: that row alone
                logits[r] = engine.parts.lm_head(last[r][0])
                finals[r] = seq._sample(seq.hook.constrain(logits[r], []) if seq.hook else logits[r])
            except Exception as e:
                errors[r] = e
                finals.pop(r, None)
        if engine.agree is not None:
            self._agree_finals(finals, errors, [r for r, (seq, n) in enumerate(zip(rows, lengths)) if seq._prefilled + n >= len(seq.prompt)])
        mx.eval(list(finals.values()))
        bonus = {r: int(t.item()) for r, t in finals.items()}
        carries = [seq.carry for seq in rows]
        if self.drafter is not None:
            self.drafter.prefill(self.draft_caches, rows, chunks, hidden, bonus, carries)
        for seq, h in zip(rows, last):
            seq.carry = h
        mx.eval([c.state for c in self.caches], [c.state for c in self.draft_caches], [seq.carry for seq in rows if seq.carry is not None],
                self.drafter.arrays(rows) if self.drafter is not None else [])
        results = []
        for r, (seq, n) in enumerate(zip(rows, lengths)):
            seq._prefilled += n
            if r in errors:
                log.error("prefill of a row failed: %s: %s", type(errors[r]).__name__, errors[r])
                seq.finish_reason = "error"
                results.append((seq, None, errors[r]))
                continue
            if cache is not None and cache.enabled and seq.at_snapshot_point():
                seq._snapshots.append(self._snapshot(r, seq))
            if r not in bonus:
                results.append((seq, StepResult(prefill=n), None))
                continue
            seq.y = bonus[r]
            emitted = seq._emit([seq.y])
            if seq.hook is not None:
                seq.hook.observe(logits[r][:emitted], [seq.y][:emitted])
            if cache is not None:
                cache.insert(seq._resumed.node if seq._resumed else None, seq._snapshots)
            seq._snapshots, seq._resumed = [], None
            seq.prefilling = False
            if not seq.finished:
                batch.join(seq, take_row(self.caches, r), take_row(self.draft_caches, r))
            results.append((seq, StepResult(prefill=n, tokens=emitted), None))
        self.remove_finished()
        return results

    def _agree_finals(self, finals: dict, errors: dict, ending: list[int]) -> None:
        """Rank 0's first tokens for the rows whose prompt ended (-1 where it failed the row) on every rank."""
        if not ending:
            return
        mine = mx.concatenate([finals[r].reshape(-1).astype(mx.int32) if r in finals else mx.array([-1], dtype=mx.int32) for r in ending])
        for r, token in zip(ending, self.engine.agree(mine).tolist()):
            if token < 0:
                finals.pop(r, None)
                errors.setdefault(r, RuntimeError("rank 0 failed this row"))
            else:
                finals[r] = mx.array([token], dtype=mx.uint32)

    def _snapshot(self, r: int, seq: Sequence) -> Stretch:
        """Row r's stretch since its last snapshot: attention and drafter entries over it, the state at its end."""
        start, end = seq._snap_from, seq._prefilled
        seq._snap_from = end
        kinds = self.engine.cache_kinds
        target = [c.segment(r, start, end) if kind == "kv" else None for c, kind in zip(self.caches, kinds)]
        draft = [c.segment(r, *self.drafter.span(start, end)) for c in self.draft_caches] if self.drafter is not None else []
        states = [None if kind == "kv" else c.row(r) for c, kind in zip(self.caches, kinds)]
        return Stretch(tokens=tuple(seq.prompt[start:end]), segment=(target, draft), end_state=(states, mx.contiguous(seq.carry)))


def _restore(hit: Hit, kinds: list[str]) -> tuple[list[tuple], list[tuple], mx.array]:
    """A row's caches at a prefix-cache hit: the stretches' entries joined, the state at its end."""
    segments = hit.segments
    states, carry = hit.end_state

    def joined(layer: int, which: int) -> tuple:
        parts = [seg[which][layer] for seg in segments if seg[which][layer][0] is not None]
        if not parts:
            return None, None
        return (mx.concatenate([p[0] for p in parts], axis=2), mx.concatenate([p[1] for p in parts], axis=2))

    target = [joined(i, 0) if kind == "kv" else states[i] for i, kind in enumerate(kinds)]
    draft = [joined(j, 1) for j in range(len(segments[0][1]))]
    return target, draft, carry


class Scheduler:
    """The generation loop's seam: `step()` advances every active sequence once.

    Every decoding sequence is a row of one resident batch that drafts and
    verifies in one forward (rows accept different lengths and may draft
    different depths); every sequence still prefilling is a row of the prefill
    batch, which runs a chunk of each prompt in one forward, within a token
    budget shared with the decoding rows (`STEP_TOKENS`). Every active sequence
    makes progress every step and none waits for another. With a prefix cache,
    a prompt resumes from the deepest snapshot it begins with.
    """

    def __init__(self, max_num_seqs: int, prefix_cache: PrefixCache | None = None):
        self.max_num_seqs = max_num_seqs
        self.prefix_cache = prefix_cache
        self.active: list[Sequence] = []
        self.batch: Batch | None = None
        self.prefilling: PrefillBatch | None = None
        self.batched_steps = 0  # target forwards shared by more than one sequence
        self.decode_steps = 0  # batched decode forwards (draft and verify of every decoding row), any width

    def add(self, seq: Sequence) -> None:
        if len(self.active) >= self.max_num_seqs:
            raise RuntimeError("scheduler full")
        if self.batch is None:
            self.batch = Batch(seq.engine)
            self.prefilling = PrefillBatch(seq.engine, self.batch.drafter)
        self.active.append(seq)

    def drop_cancelled(self) -> list[Sequence]:
        """Remove sequences whose client went away; cheap, so the loop runs it every iteration."""
        dropped = [seq for seq in self.active if seq.cancelled]
        for seq in dropped:
            seq.cancel()
            self.active.remove(seq)
        if dropped and self.batch is not None:
            self.batch.remove_finished()
            self.prefilling.remove_finished()
        return dropped

    def step(self) -> list[tuple[Sequence, StepResult | None, BaseException | None]]:
        """One step of each active sequence; finished or cancelled ones leave the active set."""
        results: list[tuple[Sequence, StepResult | None, BaseException | None]] = []
        for seq in list(self.active):
            if seq.cancelled:
                seq.cancel()
            if seq.finished:
                self.active.remove(seq)
                results.append((seq, None, None))
        if self.batch is None:
            return results
        batch, prefilling = self.batch, self.prefilling
        batch.remove_finished()
        prefilling.remove_finished()
        decoding = list(batch.rows)
        if decoding:
            try:
                results.extend((seq, result, error) for seq, (result, error) in zip(decoding, batch.decode()))
                self.decode_steps += 1
                if len(decoding) > 1:
                    self.batched_steps += 1
            except Exception as e:  # the shared forward failed: every row of it; the loop goes on
                log.exception("batched step failed")
                for seq in decoding:
                    seq.finish_reason = "error"
                    results.append((seq, None, e))
        for seq in self.active:
            if not seq.in_batch and not seq.prefilling and not seq.finished:
                prefilling.admit(seq, self.prefix_cache)
        if prefilling.rows:
            try:
                results.extend(prefilling.step(self._share(decoding, len(prefilling.rows)), batch, self.prefix_cache))
            except Exception as e:  # one broken forward must not stop the loop
                log.exception("prefill failed")
                for seq in prefilling.rows:
                    seq.finish_reason = "error"
                    results.append((seq, None, e))
        batch.remove_finished()
        prefilling.remove_finished()
        for seq, _, _ in results:
            if seq.finished and seq in self.active:
                self.active.remove(seq)
        return results

    @staticmethod
    def _share(decoding: list[Sequence], prefilling: int) -> int:
        """Prompt tokens each prefilling row runs this step: a whole chunk when nothing decodes, else an
        equal part of what the decoding rows leave of the step's budget, rounded down to a power of two
        so that chunks fit the 512-token snapshot interval exactly and every step costs about the same."""
        if not decoding:
            return PREFILL_CHUNK
        left = STEP_TOKENS - sum(seq.plan() + 1 for seq in decoding if not seq.finished)
        share = max(MIN_PREFILL_SHARE, left // prefilling)
        return min(PREFILL_CHUNK, 1 << (share.bit_length() - 1))
