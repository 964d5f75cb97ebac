"""Tool calls for a model whose chat template has no tool syntax (issue 27 item 2): SmolLM2's own ChatML
template and Gemma-3 base with ``--chat-template gemma`` get llama-server's generic format through the one
reply pipeline, on every wire format, with the real clients (``openai`` for chat completions and
Responses, ``anthropic``; Ollama's ``/api/chat`` over httpx). The protocol is judged, not the answers: a
forced call (``tool_choice`` required / named; Anthropic ``any`` / ``tool``) is well formed and its
arguments validate against the tool's JSON Schema; under ``auto`` the answer is a valid call or text; a
conversation with tool-call history renders and answers. ``serve --no-generic-tools`` refuses such
requests as before."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from helpers import ServerThread

pytestmark = pytest.mark.model

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                   "required": ["zone"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
HISTORY = [*ASK,
           {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
               "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3, "sky": "rain"}'}]


def _serve(path, home, *, template: str | None = None, generic_tools: bool = True):
    from localrun.backends import load_engine
    from localrun.config import Settings
    from localrun.model.chat_template import load_template
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = simple_plan(read_gguf(path), n_ctx=2048, n_parallel=1)
    plan.n_threads = plan.n_threads_batch = 1  # 2 shared cores: more threads only spin
    engine = load_engine(path, plan, chat_template=load_template(template) if template else None)
    app = create_app(engine, Settings(home=home, models_dir=home / "models"),
                     ServeOptions(plan=plan, generic_tools=generic_tools))
    srv = ServerThread(app)
    srv.engine = engine
    return srv


@pytest.fixture(scope="module")
def server(smollm_path, tmp_path_factory):
    srv = _serve(smollm_path, tmp_path_factory.mktemp("generic_home"))
    assert srv.engine.supports_tools is False  # SmolLM2's own template never reads `tools`
    yield srv
    srv.stop()
    srv.engine.close()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", timeout=300, max_retries=0)


def valid_call(name: str, arguments: dict | str) -> dict:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert name in SCHEMAS, name
    jsonschema.validate(args, SCHEMAS[name])
    return args


# ---------------------------------------------------------------------------------------------- OpenAI


@pytest.mark.parametrize("choice, name", [("required", None), ({"type": "function", "function": {"name": "get_time"}},
                                                                "get_time")])
def test_openai_forced_call_is_well_formed(oai, choice, name):
    r = oai.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                    temperature=0, max_tokens=60)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and not ch.message.content
    (tc,) = ch.message.tool_calls
    assert tc.type == "function" and tc.id.startswith("call_")
    assert name is None or tc.function.name == name
    valid_call(tc.function.name, tc.function.arguments)


def test_openai_streamed_call_equals_the_whole_one(oai):
    kw = dict(messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=60)
    whole = oai.chat.completions.create(model="x", **kw).choices[0].message.tool_calls[0]
    calls, finish = {}, None
    for ch in oai.chat.completions.create(model="x", stream=True, **kw):
        for c in ch.choices:
            finish = c.finish_reason or finish
            assert not c.delta.content
            for tc in c.delta.tool_calls or []:
                calls.setdefault(tc.index, {"name": tc.function.name, "arguments": ""})
                calls[tc.index]["arguments"] += tc.function.arguments or ""
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == whole.function.name == "get_weather"
    assert json.loads(calls[0]["arguments"]) == json.loads(whole.function.arguments)
    valid_call("get_weather", calls[0]["arguments"])


def test_openai_parallel_calls_use_the_array(oai):
    r = oai.chat.completions.create(model="x", messages=[{"role": "user", "content": "Weather in Oslo and Rome?"}],
                                    tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=True,
                                    temperature=0, max_tokens=64)  # two whole calls are ≈ 45 tokens
    ch = r.choices[0]
    if ch.finish_reason == "length":  # SmolLM2 may go on adding calls: the cut array comes back as text
        assert ch.message.content.startswith('{"tool_calls": [{"name": "') and not ch.message.tool_calls
        return
    calls = ch.message.tool_calls
    assert ch.finish_reason == "tool_calls" and calls and len({c.id for c in calls}) == len(calls)
    for c in calls:
        valid_call(c.function.name, c.function.arguments)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_auto_is_a_call_or_text(oai, stream):
    kw = dict(model="x", messages=[{"role": "user", "content": "Say hello."}], tools=[WEATHER, TIME],
              temperature=0, max_tokens=60)
    if stream:
        content, calls, finish = "", {}, None
        for ch in oai.chat.completions.create(stream=True, **kw):
            for c in ch.choices:
                content += c.delta.content or ""
                finish = c.finish_reason or finish
                for tc in c.delta.tool_calls or []:
                    calls.setdefault(tc.index, [tc.function.name, ""])[1] += tc.function.arguments or ""
        calls = list(calls.values())
    else:
        m = oai.chat.completions.create(**kw).choices[0]
        content, finish = m.message.content or "", m.finish_reason
        calls = [[c.function.name, c.function.arguments] for c in m.message.tool_calls or []]
    if calls:
        assert finish == "tool_calls"
        for name, args in calls:
            valid_call(name, args)
    else:
        assert finish in ("stop", "length") and not content.lstrip().startswith('{"response"'), content


def test_openai_history_with_calls_renders_and_answers(oai, server):
    r = oai.chat.completions.create(model="x", messages=HISTORY, tools=[WEATHER], temperature=0, max_tokens=40)
    m = r.choices[0].message
    assert m.content or m.tool_calls
    for c in m.tool_calls or []:
        valid_call(c.function.name, c.function.arguments)
    # without tools (tool_choice none, or none sent) the history still renders, as text
    r = oai.chat.completions.create(model="x", messages=HISTORY, temperature=0, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    r = oai.chat.completions.create(model="x", messages=HISTORY, tools=[WEATHER], tool_choice="none",
                                    temperature=0, max_tokens=8)
    assert r.choices[0].message.tool_calls is None


def test_a_system_message_with_tools_and_history_answers(server):
    from dataclasses import replace

    from localrun.dialects.history import messages_for_template
    from localrun.server.reply import family_of

    r = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
        "messages": [{"role": "system", "content": "Be brief."}, *HISTORY], "tools": [WEATHER],
        "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    fam = family_of(server.engine.template_source)
    assert fam.tools is None  # the history below is what SmolLM2's template rendered
    hist = messages_for_template(HISTORY, replace(fam, tools="generic"))
    assert hist[1]["content"] == '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}'
    assert hist[2]["role"] == "user" and '"tool_response"' in hist[2]["content"]


# ---------------------------------------------------------------------------------------------- Ollama


def test_ollama_chat_with_tools_is_a_call_or_text(server):
    r = httpx.post(server.url + "/api/chat", timeout=300, json={
        "model": "x", "messages": ASK, "tools": [WEATHER, TIME], "stream": False,
        "options": {"temperature": 0, "num_predict": 60}})
    assert r.status_code == 200, r.text
    msg = r.json()["message"]
    for tc in msg.get("tool_calls") or []:
        assert isinstance(tc["function"]["arguments"], dict)
        valid_call(tc["function"]["name"], tc["function"]["arguments"])
    assert msg.get("tool_calls") or not msg["content"].lstrip().startswith('{"response"')


def test_ollama_streamed_tools_and_history(server):
    hist = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "rain, 3 C", "tool_name": "get_weather"}]
    with httpx.stream("POST", server.url + "/api/chat", timeout=300, json={
            "model": "x", "messages": hist, "tools": [WEATHER],
            "options": {"temperature": 0, "num_predict": 40}}) as r:
        assert r.status_code == 200
        lines = [json.loads(ln) for ln in r.iter_lines() if ln]
    assert lines[-1]["done"] is True and all(not ln["done"] for ln in lines[:-1])
    calls = [tc for ln in lines for tc in ln["message"].get("tool_calls") or []]
    text = "".join(ln["message"].get("content", "") for ln in lines)
    for tc in calls:
        valid_call(tc["function"]["name"], tc["function"]["arguments"])
    assert calls or not text.lstrip().startswith('{"response"')


# ---------------------------------------------------------------------------------------------- Anthropic

A_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"]} for t in (WEATHER, TIME)]


@pytest.mark.parametrize("choice, name", [({"type": "any"}, None), ({"type": "tool", "name": "get_time"}, "get_time")])
def test_anthropic_forced_tool_use_is_well_formed(claude, choice, name):
    m = claude.messages.create(model="x", max_tokens=60, messages=ASK, tools=A_TOOLS, tool_choice=choice,
                               extra_body={"temperature": 0})
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].id
    assert name is None or uses[0].name == name
    valid_call(uses[0].name, uses[0].input)


def test_anthropic_streamed_tool_use_and_history(claude):
    with claude.messages.stream(model="x", max_tokens=60, messages=ASK, tools=A_TOOLS,
                                tool_choice={"type": "tool", "name": "get_weather"},
                                extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and use.name == "get_weather"
    valid_call(use.name, use.input)
    history = [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                         "input": use.input}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "rain, 3 C"}]}]
    m = claude.messages.create(model="x", max_tokens=40, messages=history, tools=A_TOOLS,
                               extra_body={"temperature": 0})
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use") and m.content
    for b in m.content:
        if b.type == "tool_use":
            valid_call(b.name, b.input)


# ---------------------------------------------------------------------------------------------- Responses


def test_responses_forced_function_call_is_well_formed(oai):
    fn = WEATHER["function"]
    r = oai.responses.create(model="x", input="What is the weather in Oslo?", store=False, max_output_tokens=60,
                             tools=[{"type": "function", "name": fn["name"], "description": fn["description"],
                                     "parameters": fn["parameters"]}], tool_choice="required", temperature=0)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    valid_call(call.name, call.arguments)


# ---------------------------------------------------------------------------------------------- Gemma, flag


def test_gemma_base_with_the_gemma_template_calls_tools(gemma_path, tmp_path_factory):
    srv = _serve(gemma_path, tmp_path_factory.mktemp("generic_gemma"), template="gemma")
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=300, max_retries=0)
        msgs = [{"role": "system", "content": "You help."}, *HISTORY]
        r = c.chat.completions.create(model="x", messages=msgs, tools=[WEATHER, TIME], tool_choice="required",
                                      temperature=0, max_tokens=60)
        (tc,) = r.choices[0].message.tool_calls
        valid_call(tc.function.name, tc.function.arguments)
    finally:
        srv.stop()
        srv.engine.close()


def test_no_generic_tools_refuses_as_before(smollm_path, tmp_path_factory):
    srv = _serve(smollm_path, tmp_path_factory.mktemp("generic_off"), generic_tools=False)
    try:
        r = httpx.post(srv.url + "/api/chat", timeout=60, json={"model": "x", "messages": ASK, "tools": [WEATHER],
                                                                "stream": False})
        assert r.status_code == 400 and "does not support tools" in r.json()["error"], r.text
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={"messages": ASK, "tools": [WEATHER]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "tools_unsupported", r.text
        # history still renders (tools off, past calls as text)
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={"messages": HISTORY, "max_tokens": 4})
        assert r.status_code == 200, r.text
    finally:
        srv.stop()
        srv.engine.close()
