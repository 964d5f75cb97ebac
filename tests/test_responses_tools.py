"""Tools through the Responses API (issue 28): SmolLM2 served with Qwen3-0.6B's chat template (Hermes
``<tool_call>`` calls), so a forced ``tool_choice`` makes the tiny model write a real call, token by token.
Function tools, ``custom`` tools whose input a Lark or regex grammar constrains (llguidance), a tool's output
sent back by ``previous_response_id``, and the OpenAI Agents SDK running one tool and then answering."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from helpers import ServerThread
from test_responses import comparable

pytestmark = pytest.mark.model

openai = pytest.importorskip("openai")

TEMPLATES = Path(__file__).parent / "data" / "templates"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city now",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}
SHELL = {"type": "custom", "name": "shell", "description": "Run one shell command",
         "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "ls " DIR\nDIR: /[a-z]{1,8}/\n'}}
PHONE = {"type": "custom", "name": "dial", "description": "Dial a phone number",
         "format": {"type": "grammar", "syntax": "regex", "definition": r"[0-9]{3}-[0-9]{4}"}}
ASK = "What is the weather in Oslo?"


@pytest.fixture(scope="module")
def server(smollm_path, tmp_path_factory):
    from localrun.backends import load_engine
    from localrun.config import Settings
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = simple_plan(read_gguf(smollm_path), n_ctx=2048, n_parallel=2)
    plan.n_threads = plan.n_threads_batch = 1
    engine = load_engine(smollm_path, plan, chat_template=(TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    home = tmp_path_factory.mktemp("responses_tools_home")
    srv = ServerThread(create_app(engine, Settings(home=home, models_dir=home / "models"), ServeOptions(plan=plan)))
    yield srv
    srv.stop()
    engine.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300, max_retries=0)


def test_a_forced_function_call_and_its_output_by_previous_response_id(client):
    r = client.responses.create(model="x", input=ASK, tools=[WEATHER], temperature=0, max_output_tokens=60,
                                tool_choice={"type": "function", "name": "get_weather"})
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1, r.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    assert set(json.loads(call.arguments)) == {"city"}
    nxt = client.responses.create(model="x", previous_response_id=r.id, tools=[WEATHER], temperature=0,
                                  max_output_tokens=20,
                                  input=[{"type": "function_call_output", "call_id": call.call_id,
                                          "output": json.dumps({"temperature_c": 12})}])
    assert nxt.status in ("completed", "incomplete") and nxt.output[0].type == "message"
    # the continuation reuses the call's prompt from the cache: Qwen3's template writes an earlier assistant
    # turn unlike the generation prompt it answered (no empty thinking block), so the reuse stops there
    assert nxt.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens - 16
    # the same conversation sent whole (stateless) is accepted, and the call_id ties the output to its call
    whole = client.responses.create(model="x", tools=[WEATHER], temperature=0, max_output_tokens=20,
                                    store=False, input=[
                                        {"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
                                        {"type": "function_call_output", "call_id": call.call_id,
                                         "output": json.dumps({"temperature_c": 12})}])
    assert whole.output_text == nxt.output_text


def test_required_tool_choice_and_the_stream_of_a_call(client):
    kw = dict(model="x", input=ASK, tools=[WEATHER], temperature=0, max_output_tokens=60, tool_choice="required")
    full = client.responses.create(**kw)
    assert [o.type for o in full.output] == ["function_call"]
    types = []
    with client.responses.stream(**kw) as stream:
        for e in stream:
            types.append(e.type)
        final = stream.get_final_response()
    assert comparable(final) | {"usage": None} == comparable(full) | {"usage": None}
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in types
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]


def test_a_forced_custom_tool_writes_its_grammar(client, server):
    r = client.responses.create(model="x", input="List the files in the docs folder.", tools=[SHELL, PHONE],
                                temperature=0, max_output_tokens=30, tool_choice={"type": "custom", "name": "shell"})
    assert [o.type for o in r.output] == ["custom_tool_call"], r.output
    call = r.output[0]
    assert call.name == "shell" and re.fullmatch(r"ls [a-z]{1,8}", call.input), call.input
    r2 = client.responses.create(model="x", input="Call Bob.", tools=[SHELL, PHONE], temperature=0,
                                 max_output_tokens=30, tool_choice={"type": "custom", "name": "dial"})
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", r2.output[0].input), r2.output
    # streamed: the input arrives as custom_tool_call_input deltas
    events = []
    with httpx.stream("POST", server.url + "/v1/responses", timeout=300, json={
            "model": "x", "input": "Call Bob.", "tools": [SHELL, PHONE], "temperature": 0, "max_output_tokens": 30,
            "tool_choice": {"type": "custom", "name": "dial"}, "stream": True}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ") and line[6:] != "[DONE]"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta")
    done = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert deltas == done[0]["input"] == r2.output[0].input
    # its output goes back by previous_response_id
    nxt = client.responses.create(model="x", previous_response_id=r.id, tools=[SHELL], temperature=0,
                                  max_output_tokens=10, tool_choice="none",
                                  input=[{"type": "custom_tool_call_output", "call_id": call.call_id,
                                          "output": "a.md b.md"}])
    assert nxt.status in ("completed", "incomplete")


def test_the_agents_sdk_calls_a_tool_then_answers(server, monkeypatch):
    agents = pytest.importorskip("agents")
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        seen.append(city)
        return f"It is 12 degrees and sunny in {city}."

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", timeout=300, max_retries=0)
    agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
                  model=OpenAIResponsesModel(model="smollm", openai_client=client),
                  model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=40))
    result = Runner.run_sync(agent, ASK, max_turns=4)
    assert len(seen) == 1  # the tool ran once (the SDK resets tool_choice after the call) ...
    kinds = [type(i).__name__ for i in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem", kinds
    assert isinstance(result.final_output, str)  # ... and the model answered
    del agents
