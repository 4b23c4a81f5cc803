"""The mtpstack worker: one target model and its MTP drafter behind the OpenAI API.

Layout:
- Starting and proving: `launcher` (how any component starts a worker; the process itself is
  run by `mtpstack.runtime`), `proof` (what weights a running process loaded), `cli` (`mtpstack worker`,
  `mtpstack weights`).
- Decoding (mlx): `loading` (the models loaded and checked, `Engine`, `build_engine`), `sequence`
  (one request's state), `batch` (the decoding batch's draft-and-verify and the prefill batch),
  `scheduler` (which rows run each step), `snapshots` (the prefill's copies to and from the prefix
  cache), `prefix_cache`, `drafting` (the two kinds of drafter), `mtp/` (MTP heads, one module per
  family), `caches` (batch state with per-row rollback), `demo/` (the shipped demo pair).
- Serving: `config` (the worker's settings), `server` (the aiohttp app and `serve`), `handlers`
  (the routes and admission), `parsing` (a request checked and parsed), `answers` (a generation
  written out as JSON, a stream, or Responses), `sse` (the one event framing), `http` (the request id
  and the error shape, `mtpstack.refusals`), `generation` (the generation thread and its bridge to the event
  loop), `metrics` (`/metrics`), `identity` (`/identity`), `classify` (a request's workload class),
  `protocol/` (tool calls, reasoning, logprobs, constrained output, the Responses API).
"""
