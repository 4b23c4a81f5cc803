"""Per-sequence speculative decoding on mlx-lm: load, tokenize, draft, verify, accept.

mlx-lm provides the models, tokenizer, chat template, KV caches and top-p
filtering; this module owns the speculative step so it can count drafted and
accepted tokens by position, honour a per-request depth, and stop a sequence
between any two steps.

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
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from mlx_lm.sample_utils import apply_top_p
from mlx_lm.utils import load_model, load_tokenizer

from worker.proof import hash_weights

log = logging.getLogger("mtpstack.worker")

#: Prompt tokens processed per step; a long prompt is prefilled over several
#: steps so the other active sequences keep making progress meanwhile.
PREFILL_CHUNK = 512
#: Deepest speculation the engine accepts; beyond this a drafter rarely pays.
MAX_DEPTH = 16


class ModelNotFound(Exception):
    """A model path that is neither a local directory nor a cached hub id."""


def resolve_model_path(path_or_id: str) -> Path:
    """A local directory as is; otherwise a hub id looked up in huggingface_hub's cache, offline."""
    path = Path(path_or_id).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFound(f"model path is not a directory: `{path_or_id}`")
        return path.resolve()
    looks_like_id = path_or_id.count("/") == 1 and not path_or_id.startswith((".", "/", "~"))
    if not looks_like_id:
        raise ModelNotFound(f"model directory does not exist: `{path_or_id}`")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path_or_id, local_files_only=True)).resolve()
    except Exception:
        raise ModelNotFound(f"model is neither a local directory nor in the Hugging Face cache: `{path_or_id}`") from None


@dataclass
class LoadedModel:
    """One loaded model and what `/identity` says about it."""

    path: str  # as given on the command line
    resolved_path: Path
    model: object
    config: dict
    bits: str | None  # the command line's claim (`--target-bits`)
    sha256: str

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
        }


def load_one(path: str, bits: str | None) -> LoadedModel:
    resolved = resolve_model_path(path)
    # Hash first: what /identity reports is the content of the files read next.
    digest = hash_weights(resolved)
    model, config = load_model(resolved)
    return LoadedModel(path=path, resolved_path=resolved, model=model, config=config, bits=bits, sha256=digest)


def bits_mismatch(m: LoadedModel) -> str | None:
    """Why the command line's bits claim contradicts config.json's quantization, or None."""
    if m.bits is None:
        return None
    q = m.quantization
    if str(m.bits).isdigit():
        have = q.get("bits") if q else None
        return None if have == int(m.bits) else f"claimed {m.bits}-bit, config says {have or 'unquantized'}"
    if m.bits in ("bf16", "fp16", "fp32"):
        return None if q is None else f"claimed {m.bits}, config says {q.get('bits')}-bit"
    return None


class Engine:
    """A target, an optional drafter, and their shared tokenizer."""

    def __init__(self, target: LoadedModel, drafter: LoadedModel | None, tokenizer, draft_depth: int):
        self.target = target
        self.drafter = drafter
        self.tokenizer = tokenizer
        self.draft_depth = draft_depth if drafter is not None else 0
        self.context_length: int | None = target.config.get("max_position_embeddings")
        self.eos_token_ids = set(tokenizer.eos_token_ids)
        self.batchable = can_batch(self)

    @classmethod
    def load(
        cls,
        target: str,
        drafter: str | None = None,
        *,
        draft_depth: int = 3,
        target_bits: str | None = None,
        drafter_bits: str | None = None,
    ) -> "Engine":
        if not 0 <= draft_depth <= MAX_DEPTH:
            raise ValueError(f"draft depth must be between 0 and {MAX_DEPTH}: {draft_depth}")
        t = load_one(target, target_bits)
        d = load_one(drafter, drafter_bits) if drafter else None
        for role, m in (("target", t), ("drafter", d)):
            if m is not None and (problem := bits_mismatch(m)):
                log.warning("the %s's --%s-bits disagrees with its config.json: %s", role, role, problem)
        tokenizer = load_tokenizer(t.resolved_path, eos_token_ids=t.config.get("eos_token_id"))
        if d is not None and draft_depth > 0:
            for role, m, path in (("target", t, target), ("drafter", d, drafter)):
                cache = make_prompt_cache(m.model)
                if not can_trim_prompt_cache(cache):
                    kinds = ", ".join(sorted({type(c).__name__ for c in cache if not c.is_trimmable()}))
                    raise ValueError(
                        f"speculative decoding needs a KV cache that can be rolled back, the {role}'s has {kinds}: `{path}`"
                    )
        if d is not None:
            tv, dv = t.config.get("vocab_size"), d.config.get("vocab_size")
            if tv is not None and dv is not None and tv != dv:
                raise ValueError(f"the drafter's vocabulary ({dv}) differs from the target's ({tv}): `{drafter}`")
        return cls(t, d, tokenizer, draft_depth)

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
    """One request's decoding state with its own target and drafter KV caches.

    `step()` runs either one prefill chunk or one draft-and-verify step; between
    any two steps the sequence can be dropped without affecting any other.
    """

    def __init__(self, engine: Engine, prompt: list[int], params: SamplingParams):
        if not prompt:
            raise ValueError("empty prompt")
        self.engine = engine
        self.prompt = list(prompt)
        self.params = params
        self.use_drafter = engine.drafter is not None and params.depth > 0
        # Caches are made on the first step, in the generation thread.
        self.target_cache: list | None = None
        self.draft_cache: list | None = None
        self._prefilled = 0  # prompt tokens (all but the last) already in the caches
        self._y: list[int] = []  # the target's next input
        self._next: mx.array | None = None  # pipelined: a sampled token whose forward is queued
        self._draft_y: list[int] = []  # the drafter's next input (may lag the target by one)
        self.tokens: list[int] = []
        self.text = ""
        self.sent = 0
        self.finish_reason: str | None = None
        self.drafted = 0
        self.accepted = 0
        self._detok = engine.tokenizer.detokenizer
        self.cancelled = False  # set from another thread; honoured before the next step
        self.handle = None  # the server's per-request bridge
        self._stop_scan = 0
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        # The key is made on first use, in the generation thread: only that thread touches mlx.
        self._seed = params.seed if params.seed is not None else random.getrandbits(63)
        self._key = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    # -- the step ----------------------------------------------------------------------

    def _ensure_caches(self) -> None:
        if self.target_cache is None:
            self.target_cache = make_prompt_cache(self.engine.target.model)
            self.draft_cache = make_prompt_cache(self.engine.drafter.model) if self.use_drafter else None

    def step(self, pipeline: bool = False) -> StepResult:
        """One prefill chunk or one decode step.

        `pipeline` (plain decoding only, used when the sequence runs alone): the
        target's forward for the following token is queued before this token is
        read back, as mlx-lm's `generate_step` does, so graph building overlaps
        compute. The queued token is emitted by the next step either way.
        """
        if self.finished:
            return StepResult()
        self._ensure_caches()
        if self._next is not None or (pipeline and self.decoding and not self.use_drafter):
            return self._pipelined_step(pipeline)
        if self._prefilled < len(self.prompt) - 1:
            return self._prefill_chunk()
        return self._decode_step()

    def _prefill_chunk(self) -> StepResult:
        end = min(self._prefilled + PREFILL_CHUNK, len(self.prompt) - 1)
        chunk = mx.array(self.prompt[self._prefilled : end], mx.uint32)[None]
        self.engine.target.model(chunk, cache=self.target_cache)
        states = [c.state for c in self.target_cache]
        if self.use_drafter:
            self.engine.drafter.model(chunk, cache=self.draft_cache)
            states += [c.state for c in self.draft_cache]
        mx.eval(states)
        n = end - self._prefilled
        self._prefilled = end
        if self._prefilled >= len(self.prompt) - 1:
            self._y = self.prompt[-1:]
            self._draft_y = self.prompt[-1:]
        return StepResult(prefill=n)

    def _sample(self, logits: mx.array) -> mx.array:
        """One token per row of `logits` ([n, vocab]) from the target's distribution."""
        p = self.params
        if p.temperature <= 0:
            return mx.argmax(logits, axis=-1)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if 0 < p.top_p < 1:
            logprobs = apply_top_p(logprobs, p.top_p)
        if self._key is None:
            self._key = mx.random.key(self._seed)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(logprobs * (1.0 / p.temperature), key=sub)

    @property
    def decoding(self) -> bool:
        """True once the prompt is in the caches: the next step drafts and verifies."""
        return not self.finished and self._prefilled >= len(self.prompt) - 1

    def plan(self) -> int:
        """How many tokens the next step drafts: never more than could be emitted (k + 1 <= left)."""
        self._ensure_caches()
        if not self._y:  # a one-token prompt skips prefill
            self._y = self.prompt[-1:]
            self._draft_y = self.prompt[-1:]
        remaining = self.params.max_tokens - len(self.tokens)
        return min(self.params.depth, remaining - 1) if self.use_drafter else 0

    def draft(self, k: int) -> mx.array | None:
        """The drafter's k argmax proposals, left lazy so the target's forward joins the same graph."""
        if k <= 0:
            return None
        inp = mx.array(self._draft_y, mx.uint32)
        proposals = []
        for _ in range(k):
            logits = self.engine.drafter.model(inp[None], cache=self.draft_cache)[0, -1:, :]
            inp = mx.argmax(logits, axis=-1).astype(mx.uint32)
            mx.async_eval(inp)
            proposals.append(inp)
        return mx.concatenate(proposals)

    def verify_input(self, draft: mx.array | None) -> mx.array:
        """The target's input for this step: y then the drafted tokens."""
        y = mx.array(self._y, mx.uint32)
        return y if draft is None else mx.concatenate([y, draft])

    def accept(self, k: int, sampled: list[int], drafts: list[int], *, trim_target: bool = True) -> StepResult:
        """Keep the drafted prefix the target agrees with, roll both caches back past the rest, emit."""
        n = 0
        while n < k and sampled[n] == drafts[n]:
            n += 1
        # The target's cache holds y, d1..dk: keep y, d1..dn.
        if trim_target and k - n:
            trim_prompt_cache(self.target_cache, k - n)
        self._y = [sampled[n]]
        if self.use_drafter:
            if k == 0:
                # The drafter ran nothing this step; it still has to see what it missed.
                self._draft_y = self._draft_y + [sampled[0]]
            elif n == k:
                # The drafter produced dk but never consumed it.
                self._draft_y = [drafts[-1], sampled[k]]
            else:
                # The drafter consumed draft_y, d1..d(k-1): keep d1..dn.
                if k - 1 - n:
                    trim_prompt_cache(self.draft_cache, k - 1 - n)
                self._draft_y = [sampled[n]]
        self.drafted += k
        self.accepted += n
        emitted = self._emit(sampled[: n + 1])
        return StepResult(drafted=k, accepted=n, tokens=emitted)

    @property
    def pipelined(self) -> bool:
        return self._next is not None

    def _pipelined_step(self, keep_going: bool) -> StepResult:
        if self._next is None:
            self.plan()  # sets y for a one-token prompt
            logits = self.engine.target.model(mx.array(self._y, mx.uint32)[None], cache=self.target_cache)[0, -1:, :]
            self._next = self._sample(logits)
            mx.async_eval(self._next)
        current = self._next
        self._next = None
        if keep_going and len(self.tokens) + 1 < self.params.max_tokens:
            # Queue the next forward on the still-lazy token, then read this one back.
            logits = self.engine.target.model(current[None], cache=self.target_cache)[0, -1:, :]
            self._next = self._sample(logits)
            mx.async_eval(self._next)
        token = current.item()
        if self._next is None:
            self._y = [token]  # back to the plain state: y is the next input, not yet in the cache
        emitted = self._emit([token])
        return StepResult(tokens=emitted)

    def _decode_step(self) -> StepResult:
        k = self.plan()
        draft = self.draft(k)
        logits = self.engine.target.model(self.verify_input(draft)[None], cache=self.target_cache)[0, -(k + 1) :, :]
        sampled = self._sample(logits)
        mx.eval(sampled) if draft is None else mx.eval(sampled, draft)
        return self.accept(k, sampled.tolist(), draft.tolist() if draft is not None else [])

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


def batched_verify(seqs: list[Sequence], k: int) -> list[StepResult]:
    """One target forward for several sequences that all draft k tokens this step.

    Each sequence keeps its own KV cache. For the step they are merged into
    mlx-lm's left-padded `BatchKVCache`, run as one batch (the weights are read
    once for all rows, which is what makes width cheap on memory-bound hardware),
    and split back, each row cut at its own accepted length: the per-row rollback
    `BatchKVCache.trim` lacks.
    """
    from mlx_lm.models.cache import BatchKVCache, KVCache

    target = seqs[0].engine.target.model
    drafts = [s.draft(k) for s in seqs]
    inputs = mx.stack([s.verify_input(d) for s, d in zip(seqs, drafts)])
    lengths = [s.target_cache[0].offset for s in seqs]
    pads = [max(lengths) - n for n in lengths]
    batch = [BatchKVCache.merge([s.target_cache[i] for s in seqs]) for i in range(len(seqs[0].target_cache))]
    logits = target(inputs, cache=batch)[:, -(k + 1) :, :]
    sampled = [s._sample(logits[row]) for row, s in enumerate(seqs)]
    mx.eval(sampled, [d for d in drafts if d is not None])
    results = []
    for row, (seq, d) in enumerate(zip(seqs, drafts)):
        toks = sampled[row].tolist()
        dl = d.tolist() if d is not None else []
        n = 0
        while n < k and toks[n] == dl[n]:
            n += 1
        end = batch[0].size() - (k - n)
        caches = []
        for bc in batch:
            c = KVCache()
            c.keys = bc.keys[row : row + 1, :, pads[row] : end]
            c.values = bc.values[row : row + 1, :, pads[row] : end]
            c.offset = end - pads[row]
            caches.append(c)
        seq.target_cache = caches
        results.append(seq.accept(k, toks, dl, trim_target=False))
    return results


def batched_prefill(seqs: list[Sequence]) -> list[StepResult]:
    """Prefill several new sequences' prompts (each within one chunk) in one left-padded forward per model.

    The batch caches are split back into per-sequence caches, padding cut off, so
    what follows is exactly the state a sequence-by-sequence prefill leaves.
    """
    from mlx_lm.models.cache import BatchKVCache, KVCache

    def run(model, group: list[Sequence], attr: str) -> None:
        rows = [s.prompt[:-1] for s in group]
        width = max(len(r) for r in rows)
        pads = [width - len(r) for r in rows]
        inputs = mx.array([[0] * p + r for p, r in zip(pads, rows)], mx.uint32)
        batch = [BatchKVCache(pads) for _ in make_prompt_cache(model)]
        model(inputs, cache=batch)
        mx.eval([c.state for c in batch])
        for row, seq in enumerate(group):
            caches = []
            for bc in batch:
                c = KVCache()
                c.keys = mx.contiguous(bc.keys[row : row + 1, :, pads[row] : bc.size()])
                c.values = mx.contiguous(bc.values[row : row + 1, :, pads[row] : bc.size()])
                c.offset = bc.size() - pads[row]
                caches.append(c)
            setattr(seq, attr, caches)

    engine = seqs[0].engine
    run(engine.target.model, seqs, "target_cache")
    drafting = [s for s in seqs if s.use_drafter]
    if drafting:
        run(engine.drafter.model, drafting, "draft_cache")
    results = []
    for seq in seqs:
        n = len(seq.prompt) - 1
        seq._prefilled = n
        seq._y = seq.prompt[-1:]
        seq._draft_y = seq.prompt[-1:]
        results.append(StepResult(prefill=n))
    return results


def can_batch(engine: Engine) -> bool:
    """Batched verification needs plain KV caches (no rotating or state-space layers)."""
    from mlx_lm.models.cache import KVCache

    return all(type(c) is KVCache for c in make_prompt_cache(engine.target.model))


class Scheduler:
    """The generation loop's seam: `step()` advances every active sequence once.

    Sequences still prefilling run one prompt chunk each. Decoding sequences that
    draft the same number of tokens this step share one batched target forward
    (`batched_verify`) when `batched` is on and the model's caches allow it;
    otherwise each runs its own draft-and-verify step in turn. Either way every
    active sequence makes progress every step and none waits for another.
    """

    def __init__(self, max_num_seqs: int, *, batched: bool = True, pipeline: bool = True):
        self.max_num_seqs = max_num_seqs
        self.batched = batched
        self.pipeline = pipeline
        self.active: list[Sequence] = []
        self.batched_steps = 0  # target forwards shared by more than one sequence

    def add(self, seq: Sequence) -> None:
        if len(self.active) >= self.max_num_seqs:
            raise RuntimeError("scheduler full")
        self.active.append(seq)

    def drop_cancelled(self) -> list[Sequence]:
        """Remove sequences whose client went away; cheap, so the loop runs it every iteration."""
        dropped = [seq for seq in self.active if seq.cancelled]
        for seq in dropped:
            seq.cancel()
            self.active.remove(seq)
        return dropped

    def step(self) -> list[tuple[Sequence, StepResult | None, BaseException | None]]:
        """One step of each active sequence; finished or cancelled ones leave the active set."""
        results = []
        groups: dict[int, list[Sequence]] = {}
        singles: list[Sequence] = []
        for seq in list(self.active):
            if seq.cancelled:
                seq.cancel()
            if seq.finished:
                self.active.remove(seq)
                results.append((seq, None, None))
            elif self.batched and seq.decoding and seq.engine.batchable and not seq.pipelined:
                groups.setdefault(seq.plan(), []).append(seq)
            else:
                singles.append(seq)
        for k, group in groups.items():
            if len(group) == 1:
                singles.extend(group)
                continue
            try:
                results.extend((seq, r, None) for seq, r in zip(group, batched_verify(group, k)))
                self.batched_steps += 1
            except Exception as e:  # one broken batch must not stop the loop
                log.exception("batched step failed")
                for seq in group:
                    seq.finish_reason = "error"
                    results.append((seq, None, e))
        fresh = [
            seq for seq in singles
            if self.batched and seq.engine.batchable and seq.target_cache is None and 1 < len(seq.prompt) <= PREFILL_CHUNK + 1
        ]
        if len(fresh) > 1:
            singles = [seq for seq in singles if seq not in fresh]
            try:
                results.extend((seq, r, None) for seq, r in zip(fresh, batched_prefill(fresh)))
                self.batched_steps += 1
            except Exception as e:  # one broken batch must not stop the loop
                log.exception("batched prefill failed")
                for seq in fresh:
                    seq.finish_reason = "error"
                    results.append((seq, None, e))
        alone = len(self.active) == 1
        for seq in singles:
            try:
                results.append((seq, seq.step(pipeline=alone and self.pipeline), None))
            except Exception as e:  # one broken request must not stop the others
                log.exception("sequence failed")
                seq.finish_reason = "error"
                results.append((seq, None, e))
        for seq, _, _ in results:
            if seq.finished and seq in self.active:
                self.active.remove(seq)
        return results
