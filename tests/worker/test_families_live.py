"""Each served MTP family as a real worker process: healthy, its head's family in /identity's drafter, greedy
text equal to the same worker without the head, and the acceptance interface (usage and metrics) intact."""

from __future__ import annotations

import pytest

from tests.mlx_support import QUANTIZED_MOE_REASON, QUANTIZED_MOE_RUNS

PAIRS = {"qwen3_5_moe": ("moe_pair", "quantized"), "qwen3_next": ("next_pair", "bundled"),
         "nemotron_h": ("nemotron_pair", "standalone"), "glm4_moe_lite": ("glm_pair", "bundled")}
BODY = {"model": "tiny", "prompt": "def main():", "max_tokens": 24, "temperature": 0}


@pytest.mark.parametrize("family", sorted(PAIRS))
def test_a_worker_serves_the_family_losslessly_with_its_acceptance_figures(request, live_worker, family):
    fixture, layout = PAIRS[family]
    if layout == "quantized" and not QUANTIZED_MOE_RUNS:
        pytest.skip(QUANTIZED_MOE_REASON)
    target, head = request.getfixturevalue(fixture)(layout)
    with live_worker(target, head, depth=3, width=2) as w:
        identity = w.get_json("/identity")
        status, _, with_head = w.post_json("/v1/completions", BODY)
        metrics = w.get_text("/metrics")
    with live_worker(target, None, width=1) as plain:
        _, _, without = plain.post_json("/v1/completions", BODY)
    assert status == 200
    assert identity["drafter"]["kind"] == "mtp" and identity["drafter"]["bundled"] == (layout == "bundled")
    assert identity["drafter"]["family"] == {"qwen3_5_moe": "qwen3_5_mtp", "qwen3_next": "qwen3_5_mtp"}.get(family, f"{family}_mtp")
    assert with_head["choices"][0]["text"] == without["choices"][0]["text"]
    usage = with_head["usage"]
    assert 0 < usage["accepted_draft_tokens"] <= usage["draft_tokens"]
    drafted = next(float(line.split()[1]) for line in metrics.splitlines() if line.startswith("mtpstack_worker_tokens_drafted_total "))
    assert drafted == usage["draft_tokens"]
