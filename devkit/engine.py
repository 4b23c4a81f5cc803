"""Driving the worker's engine by hand, for tests, benchmarks and the demo tooling (the server runs a
`Scheduler` in its generation thread instead): one sequence stepped alone, a chat prompt tokenized."""

from __future__ import annotations

import weakref

from mtpstack.worker.protocol.chat import template_prompt
from mtpstack.worker.scheduler import Scheduler
from mtpstack.worker.sequence import Sequence, StepResult

#: Each sequence stepped alone has a one-row scheduler of its own.
_SOLO: weakref.WeakKeyDictionary[Sequence, Scheduler] = weakref.WeakKeyDictionary()


def step(seq: Sequence) -> StepResult:
    """Advance `seq` alone by one step (a one-row scheduler of its own); its error is raised."""
    sched = _SOLO.get(seq)
    if sched is None:
        sched = _SOLO[seq] = Scheduler(1)
        sched.add(seq)
    for other, result, error in sched.step():
        if error is not None:
            raise error
        if other is seq and result is not None:
            return result
    return StepResult()


def run(seq: Sequence) -> Sequence:
    """`seq` stepped alone until it finishes."""
    while not seq.finished:
        step(seq)
    return seq


def chat_prompt(engine, messages: list[dict]) -> list[int]:
    """The target's chat template applied to `messages`, with the generation prompt, as the server applies it."""
    return template_prompt(engine.tokenizer, messages)
