"""A sequence that fails inside generation ends only its own request: a 500 `generation_failed`
before the first byte, an SSE error event after it, either way with the request's id, while the
worker keeps serving the others. The worker runs in-process (real aiohttp, real mlx, the tiny pair);
the failure is injected from the test at the server's seam, `Scheduler.step()`'s per-sequence
`(seq, result, exc)` results, keyed on the request's seed, so it does not depend on how the engine
steps or batches."""

from __future__ import annotations

import asyncio
import json

import pytest

from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.server import create_app

#: Seeds the injected fault keys on: fail at the first step, or once 3 tokens are out.
FAIL_AT_ONCE, FAIL_LATER = 666, 667


@pytest.fixture
async def client(tiny_pair, aiohttp_client, monkeypatch):
    real_step = Scheduler.step

    def step(self):
        out = []
        for seq, result, error in real_step(self):
            seed = seq.params.seed
            if error is None and not seq.cancelled and (seed == FAIL_AT_ONCE or (seed == FAIL_LATER and len(seq.tokens) >= 3)):
                # What the scheduler does with a sequence whose step raised.
                seq.finish_reason = "error"
                if seq in self.active:
                    self.active.remove(seq)
                result, error = None, RuntimeError("injected fault")
            out.append((seq, result, error))
        return out

    monkeypatch.setattr(Scheduler, "step", step)
    target, drafter = tiny_pair
    config = WorkerConfig(model=str(target), draft_model=str(drafter), draft_depth=2, max_num_seqs=2, served_model_name="tiny")
    client = await aiohttp_client(create_app(config))

    async def ready():
        while (await client.get("/health")).status != 200:
            await asyncio.sleep(0.05)

    await asyncio.wait_for(ready(), 60)
    return client


async def _stream_events(resp) -> list[dict | str]:
    events = []
    async for line in resp.content:
        if line.startswith(b"data: [DONE]"):
            events.append("[DONE]")
        elif line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
    return events


async def test_a_failure_before_the_first_byte_is_a_500_with_the_request_id(client):
    body = {"prompt": "def main():", "max_tokens": 10, "seed": FAIL_AT_ONCE}
    async with client.post("/v1/completions", json=body, headers={"X-Request-Id": "rid-early"}) as r:
        assert r.status == 500
        assert r.headers["X-Request-Id"] == "rid-early"
        error = (await r.json())["error"]
    assert error["code"] == "generation_failed" and "rid-early" in error["message"]


async def test_a_failure_mid_stream_ends_that_stream_with_an_error_event_and_the_other_finishes(client):
    healthy = {"prompt": "import os\n", "max_tokens": 30, "ignore_eos": True, "stream": True, "seed": 1}
    failing = {**healthy, "seed": FAIL_LATER}

    async def run(body, rid):
        async with client.post("/v1/completions", json=body, headers={"X-Request-Id": rid}) as r:
            assert r.status == 200 and r.headers["X-Request-Id"] == rid
            return await asyncio.wait_for(_stream_events(r), 60)

    good, bad = await asyncio.gather(run(healthy, "rid-good"), run(failing, "rid-bad"))
    assert good[-1] == "[DONE]" and not any("error" in e for e in good if isinstance(e, dict))
    assert sum(1 for e in good if isinstance(e, dict) and e["choices"]) >= 2
    texts = [e for e in bad if isinstance(e, dict) and "choices" in e and e["choices"][0]["text"]]
    errors = [e["error"] for e in bad if isinstance(e, dict) and "error" in e]
    assert texts, "the failing stream should have sent tokens before its fault"
    assert len(errors) == 1 and errors[0]["code"] == "generation_failed" and "rid-bad" in errors[0]["message"]


async def test_after_failures_the_worker_is_healthy_with_every_slot_free_and_serves_on(client):
    for seed in (FAIL_AT_ONCE, FAIL_LATER):
        async with client.post("/v1/completions", json={"prompt": "x", "max_tokens": 8, "ignore_eos": True, "seed": seed}) as r:
            assert r.status == 500
    async with client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4}) as r:
        assert r.status == 200

    async def idle():  # the generation thread counts a finished sequence out within one loop turn
        while True:
            async with client.get("/health") as r:
                if r.status == 200 and (await r.json())["active"] == 0:
                    return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(idle(), 10)
