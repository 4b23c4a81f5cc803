"""The API endpoints the fleet serves, declared once: the worker routes each row to its handler
(`mtpstack.worker.server`, `mtpstack.worker.handlers`), the proxy admits and forwards each row's path
(`mtpstack.proxy.app`) and keys its routing by the row's prompt units (`mtpstack.proxy.routing`),
and both services answer a row's refusals in the shape of its API family (`mtpstack.refusals`).

A new API surface is rows here (its paths), its handlers in the worker (`handlers.SURFACES` for one
that generates), its prompt units in `proxy.routing.UNITS`, and, for a new family, its error shape
in `mtpstack.refusals`. Other routes (`/v1/models`, `/health`, `/metrics`, ...) are each service's own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    """One `POST` path that takes a prompt: answered by a worker, forwarded by the proxy."""

    path: str
    #: The API its body speaks: the worker's handler (`chat`, `completions`, `responses`, `messages`).
    api: str
    #: What it is called where the proxy refuses it for a backend that lacks it.
    title: str
    #: How the proxy cuts its prompt into units for cache-aware routing (`proxy.routing.UNITS`):
    #: `messages` (chat `messages`), `responses` (`instructions`, then `input`), `prompt` (completion text),
    #: `anthropic` (`system`, then `messages`).
    units: str
    #: Whose error shape its refusals take (`mtpstack.refusals.ERROR_BODIES`).
    family: str = "openai"
    #: Served by the native worker only: `mlx_lm.server` 0.32 lacks it (it would answer 404).
    native_only: bool = False
    #: Takes `n` choices, each a row of the worker's batch (and so a slot of its gate).
    choices: bool = True
    #: Generates, and so takes a slot of the worker's gate; one that does not (counting a prompt's
    #: tokens) is relayed without admission: it must not wait in the queue behind generations.
    generates: bool = True

    @property
    def final_events(self) -> tuple[bytes, ...]:
        """How a stream of its API ends: `FINAL_EVENTS`."""
        return FINAL_EVENTS[self.api]


#: How each API's stream ends, by the first bytes of the events after which its client has the whole
#: answer and stops reading (OpenAI's SDKs at `[DONE]`, Codex at `response.completed`, Claude Code at
#: `message_stop`; each at an error event, on which they raise). The worker ends its streams so
#: (`mtpstack.worker.answers`, `mtpstack.refusals.stream_error`), and the proxy counts a stream whose
#: final event went out as answered even if its client left before the worker's stream ended
#: (`mtpstack.proxy.relay`). `[DONE]` ends a Responses stream too on servers that add it after
#: `response.completed`.
FINAL_EVENTS: dict[str, tuple[bytes, ...]] = {
    "chat": (b"data: [DONE]", b'data: {"error"'),
    "completions": (b"data: [DONE]", b'data: {"error"'),
    "responses": (b"event: response.completed", b"event: response.incomplete", b"event: response.failed", b"event: error",
                  b"data: [DONE]"),
    "messages": (b"event: message_stop", b"event: error"),
}


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("/v1/chat/completions", "chat", "Chat Completions API", units="messages"),
    Endpoint("/v1/completions", "completions", "Completions API", units="prompt"),
    Endpoint("/v1/responses", "responses", "Responses API", units="responses", native_only=True, choices=False),
    Endpoint("/v1/messages", "messages", "Anthropic Messages API", units="anthropic", family="anthropic",
             native_only=True, choices=False),
    Endpoint("/v1/messages/count_tokens", "messages", "Anthropic Messages API", units="anthropic",
             family="anthropic", native_only=True, choices=False, generates=False),
)
#: Paths clients probe for reachability before their first request (Claude Code sends `HEAD /api/hello`
#: at start, other tools `HEAD /`): both services answer them 200 `{"status": "ok"}`, as the proxy's
#: `/healthz`, never a 404 in their logs.
REACHABILITY_PATHS: tuple[str, ...] = ("/", "/api/hello")
#: The rows by path.
BY_PATH: dict[str, Endpoint] = {e.path: e for e in ENDPOINTS}


def family_of(path: str) -> str:
    """The API family whose error shape a refusal on `path` takes; OpenAI's for any other path."""
    endpoint = BY_PATH.get(path)
    return endpoint.family if endpoint is not None else "openai"
