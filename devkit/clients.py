"""The client matrix's cells: each client library's typical use, run against one OpenAI-compatible URL
(which also serves Anthropic's Messages API: the `anthropic` cells).

Runs in its own virtualenv (`.venv-clients`, from `requirements-clients.lock`: the client libraries
pin `openai` versions of their own, apart from the worker's), so it imports only the clients and
the standard library, never mtpstack:

    .venv-clients/bin/python devkit/clients.py --base-url http://127.0.0.1:8080/v1 --model demo

It prints one JSON object: `versions` (each client's, as installed) and `cells`, a list of
`{client, feature, ok, detail}`. A cell passes when the client returns what its user would use
(a parsed call, a validated object, streamed text); `detail` says what failed. Every call is
greedy and bounded (`MAX_TOKENS`), with no retries, so a cell fails rather than hides a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import traceback
from importlib import metadata
from typing import Callable

from pydantic import BaseModel, Field

MAX_TOKENS = 160
CLIENTS = ("openai", "openai-agents", "instructor", "langchain-openai", "pydantic-ai-slim", "anthropic")
QUESTION = "What is the weather in Paris?"


class City(BaseModel):
    name: str = Field(max_length=12)
    population: int


def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "The weather in a city.",
                  "input_schema": WEATHER_TOOL["function"]["parameters"]}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                  "parameters": WEATHER_TOOL["function"]["parameters"]}


def _check(condition, detail: str) -> None:
    if not condition:
        raise AssertionError(detail)


# -- openai ----------------------------------------------------------------------------------
def openai_cells(base: str, model: str) -> dict[str, Callable[[], str]]:
    import openai

    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
    kw = dict(model=model, temperature=0)

    def chat():
        r = client.chat.completions.create(messages=[{"role": "user", "content": "Hello"}], max_tokens=16, **kw)
        _check(r.choices[0].message.content or getattr(r.choices[0].message, "reasoning", None), f"no text: {r}")
        return r.choices[0].finish_reason

    def stream():
        parts = [c.choices[0].delta for c in client.chat.completions.create(
            messages=[{"role": "user", "content": "Hello"}], max_tokens=16, stream=True, **kw) if c.choices]
        _check(parts, "no chunks")
        return f"{len(parts)} chunks"

    def forced_tool_round_trip():
        ask = [{"role": "user", "content": QUESTION}]
        r = client.chat.completions.create(messages=ask, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=MAX_TOKENS, **kw)
        [call] = r.choices[0].message.tool_calls
        _check(set(json.loads(call.function.arguments)) == {"city"}, f"arguments: {call.function.arguments}")
        history = ask + [r.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": get_weather(**json.loads(call.function.arguments))}]
        again = client.chat.completions.create(messages=history, tools=[WEATHER_TOOL], max_tokens=16, **kw)
        return again.choices[0].finish_reason

    def parse_strict():
        r = client.chat.completions.parse(messages=[{"role": "user", "content": "Name a city."}], response_format=City,
                                          max_tokens=MAX_TOKENS, **kw)
        _check(isinstance(r.choices[0].message.parsed, City), f"not parsed: {r.choices[0].message}")
        return "parsed"

    def pydantic_function_tool():
        r = client.chat.completions.parse(messages=[{"role": "user", "content": "Name a city."}],
                                          tools=[openai.pydantic_function_tool(City)], tool_choice="required",
                                          max_tokens=MAX_TOKENS, **kw)
        call = r.choices[0].message.tool_calls[0]
        _check(isinstance(call.function.parsed_arguments, City), f"not parsed: {call}")
        return "parsed"

    def responses_tools():
        r = client.responses.create(model=model, input=QUESTION, tools=[RESPONSES_TOOL], tool_choice="required",
                                    max_output_tokens=MAX_TOKENS, temperature=0)
        calls = [i for i in r.output if i.type == "function_call"]
        _check(len(calls) == 1 and set(json.loads(calls[0].arguments)) == {"city"}, f"output: {r.output}")
        return "called"

    def responses_parse():
        r = client.responses.parse(model=model, input="Name a city.", text_format=City, max_output_tokens=MAX_TOKENS,
                                   temperature=0)
        _check(isinstance(r.output_parsed, City), f"not parsed: {r.output}")
        return "parsed"

    def choices():
        r = client.chat.completions.create(messages=[{"role": "user", "content": "Hello"}], max_tokens=8, n=2, **kw)
        _check([c.index for c in r.choices] == [0, 1], f"choices: {r.choices}")
        return "2 choices"

    def models_retrieve():
        _check(client.models.retrieve(model).id == model, "wrong id")
        return "ok"

    return {"chat": chat, "stream": stream, "forced tool call + round trip": forced_tool_round_trip,
            "structured output (parse, strict)": parse_strict, "strict function tool (pydantic_function_tool)": pydantic_function_tool,
            "Responses + tools": responses_tools, "Responses structured output": responses_parse,
            "n = 2": choices, "models.retrieve": models_retrieve}


# -- openai-agents ---------------------------------------------------------------------------
def agents_cells(base: str, model: str) -> dict[str, Callable[[], str]]:
    import openai
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                        set_tracing_disabled)

    set_tracing_disabled(True)
    settings = ModelSettings(temperature=0, max_tokens=MAX_TOKENS, tool_choice="required")
    tool = function_tool(get_weather)

    def run(kind, **agent_kw):
        async def go():  # a client per event loop: an async client is bound to the loop it first ran on
            client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
            model_obj = kind(model=model, openai_client=client)
            agent = Agent(name="a", instructions="Answer briefly.", model=model_obj, **agent_kw)
            return (await Runner.run(agent, QUESTION, max_turns=3)).final_output
        return asyncio.run(go())

    def tools_with(kind):
        out = run(kind, tools=[tool], model_settings=settings, tool_use_behavior="stop_on_first_tool")
        _check(out == "sunny", f"final output: {out!r}")
        return "tool ran"

    def structured(kind):
        out = run(kind, output_type=City, model_settings=ModelSettings(temperature=0, max_tokens=MAX_TOKENS))
        _check(isinstance(out, City), f"final output: {out!r}")
        return "parsed"

    chat, responses = OpenAIChatCompletionsModel, OpenAIResponsesModel
    return {"forced tool call + round trip": lambda: tools_with(chat), "structured output (parse, strict)": lambda: structured(chat),
            "Responses + tools": lambda: tools_with(responses), "Responses structured output": lambda: structured(responses)}


# -- instructor ------------------------------------------------------------------------------
def instructor_cells(base: str, model: str) -> dict[str, Callable[[], str]]:
    import instructor
    import openai

    def extract(mode):
        client = instructor.from_openai(openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120), mode=mode)
        out = client.chat.completions.create(model=model, response_model=City, max_retries=0, temperature=0,
                                             max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": "Name a city."}])
        _check(isinstance(out, City), f"got {out!r}")
        return "validated"

    M = instructor.Mode
    return {"forced tool call (TOOLS)": lambda: extract(M.TOOLS), "strict function tool (TOOLS_STRICT)": lambda: extract(M.TOOLS_STRICT),
            "structured output (JSON_SCHEMA, open schema)": lambda: extract(M.JSON_SCHEMA)}


# -- langchain-openai ------------------------------------------------------------------------
def langchain_cells(base: str, model: str) -> dict[str, Callable[[], str]]:
    from langchain_core.tools import tool as lc_tool
    from langchain_openai import ChatOpenAI

    def llm(**kw):
        return ChatOpenAI(model=model, base_url=base, api_key="unused", temperature=0, max_tokens=MAX_TOKENS, max_retries=0,
                          timeout=120, **kw)

    weather = lc_tool(get_weather)

    def chat():
        _check(llm().invoke("Hello") is not None, "no message")
        return "ok"

    def stream():
        chunks = list(llm().stream("Hello"))
        _check(chunks, "no chunks")
        return f"{len(chunks)} chunks"

    def bind_tools(**kw):
        msg = llm(**kw).bind_tools([weather], tool_choice="any").invoke(QUESTION)
        _check(len(msg.tool_calls) == 1 and set(msg.tool_calls[0]["args"]) == {"city"}, f"tool calls: {msg.tool_calls}")
        return "called"

    def structured(method):
        out = llm().with_structured_output(City, method=method).invoke("Name a city.")
        _check(isinstance(out, City), f"got {out!r}")
        return "parsed"

    return {"chat": chat, "stream": stream, "forced tool call (bind_tools any)": bind_tools,
            "structured output (json_schema)": lambda: structured("json_schema"),
            "structured output (function_calling)": lambda: structured("function_calling"),
            "Responses + tools": lambda: bind_tools(use_responses_api=True)}


# -- pydantic-ai -----------------------------------------------------------------------------
def pydantic_ai_cells(base: str, model: str) -> dict[str, Callable[[], str]]:
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    provider = OpenAIProvider(base_url=base, api_key="unused")
    settings = ModelSettings(temperature=0, max_tokens=MAX_TOKENS)

    def structured(model_obj, output_type):
        out = Agent(model_obj, output_type=output_type, model_settings=settings, retries=0).run_sync("Name a city.").output
        _check(isinstance(out, City), f"got {out!r}")
        return "validated"

    chat = OpenAIChatModel(model, provider=provider)
    return {"forced tool call (tool output)": lambda: structured(chat, City),
            "structured output (NativeOutput)": lambda: structured(chat, NativeOutput(City)),
            "Responses structured output": lambda: structured(OpenAIResponsesModel(model, provider=provider), NativeOutput(City))}


# -- anthropic ---------------------------------------------------------------------------------
def anthropic_cells(base: str, model: str) -> dict[str, Callable[[], str]]:
    import anthropic

    # The Anthropic SDK's base URL has no `/v1`: it adds `/v1/messages` itself.
    client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=120)
    # The 2.x SDK takes no `temperature` argument (Anthropic's newest models refuse sampling knobs); greedy is asked in the body.
    kw = dict(model=model, extra_body={"temperature": 0})
    ask = [{"role": "user", "content": QUESTION}]

    def create():
        r = client.messages.create(messages=[{"role": "user", "content": "Hello"}], max_tokens=16, **kw)
        _check(r.content and r.stop_reason in ("end_turn", "max_tokens") and r.usage.output_tokens > 0, f"message: {r}")
        return r.stop_reason

    def stream():
        with client.messages.stream(messages=[{"role": "user", "content": "Hello"}], max_tokens=16, **kw) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        _check(final.content and text == "".join(b.text for b in final.content if b.type == "text"), f"final: {final}")
        return f"{len(text)} characters"

    def forced_tool_round_trip():
        r = client.messages.create(messages=ask, tools=[ANTHROPIC_TOOL], tool_choice={"type": "any"}, max_tokens=MAX_TOKENS, **kw)
        [call] = [b for b in r.content if b.type == "tool_use"]
        _check(r.stop_reason == "tool_use" and call.id.startswith("toolu_") and set(call.input) == {"city"}, f"content: {r.content}")
        history = ask + [{"role": "assistant", "content": r.content},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                       "content": get_weather(**call.input)}]}]
        again = client.messages.create(messages=history, tools=[ANTHROPIC_TOOL], max_tokens=16, **kw)
        return again.stop_reason

    def streamed_named_tool():
        with client.messages.stream(messages=ask, tools=[ANTHROPIC_TOOL], max_tokens=MAX_TOKENS,
                                    tool_choice={"type": "tool", "name": "get_weather"}, **kw) as s:
            final = s.get_final_message()
        [call] = [b for b in final.content if b.type == "tool_use"]
        _check(call.name == "get_weather" and set(call.input) == {"city"}, f"content: {final.content}")
        return "called"

    def count_tokens():
        counted = client.messages.count_tokens(model=model, messages=ask, tools=[ANTHROPIC_TOOL]).input_tokens
        u = client.messages.create(messages=ask, tools=[ANTHROPIC_TOOL], max_tokens=1, **kw).usage
        used = u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
        _check(counted == used, f"counted {counted}, the message used {used}")
        return f"{counted} tokens"

    return {"messages": create, "stream (text_stream, final message)": stream,
            "forced tool call + round trip": forced_tool_round_trip, "streamed named tool call": streamed_named_tool,
            "count_tokens": count_tokens}


SUITES = {"openai": openai_cells, "openai-agents": agents_cells, "instructor": instructor_cells,
          "langchain-openai": langchain_cells, "pydantic-ai-slim": pydantic_ai_cells, "anthropic": anthropic_cells}


def run(base: str, model: str, only: set[str] | None = None) -> dict:
    versions = {c: metadata.version(c) for c in CLIENTS}
    cells = []
    for client, suite in SUITES.items():
        for feature, cell in suite(base, model).items():
            if only and feature not in only:
                continue
            try:
                cells.append({"client": client, "feature": feature, "ok": True, "detail": str(cell())[:200]})
            except Exception as e:  # a cell's failure is its result
                last = traceback.extract_tb(e.__traceback__)[-1]
                cells.append({"client": client, "feature": feature, "ok": False,
                              "detail": f"{type(e).__name__}: {str(e)[:300]} ({last.filename.rsplit('/', 1)[-1]}:{last.lineno})"})
    return {"versions": versions, "cells": cells}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="the OpenAI base URL, ending in /v1")
    p.add_argument("--model", required=True)
    p.add_argument("--only", action="append", help="run only this feature (repeatable)")
    args = p.parse_args(argv)
    json.dump(run(args.base_url, args.model, set(args.only) if args.only else None), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
