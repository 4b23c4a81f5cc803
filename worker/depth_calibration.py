"""The adaptive draft depth's calibration: the seconds of a verify step at each width and depth, measured
on this machine before the first request (`--draft-depth auto`, `mtpstack.worker.depth_policy`)."""

from __future__ import annotations

import logging
import statistics
import time

from mtpstack.worker.depth_policy import StepCosts
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import SamplingParams

log = logging.getLogger("mtpstack.worker")

#: Calibration: rounds over every depth before timing, rounds timed, and steps timed per depth and round.
CALIBRATION_WARMUP = 1
CALIBRATION_ROUNDS = 2
CALIBRATION_STEPS = 3
#: The calibration's prompt: long enough that the steps attend to a context, short enough to cost nothing.
CALIBRATION_PROMPT = 64
CALIBRATION_TEXT = "A few steps to time each draft depth on this machine before the first request. "


def calibrate(engine, max_width: int, max_depth: int, clock=time.perf_counter) -> StepCosts:
    """Time a verify step at every depth 0..max_depth, at width 1 and at `max_width`: a fresh batch of
    synthetic rows per width (no prefix cache, so nothing of it stays), its depths taken in turn so
    that a drift of the machine's speed spreads over all of them, the median of each. A few seconds at
    start on a real target; the live steps keep the table current after."""
    costs = StepCosts(max_width, max_depth)
    depths = list(range(max_depth + 1 if engine.drafter is not None else 1))
    prompt = (engine.text_prompt(CALIBRATION_TEXT * 8) or [0])[:CALIBRATION_PROMPT]
    rounds = CALIBRATION_WARMUP + CALIBRATION_ROUNDS
    started = clock()
    for width in sorted({1, max_width}):
        sched = Scheduler(width)
        budget = rounds * (1 + CALIBRATION_STEPS) * sum(d + 1 for d in depths) + 8
        seqs = [engine.new_sequence(prompt, SamplingParams(max_tokens=budget, depth=max(depths), ignore_eos=True))
                for _ in range(width)]
        for seq in seqs:
            sched.add(seq)
        while sched.active and len(sched.batch.rows) < width:
            sched.step()
        times: dict[int, list[float]] = {d: [] for d in depths}
        for i in range(rounds):
            for depth in depths:
                for seq in seqs:
                    seq.params.depth = depth
                # A step's time includes what the step before left running (its states, evaluated
                # asynchronously): one step settles the change of depth, the next ones are this depth's own.
                for j in range(1 + CALIBRATION_STEPS):
                    before = sched.decode_seconds
                    sched.step()
                    if i >= CALIBRATION_WARMUP and j:
                        times[depth].append(sched.decode_seconds - before)
        for seq in seqs:
            seq.cancel()
        for depth, seconds in times.items():
            if seconds:
                costs.seed(width, depth, statistics.median(seconds))
    log.info("draft depth auto: step costs measured in %.2f s: %s", clock() - started,
             ", ".join(f"w{w} d{d} {s * 1e3:.1f} ms" for (w, d), s in sorted(costs.cells.items())))
    return costs
