"""The mtpstack worker: one target model and its MTP drafter behind the OpenAI API.

Layout: `launcher` (how any component starts a worker), `proof` (what weights a running process loaded), `engine`
(per-sequence speculative decoding on mlx-lm), `scheduler` (the generation
loop's seam), `server` (aiohttp HTTP API), `cli` (`mtpstack worker`,
`mtpstack weights`).
"""
