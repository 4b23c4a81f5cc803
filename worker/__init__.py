"""The mtpstack worker: one target model and its MTP drafter behind the OpenAI API.

Layout:
- Starting and proving: `launcher` (how any component starts a worker; the process itself is
  run by `mtpstack.runtime`), `proof` (what weights a running process loaded), `cli` (`mtpstack worker`,
  `mtpstack weights`).
- Decoding (mlx): `engine` (batched speculative decoding on mlx-lm, and its `Scheduler`),
  `drafting` (the two kinds of drafter), `mtp/` (MTP heads, one module per family), `caches`
  (batch state with per-row rollback), `demo/` (the shipped demo pair).
- Serving: `config` (the worker's settings), `server` (the aiohttp app and `serve`), `handlers`
  (the routes and admission), `requests` (a request checked and parsed), `answers` (a generation
  written out as JSON, a stream, or Responses), `sse` (the one event framing), `http` (the request id
  and the OpenAI error shape), `generation` (the generation thread and its bridge to the event
  loop), `metrics` (`/metrics`), `identity` (`/identity`), `classify` (a request's workload class),
  `protocol/` (tool calls, reasoning, logprobs, constrained output, the Responses API).
"""
