"""The workloads the benches send (`mtpstack.bench.workloads`): the fleet bench's agent sessions, seeded
and repeatable, and the fixed-turn agent conversation's system prompt."""

from __future__ import annotations

import json

from mtpstack.bench import workloads as wl

SIZES = {"sessions": 4, "turns": (3, 5), "output_tokens": (200, 2000), "arrival_s": 5.0, "think_s": (1.0, 4.0)}


def chars_per_4(text: str) -> int:
    """A stand-in tokenizer: a token every 4 characters."""
    return max(1, len(text) // 4)


def test_one_seed_makes_the_same_workload_and_another_seed_another():
    a, b, c = wl.make_workload(7, SIZES), wl.make_workload(7, SIZES), wl.make_workload(8, SIZES)
    dump = lambda w: json.dumps([(s.arrival_s, [(t.think_s, t.messages) for t in s.turns]) for s in w])  # noqa: E731
    assert dump(a) == dump(b)
    assert dump(a) != dump(c)


def test_sessions_arrive_over_time_with_several_turns_each_and_think_time_between_turns():
    sessions = wl.make_workload(0, SIZES)
    assert len(sessions) == 4
    arrivals = [s.arrival_s for s in sessions]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals) and arrivals[-1] > 0
    for s in sessions:
        assert 3 <= len(s.turns) <= 5
        assert s.turns[0].think_s == 0
        assert all(SIZES["think_s"][0] <= t.think_s <= SIZES["think_s"][1] for t in s.turns[1:])


def test_each_turn_resends_the_whole_conversation_with_a_tool_call_and_its_result_appended():
    session = wl.make_workload(0, SIZES)[1]
    for before, after in zip(session.turns, session.turns[1:]):
        assert after.messages[: len(before.messages)] == before.messages  # a prefix to reuse
        call, result = after.messages[len(before.messages):]
        assert call["role"] == "assistant" and call["content"] is None
        (tool_call,) = call["tool_calls"]
        assert tool_call["function"]["name"] in {t["function"]["name"] for t in wl.TOOLS}
        json.loads(tool_call["function"]["arguments"])  # arguments as the API sends them: a JSON string
        assert result == {"role": "tool", "tool_call_id": tool_call["id"], "content": result["content"]}
    first = session.turns[0].messages
    assert [m["role"] for m in first] == ["system", "user"]


def test_sessions_share_the_system_prompt_and_differ_right_after_it():
    sessions = wl.make_workload(0, SIZES)
    systems = {s.turns[0].messages[0]["content"] for s in sessions}
    tasks = {s.turns[0].messages[1]["content"] for s in sessions}
    assert systems == {wl.SYSTEM} and len(tasks) == len(sessions)


def test_tool_outputs_have_the_token_counts_asked_for_at_the_calibrated_rate():
    small = {**SIZES, "output_tokens": (200, 300), "sessions": 6}
    rate = wl.calibrate(chars_per_4, 0, small)
    assert 3.9 < rate < 4.1
    outputs = wl.tool_outputs(wl.make_workload(0, small, rate))
    tokens = [chars_per_4(o) for o in outputs]
    assert len(outputs) >= 6 and min(tokens) >= 195 and max(tokens) <= 330


def test_tool_outputs_look_like_file_contents_test_runs_searches_and_diffs():
    outputs = "\n".join(wl.tool_outputs(wl.make_workload(0, {**SIZES, "sessions": 6})))
    assert "     1\t\"\"\"" in outputs  # a numbered file
    assert "test session starts" in outputs and "short test summary info" in outputs
    assert "diff --git a/src/" in outputs and "\n@@ -" in outputs
    assert ".py:" in outputs  # search hits


def test_the_system_prompt_carries_its_round_first_and_one_line_per_tool():
    a, b = wl.system_prompt(1, 3), wl.system_prompt(2, 3)
    assert a.splitlines()[0].startswith("Session 1.") and a.splitlines()[1:] == b.splitlines()[1:]
    assert len(a.splitlines()) == 4 and len(wl.system_prompt(1, 40).splitlines()) == 41


def test_a_conversation_resends_itself_each_turn_with_every_answer_as_the_assistant_turn():
    system = wl.system_prompt(0, 40)
    s = wl.conversation(2, system, wl.first_question(2), 3)
    messages, sent = [], []
    for turn, answer in zip(s.turns, ["", "a1", "a2"]):
        messages = wl.turn_messages(messages, turn, answer)
        sent.append(messages)
    first, third = sent[0], sent[2]
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[: len(first)] == first  # the next turn begins with the previous one: a prefix to reuse
    assert [m["content"] for m in third if m["role"] == "assistant"] == ["a1", "a2"]
    assert [m["content"] for m in third if m["role"] == "user"][1:] == wl.FOLLOW_UPS[:2]
    other = wl.conversation(1, system, wl.first_question(1), 3)
    assert other.turns[0].messages[0] == first[0] and other.turns[0].messages[1] != first[1]  # one agent, each its own task


def test_tool_output_lengthens_each_follow_up_with_lines_of_its_own_conversation_and_turn():
    plain = wl.conversation(1, "s", "q", 3)
    long = wl.conversation(1, "s", "q", 3, output_lines=5)
    assert long.turns[0].messages == plain.turns[0].messages  # the beginning is the same conversation
    assert long.turns[1].follow_up.endswith("\n\n" + plain.turns[1].follow_up) and long.turns[1].follow_up.count("\n") == 4 + 2
    assert long.turns[1].follow_up.split("\n\n")[0] != long.turns[2].follow_up.split("\n\n")[0]
    assert wl.tool_output(1, 2, 3) != wl.tool_output(2, 2, 3)


def test_tool_pauses_are_the_same_in_every_run_of_a_round_and_none_before_turn_1():
    assert wl.tool_pause(1.0, 0, 2, 3) == wl.tool_pause(1.0, 0, 2, 3)
    assert wl.tool_pause(1.0, 0, 2, 3) != wl.tool_pause(1.0, 1, 2, 3)
    assert wl.tool_pause(1.0, 0, 2, 1) == 0.0 and wl.tool_pause(0.0, 0, 2, 3) == 0.0
    assert all(0 <= wl.tool_pause(0.5, r, c, 2) <= 1.0 for r in range(5) for c in range(4))
    assert [t.think_s for t in wl.conversation(2, "s", "q", 3, pause=1.0, rnd=0).turns] == [0.0, *(wl.tool_pause(1.0, 0, 2, t) for t in (2, 3))]
