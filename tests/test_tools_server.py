"""Tool calls through a real server (issue 13): SmolLM2 served with Qwen3-0.6B's chat template
(tests/data/templates/Qwen-Qwen3-0.6B.jinja: ChatML, Hermes ``<tool_call>`` calls, ``enable_thinking``).
``tool_choice: required`` / a named function is enforced by constrained decoding (``constrain``), so
SmolLM2 writes a real call, token by token, that the reply parser reads back; the real ``openai`` client
checks OpenAI's shape (arguments a JSON string, ids, finish_reason ``tool_calls``, streamed deltas)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from helpers import ServerThread

openai = pytest.importorskip("openai")

TEMPLATES = Path(__file__).parent / "data" / "templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                   "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def server(smollm_path, tmp_path_factory):
    from localrun.backends import attach_kv_tiers, load_engine
    from localrun.config import Settings
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = simple_plan(read_gguf(smollm_path), n_ctx=1024, n_parallel=7)  # the 8 seeds: one, then seven at once
    plan.n_threads = plan.n_threads_batch = 1
    engine = load_engine(smollm_path, plan, chat_template=(TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    attach_kv_tiers(engine, ram_bytes=256 << 20)  # as `serve` does by default: the tools' head is a snapshot
    home = tmp_path_factory.mktemp("tools_home")
    app = create_app(engine, Settings(home=home, models_dir=home / "models"), ServeOptions(plan=plan))
    srv = ServerThread(app)
    yield srv
    srv.stop()
    engine.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300, max_retries=0)


def streamed_calls(client, **kw) -> tuple[list[dict], str, str | None]:
    """A streamed request → (calls assembled from the tool_call deltas, content, finish_reason). Checks
    OpenAI's delta order: a call's first delta has its id, type and name; later ones only argument pieces."""
    calls: dict[int, dict] = {}
    content, finish = [], None
    for ch in client.chat.completions.create(model="x", stream=True, **kw):
        for c in ch.choices:
            content.append(c.delta.content or "")
            finish = c.finish_reason or finish
            for tc in c.delta.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.type == "function" and tc.function.name
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments or ""
    return [calls[i] for i in sorted(calls)], "".join(content), finish


def test_required_call_openai_shape_streaming_equals_full(client):
    kw = dict(messages=ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=80)
    # once first, so both compared requests reuse the cached prompt: a cold prefill computes the same logits
    # in other batch sizes, and near-ties (0.06 apart here) may flip between a cold and a warm request
    client.chat.completions.create(model="x", **kw)
    full = client.chat.completions.create(model="x", **kw)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content  # no tool markup left in content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in ("get_weather", "get_time")
    assert isinstance(call.function.arguments, str) and isinstance(json.loads(call.function.arguments), dict)
    calls, content, finish = streamed_calls(client, **kw)
    assert (finish, content) == ("tool_calls", "")
    assert [(c["name"], c["arguments"]) for c in calls] == [(call.function.name, call.function.arguments)]


def test_required_gives_a_parseable_call_for_8_seeds(client):
    def one(seed: int):
        r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           temperature=1.0, seed=seed, max_tokens=120)
        return r.choices[0]

    first = one(0)  # the prompt's system turn (the tools) is then a KV-tier snapshot the other 7 restore
    with ThreadPoolExecutor(7) as ex:
        choices = [first] + list(ex.map(one, range(1, 8)))
    for seed, ch in enumerate(choices):
        assert ch.finish_reason == "tool_calls", (seed, ch)
        (call,) = ch.message.tool_calls
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert isinstance(args["city"], str), (seed, args)
        else:
            assert call.function.name == "get_time" and args["zone"] in ("UTC", "CET"), (seed, args)


def test_named_tool_choice(client):
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=60,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments)["zone"] in ("UTC", "CET")


def test_bad_tool_choice_is_a_400(server):
    url = server.url + "/v1/chat/completions"
    named = {"type": "function", "function": {"name": "get_stock_price"}}
    for body, needle in [({"messages": ASK, "tools": [WEATHER], "tool_choice": named}, "get_stock_price"),
                         ({"messages": ASK, "tool_choice": "required"}, "tools"),
                         ({"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice")]:
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "tool_choice" and needle in err["message"]


def test_tool_history_renders(server):
    """An assistant turn with tool_calls (arguments a string or an object) and null content, then the tool's
    result by tool_call_id, renders through the template on the OpenAI and Ollama routes: the same prompt
    either way (so the same greedy answer), longer than the question alone."""
    def ask(arguments):
        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}]
        r = httpx.post(server.url + "/v1/chat/completions", timeout=300,
                       json={"messages": history, "tools": [WEATHER], "temperature": 0, "max_tokens": 8})
        assert r.status_code == 200, r.text
        o = httpx.post(server.url + "/api/chat", timeout=300,
                       json={"messages": history, "tools": [WEATHER], "stream": False,
                             "options": {"temperature": 0, "num_predict": 8}})
        assert o.status_code == 200, o.text
        return r.json(), o.json()

    (r1, o1), (r2, o2) = ask('{"city": "Oslo"}'), ask({"city": "Oslo"})
    base = httpx.post(server.url + "/v1/chat/completions", timeout=300,
                      json={"messages": ASK, "tools": [WEATHER], "max_tokens": 1}).json()
    assert r1["usage"]["prompt_tokens"] == r2["usage"]["prompt_tokens"] > base["usage"]["prompt_tokens"] + 10
    answers = {r1["choices"][0]["message"]["content"], r2["choices"][0]["message"]["content"],
               o1["message"]["content"], o2["message"]["content"]}
    assert len(answers) == 1
