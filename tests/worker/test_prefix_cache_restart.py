"""The prefix cache's disk tier in a real worker: a restarted worker resumes its conversations from disk."""

from __future__ import annotations

import os
import signal

import openai
import pytest

from mtpstack.proxy.prometheus import unlabelled
from mtpstack.series import (PREFIX_CACHE_DISK_BYTES, PREFIX_CACHE_DISK_ERRORS, PREFIX_CACHE_DISK_HITS,
                             PREFIX_CACHE_DISK_WRITES)

SYSTEM = "You are a coding agent. Tools: read_file(path), write_file(path, text), run(cmd). " * 6
DISK = [PREFIX_CACHE_DISK_HITS, PREFIX_CACHE_DISK_WRITES, PREFIX_CACHE_DISK_ERRORS, PREFIX_CACHE_DISK_BYTES]


def chat(url: str, messages: list[dict]):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    return client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_a_restarted_worker_resumes_the_next_turn_from_disk_with_the_same_text(live_worker, hybrid_pair, tmp_path, stop):
    cache = tmp_path / "prefix-cache"
    first_turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "list the files"}]
    with live_worker(*hybrid_pair, depth=3, width=2, prefix_cache_dir=cache) as w:
        identity = w.get_json("/identity")["prefix_cache"]
        assert identity["dir"] == str(cache) and identity["disk_gib"] == 32 and identity["id"]
        answer = chat(w.url, first_turn)
        if stop == "SIGKILL":  # the writes are behind the answer: give them a moment before the crash
            import time

            deadline = time.monotonic() + 10
            while unlabelled(w.get_text("/metrics"), DISK)[PREFIX_CACHE_DISK_WRITES] < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            os.kill(w.proc.pid, signal.SIGKILL)
    next_turn = first_turn + [{"role": "assistant", "content": answer.choices[0].message.content},
                              {"role": "user", "content": "open a.py"}]
    with live_worker(*hybrid_pair, depth=3, width=2, prefix_cache_dir=cache) as w:
        assert w.get_json("/identity")["prefix_cache"]["id"] == identity["id"]  # the same cache, another process
        second = chat(w.url, next_turn)
        metrics = unlabelled(w.get_text("/metrics"), DISK)
    assert second.usage.prompt_tokens_details.cached_tokens >= answer.usage.prompt_tokens - 16 > 0
    assert metrics[PREFIX_CACHE_DISK_HITS] == 1 and metrics[PREFIX_CACHE_DISK_ERRORS] == 0 and metrics[PREFIX_CACHE_DISK_BYTES] > 0
    with live_worker(*hybrid_pair, depth=3, width=2, prefix_cache_gib=0) as plain:
        assert second.choices[0].message.content == chat(plain.url, next_turn).choices[0].message.content
