"""The OpenAI-compatible protocol beyond plain text: tool calls, reasoning, logprobs, constrained
output and the Responses API. `mtpstack.worker.parsing`, `.handlers` and `.answers` wire these in;
nothing here touches mlx except `mtpstack.worker.protocol.hooks`, which runs in the generation thread."""
