"""`maxContextTokens` (`--max-context-tokens`): a real worker refuses what would run past the cap."""

from __future__ import annotations

import subprocess
import sys

CAP = 64
PROMPT = [1] * 50


def completion(worker, **body):
    return worker.post_json("/v1/completions", {"model": "tiny", "prompt": PROMPT, "temperature": 0, **body})


def test_a_worker_capped_below_the_model_refuses_beyond_the_cap_and_serves_within_it(tiny_pair, live_worker):
    with live_worker(*tiny_pair, width=1, max_context_tokens=CAP) as w:
        assert w.argv[w.argv.index("--max-context-tokens") + 1] == str(CAP)
        ident = w.get_json("/identity")
        assert (ident["context_length"], ident["max_context_tokens"]) == (CAP, CAP)

        status, _, body = completion(w, max_tokens=CAP - len(PROMPT) + 1)
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert body["error"]["param"] == "max_tokens"
        assert f"{CAP} tokens" in body["error"]["message"] and "--max-context-tokens" in body["error"]["message"]

        status, _, body = w.post_json("/v1/completions", {"model": "tiny", "prompt": [1] * CAP})
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert f"{CAP} tokens" in body["error"]["message"]

        status, _, body = completion(w, max_tokens=CAP - len(PROMPT), ignore_eos=True)
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] <= CAP
        # without max_tokens the default is cut to the room left under the cap
        status, _, body = completion(w, ignore_eos=True)
        assert status == 200, body
        assert body["usage"]["completion_tokens"] <= CAP - len(PROMPT)


def test_a_cap_above_the_models_maximum_leaves_the_models_maximum(tiny_pair, live_worker):
    with live_worker(*tiny_pair, width=1) as plain:
        own = plain.get_json("/identity")["context_length"]
        assert plain.get_json("/identity")["max_context_tokens"] is None
    assert own is not None and own > CAP
    with live_worker(*tiny_pair, width=1, max_context_tokens=own * 4) as w:
        ident = w.get_json("/identity")
        assert (ident["context_length"], ident["max_context_tokens"]) == (own, own * 4)


def test_a_non_positive_cap_is_refused_before_loading():
    run = subprocess.run(
        [sys.executable, "-m", "mtpstack", "worker", "--model", "/nonexistent", "--max-context-tokens", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 1
    assert "`--max-context-tokens` must be at least 1: 0" in run.stderr
