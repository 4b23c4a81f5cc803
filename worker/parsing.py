"""A completion request checked and parsed: every field is checked before anything reaches mlx,
and each refusal is a 400 (or 404 for another model) naming its field."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from mtpstack.refusals import NOT_AN_OBJECT
from mtpstack.validator import DEPTH_AUTO
from mtpstack.worker.classify import CLASS_FIELD, CLASS_HEADER, CLASS_PATTERN, CODE, PROSE, classify_request
from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.http import ApiError, bad_request, model_not_found
from mtpstack.worker.protocol.chat import AgentRequest, ProtocolError, prepare, shown

#: Parameters that would change the response's shape or meaning, refused rather than ignored.
UNSUPPORTED_IF_SET = ("functions", "function_call", "suffix", "echo")
#: Largest integer accepted in a count (`max_tokens`, `n`, `num_draft_tokens`): mlx indexes
#: with 32-bit integers, and no context comes near it.
MAX_COUNT = 2**31 - 1
#: Seeds become a 64-bit mlx random key: 0 <= seed < 2^63, as mlx-lm's own server takes them.
SEED_LIMIT = 2**63


@dataclass
class ParsedRequest:
    """A request as the engine takes it: its prompt's token ids, its sampling, and how to answer it."""

    kind: str  # "chat" or "text"
    prompt: list[int]
    params: object  # engine.SamplingParams
    stream: bool
    include_usage: bool
    agent: AgentRequest | None = None  # tools, reasoning, logprobs, constrained output
    cls: str = "default"  # the workload class (`mtpstack.worker.classify`)
    #: The answer's writer for an API that is not chat's own (`protocol.responses.ResponseBuilder`,
    #: `protocol.messages_answer.MessageBuilder`).
    builder: object = None
    n: int = 1  # choices: rows of the batch sharing the prompt's prefill


def _unsupported(message: str, param: str) -> ApiError:
    return ApiError(400, "unsupported_parameter", message, param)


class ContextExceeded(ApiError):
    """A prompt that leaves no room in the context (`tokens` >= `limit`), answered in the words each
    API's clients act on (`worded`): Anthropic's `prompt is too long: N tokens > M maximum`, on which
    Claude Code compacts the conversation, and OpenAI's `context_length_exceeded` with "maximum context
    length" (Codex CLI keys on the code, Claude Code and opencode on either phrase)."""

    def __init__(self, tokens: int, limit: int, param: str, capped: bool):
        self.tokens, self.limit, self.capped = tokens, limit, capped
        super().__init__(400, "context_length_exceeded", self._openai("chat"), param)

    def _openai(self, api: str) -> str:
        what = {"chat": "messages", "completions": "prompt"}.get(api, "input")
        cap = " (this worker's `--max-context-tokens`)" if self.capped else ""
        lead = "Your input exceeds the context window of this model. " if api == "responses" else ""
        return (f"{lead}This model's maximum context length is {self.limit} tokens{cap}. However, your {what} "
                f"resulted in {self.tokens} tokens. Please reduce the length of the {what}.")

    def worded(self, api: str) -> tuple[str | None, str]:
        """(param, message) as the API `api` (`Endpoint.api`) words the refusal. Anthropic's message is
        its own, whole and unprefixed (Claude Code matches it from start to end); its maximum is the
        longest prompt that leaves room for one token of answer, so N > M always holds."""
        if api == "messages":
            return None, f"prompt is too long: {self.tokens} tokens > {self.limit - 1} maximum"
        return self.param, self._openai(api)


def _number(body: dict, key: str, kind, lo=None, hi=None):
    """`body[key]` as `kind` within [lo, hi] (either may be None: unbounded), or None when absent.
    Floats must be finite: NaN compares false with every bound and would slip through."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise bad_request(f"`{key}` must be {'an integer' if kind is int else 'a number'}: {shown(value)}", key)
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(f"`{key}` must be a finite number: {value!r}", key)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise bad_request(f"`{key}` is out of range [{lo}, {hi}]: {shown(value)}", key)
    return kind(value)


def _text(value: str, param: str, where: str | None = None) -> str:
    """`value` unless it cannot be encoded (a lone surrogate such as `\\ud800`), which tokenizers reject."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"`{param}` holds text that is not valid Unicode (a lone surrogate){': ' + where if where else ''}", param) from None
    return value


def _flag(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"`{key}` must be a boolean: {shown(value)}", key)
    return value


def _valid_unicode(body: dict) -> None:
    """Text that cannot be encoded (a lone surrogate such as `\\ud800`) is refused before any template or tokenizer sees it."""
    for key in ("messages", "tools", "tool_choice", "chat_template_kwargs", "response_format"):
        try:
            json.dumps(body.get(key), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request(f"`{key}` holds text that is not valid Unicode (a lone surrogate)", key) from None


def _tokenize(make, param: str) -> list[int]:
    # The tokenizer and the chat template are third-party code fed client text; whatever they
    # refuse (a template's `raise_exception`, an input type they reject) is the client's to fix.
    try:
        return make()
    except Exception as e:
        raise bad_request(f"`{param}` cannot be tokenized: {type(e).__name__}: {shown(str(e))}", param) from None


def request_class(body: dict, header: str | None, config: WorkerConfig) -> str:
    """The class whose depth a request drafts at and whose series it counts in: its own (`mtpstack_class`,
    else `X-Mtpstack-Class`), else the classifier's. A class the map does not list counts as `default`
    (so clients cannot mint metric series), except the classifier's own `code` and `prose`."""
    named = body.get(CLASS_FIELD)
    param = CLASS_FIELD
    if named is None and header is not None:
        named, param = header, CLASS_HEADER
    if named is not None:
        if not isinstance(named, str) or not CLASS_PATTERN.fullmatch(named):
            raise bad_request(f"`{param}` must be a class name of letters, digits, `_`, `.` and `-`: {shown(named)}", param)
    cls = named if named is not None else classify_request(body)
    return cls if cls in config.draft_depth_map or cls in (CODE, PROSE) else "default"


def _checked_model(body, config: WorkerConfig) -> None:
    if not isinstance(body, dict):
        raise bad_request(NOT_AN_OBJECT)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"`model` must be a string: {shown(model)}", "model")
    if model is not None and model != config.served_model_name:
        raise model_not_found(config.served_model_name, model)


def count_prompt(body, engine, config: WorkerConfig) -> int:
    """The tokens a chat request's prompt renders to (its messages, tools and thinking switch), as
    `parse_request` renders it, whether or not it fits the context."""
    _checked_model(body, config)
    _valid_unicode(body)
    try:
        return len(prepare(body, "chat", engine).prompt)
    except ProtocolError as e:
        raise ApiError(400, e.code, e.message, e.param) from None


def _choices(body: dict, config: WorkerConfig) -> int:
    """`n` (each choice a row of the batch, so at most its width), `best_of` 1, and no field this worker
    does not serve."""
    n = _number(body, "n", int, 1, MAX_COUNT) or 1
    if n > config.max_num_seqs:
        raise _unsupported(f"`n` may be at most this worker's batch width ({config.max_num_seqs}): each choice is a row "
                           f"of the batch: {n}", "n")
    best_of = _number(body, "best_of", int, 1, MAX_COUNT)
    if best_of not in (None, 1):
        raise _unsupported(f"only best_of=1 is supported: {best_of!r}", "best_of")
    for key in UNSUPPORTED_IF_SET:
        if body.get(key) not in (None, False, [], 0, ""):
            raise _unsupported(f"this worker does not support `{key}`", key)
    return n


def _completion_prompt(body: dict, engine) -> list[int]:
    """A completion's `prompt`: one string (alone or in a list of one), or a list of token ids."""
    raw = body.get("prompt")
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    if isinstance(raw, str):
        text = _text(raw, "prompt")
        return _tokenize(lambda: engine.text_prompt(text), "prompt")
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return [int(t) for t in raw]
    if isinstance(raw, list) and len(raw) > 1 and all(isinstance(t, (str, list)) for t in raw):
        raise _unsupported("only one prompt per request is supported", "prompt")
    raise bad_request("`prompt` must be a string or a list of token ids", "prompt")


def _checked_prompt(prompt: list[int], engine, prompt_key: str) -> None:
    if not prompt:
        raise bad_request("the prompt is empty", prompt_key)
    vocab = engine.vocab_size
    low, high = min(prompt), max(prompt)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise bad_request(f"token id {shown(bad)} is outside the vocabulary: ids run from 0 to {vocab - 1}", prompt_key)


def _max_tokens(body: dict, kind: str, engine, config: WorkerConfig, prompt: list[int], prompt_key: str) -> int:
    max_key = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, max_key, int, 1, MAX_COUNT)
    if max_tokens is None:
        max_tokens = config.default_max_tokens
    ctx = engine.context_length
    if ctx is None:
        return max_tokens
    # `max_tokens` is a cap, not a demand: clients send their own ceiling whatever the model
    # (Claude Code and opencode send 32,000), so it is cut to the room the prompt leaves and the
    # answer ends with `finish_reason: "length"` there. Only a prompt that leaves no room is refused.
    if len(prompt) >= ctx:
        capped = config.max_context_tokens is not None and ctx == config.max_context_tokens
        raise ContextExceeded(len(prompt), ctx, prompt_key, capped)
    return min(max_tokens, ctx - len(prompt))


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
        raise bad_request("`stop` must be a string or a list of up to 4 strings", "stop")
    return [_text(s, "stop") for s in stop if s]


def _streaming(body: dict) -> tuple[bool, bool]:
    """`stream`, and `stream_options.include_usage`."""
    stream = _flag(body, "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad_request("`stream_options` must be an object", "stream_options")
    include_usage = opts.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad_request(f"`stream_options.include_usage` must be a boolean: {shown(include_usage)}", "stream_options")
    return stream, bool(include_usage)


def _depth(body: dict, cls: str, engine, config: WorkerConfig) -> tuple[int, bool]:
    """The request's depth and whether the worker's policy chooses it: its class's depth, lowered (never
    raised) by `num_draft_tokens`. `auto`: the policy picks each step's depth up to `--draft-max-depth`; a
    request's own `num_draft_tokens` is a fixed depth, as it is beside an integer."""
    depth_req = _number(body, "num_draft_tokens", int, 0, MAX_COUNT)
    configured = config.depth_for(cls)
    auto = configured == DEPTH_AUTO and depth_req is None
    class_depth = min(config.draft_max_depth if configured == DEPTH_AUTO else configured, engine.draft_depth)
    return (class_depth if depth_req is None else min(depth_req, class_depth)), auto


def parse_request(body, kind: str, engine, config: WorkerConfig, class_header: str | None = None) -> ParsedRequest:
    """Every field checked before anything reaches mlx: a token id past the vocabulary crashes
    the process, an out-of-range seed or a NaN reaches native code; each refusal names its field."""
    from mtpstack.worker.sequence import SamplingParams

    _checked_model(body, config)
    n = _choices(body, config)
    _valid_unicode(body)
    try:
        agent = prepare(body, kind, engine)
    except ProtocolError as e:
        raise ApiError(400, e.code, e.message, e.param) from None
    prompt = agent.prompt if kind == "chat" else _completion_prompt(body, engine)
    prompt_key = "messages" if kind == "chat" else "prompt"
    _checked_prompt(prompt, engine, prompt_key)
    max_tokens = _max_tokens(body, kind, engine, config, prompt, prompt_key)
    agent.fit(max_tokens)

    temperature = _number(body, "temperature", float, 0, 2)
    top_p = _number(body, "top_p", float, 0, 1)
    seed = _number(body, "seed", int, 0, SEED_LIMIT - 1)
    stop = _stops(body)
    stream, include_usage = _streaming(body)
    ignore_eos = _flag(body, "ignore_eos")
    cls = request_class(body, class_header, config)
    depth, auto = _depth(body, cls, engine, config)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0 if temperature is None else temperature,
        top_p=1.0 if not top_p else top_p,
        seed=seed,
        depth=depth,
        auto=auto,
        stop=stop,
        ignore_eos=ignore_eos,
    )
    return ParsedRequest(kind, prompt, params, stream, include_usage, agent, cls=cls, n=n)
