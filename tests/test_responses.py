"""OpenAI's Responses API through a real server (issue 28): SmolLM2 in llama.cpp, the real `openai` SDK
(`responses.create`, `stream`, `retrieve`, `delete`, `input_items.list`) and raw httpx for the event order
and the bad inputs. A tiny model: the tests judge statuses, shapes, event order and token counts, never the
quality of an answer, and never timing."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import ServerThread

pytestmark = pytest.mark.model  # every test here loads a real model

openai = pytest.importorskip("openai")

API_KEY = "responses-key-1"
N_CTX = 2048
ASK = "What is the capital of France?"


def make_app(engine, plan, home, db, api_key=API_KEY):
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    opts = ServeOptions(api_key=api_key, plan=plan)
    opts.responses_db = db
    return create_app(engine, Settings(home=home, models_dir=home / "models"), opts)


@pytest.fixture(scope="module")
def engine_plan(smollm_path):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(smollm_path), n_ctx=N_CTX, n_parallel=2)
    plan.n_threads = plan.n_threads_batch = 1  # 2 shared cores: more threads only spin
    engine = load_engine(smollm_path, plan)
    yield engine, plan
    engine.close()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("responses_home")


@pytest.fixture(scope="module")
def server(engine_plan, home):
    engine, plan = engine_plan
    srv = ServerThread(make_app(engine, plan, home, home / "responses.db"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=300) as c:
        yield c


def sse_events(http, body: dict) -> list[dict]:
    """A streamed request's events, in order (each ``data:`` line parsed; the ``event:`` line checked); the
    stream ends with ``data: [DONE]`` (the Open Responses specification's terminal event)."""
    out, name, data = [], None, []
    with http.stream("POST", "/v1/responses", json=dict(body, stream=True)) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
                if line[6:] != "[DONE]":
                    ev = json.loads(line[6:])
                    assert ev["type"] == name
                    out.append(ev)
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    return out


def comparable(resp) -> dict:
    """A response without what differs between two runs of the same request (ids, call ids, times)."""
    d = resp if isinstance(resp, dict) else resp.model_dump(exclude_none=True)
    d = json.loads(json.dumps(d))
    for k in ("id", "created_at", "completed_at"):
        d.pop(k, None)
    for item in d.get("output", []):
        item.pop("id", None)
        item.pop("call_id", None)
    return d


# ---------------------------------------------------------------------------------------------- create, stream
def test_create_and_stream_give_the_same_response(client):
    kw = dict(model="smollm", input=ASK, instructions="Answer in one short sentence.", temperature=0,
              max_output_tokens=24)
    full = client.responses.create(**kw)
    assert full.object == "response" and full.status in ("completed", "incomplete") and full.id.startswith("resp_")
    assert full.output[0].type == "message" and full.output[0].role == "assistant"
    assert full.output_text and full.output[0].content[0].type == "output_text"
    u = full.usage
    assert u.input_tokens > 0 and 0 < u.output_tokens <= 24 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0 and u.input_tokens_details.cached_tokens >= 0
    with client.responses.stream(**kw) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == full.output_text
    a, b = comparable(full), comparable(final)
    a["usage"].pop("input_tokens_details"), b["usage"].pop("input_tokens_details")  # the second run hits the cache
    assert a == b


def test_stream_event_sequence(http):
    events = sse_events(http, {"input": "Say hello.", "temperature": 0, "max_output_tokens": 12})
    types = [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    end = types.index("response.output_text.done")
    assert set(types[4:end]) == {"response.output_text.delta"}
    assert types[end:end + 3] == ["response.output_text.done", "response.content_part.done",
                                  "response.output_item.done"]
    assert types[-1] in ("response.completed", "response.incomplete") and len(types) == end + 4
    item_id = events[2]["item"]["id"]
    assert all(e["item_id"] == item_id for e in events[3:end + 2])
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    last = events[-1]["response"]
    assert last["output"][0]["content"][0]["text"] == text == events[end]["text"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []


def test_max_output_tokens_makes_it_incomplete(client, http):
    r = client.responses.create(model="x", input="Write a long story about a dragon.", temperature=0,
                                max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3
    events = sse_events(http, {"input": "Write a long story about a dragon.", "temperature": 0,
                               "max_output_tokens": 3})
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_json_schema_format_is_enforced(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}
    r = client.responses.create(model="x", input=ASK, temperature=0, max_output_tokens=40,
                                text={"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                                 "strict": True}})
    assert r.status == "completed"
    assert set(json.loads(r.output_text)) == {"city"}
    r = client.responses.create(model="x", input=ASK + " Answer in JSON.", temperature=0, max_output_tokens=40,
                                text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(r.output_text), dict)


def test_input_items_and_message_roles(client):
    r = client.responses.create(model="x", temperature=0, max_output_tokens=8, input=[
        {"role": "developer", "content": "You are terse."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi, "},
                                                        {"type": "input_text", "text": "who are you?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A bot."}]},
        {"role": "user", "content": "Say it again."}])
    assert r.status in ("completed", "incomplete") and r.output_text


# ---------------------------------------------------------------------------------------------- state
def test_retrieve_input_items_delete(client):
    r = client.responses.create(model="x", input=[{"role": "user", "content": "One"},
                                                  {"role": "user", "content": "Two"}],
                                temperature=0, max_output_tokens=6, metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    items = client.responses.input_items.list(r.id, order="asc")
    texts = [i.content[0].text for i in items.data]
    assert texts == ["One", "Two"] and all(i.id for i in items.data)
    assert [i.content[0].text for i in client.responses.input_items.list(r.id).data] == ["Two", "One"]
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    unstored = client.responses.create(model="x", input="One", temperature=0, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


TURNS = ["Hello! What is your name?", "What is the capital of France?", "And of Germany?",
         "Name a color.", "Thanks, goodbye."]


def converse_by_id(client, n_tokens: int, first_previous: str | None = None, turns=TURNS):
    """The turns continued by previous_response_id → the responses."""
    out, prev = [], first_previous
    for text in turns:
        r = client.responses.create(model="x", input=text, previous_response_id=prev, temperature=0,
                                    max_output_tokens=n_tokens, instructions="You are a helpful assistant.")
        assert r.status in ("completed", "incomplete"), r
        out.append(r)
        prev = r.id
    return out


def converse_whole(client, n_tokens: int, turns=TURNS) -> list[str]:
    """The same conversation sent whole every turn (stateless, store false) → the answers."""
    items, answers = [], []
    for text in turns:
        items.append({"role": "user", "content": text})
        r = client.responses.create(model="x", input=items, temperature=0, max_output_tokens=n_tokens,
                                    instructions="You are a helpful assistant.", store=False)
        answers.append(r.output_text)
        items.append({"role": "assistant", "content": r.output_text})
    return answers


def check_cached(responses) -> None:
    """Turns 2..n reuse the previous turn's prompt and reply: only the new turn's tokens are prefilled (the
    previous reply's last token was sampled, never decoded into the KV cache: at most one more)."""
    for prev, r in zip(responses, responses[1:]):
        u, p = r.usage, prev.usage
        new_tokens = u.input_tokens - (p.input_tokens + p.output_tokens)
        assert u.input_tokens_details.cached_tokens >= p.input_tokens + p.output_tokens - 1, (p, u)
        assert u.input_tokens - u.input_tokens_details.cached_tokens <= new_tokens + 1


def test_five_turns_by_previous_response_id_equal_the_whole_conversation(client):
    chained = converse_by_id(client, 8)  # a reply cut short is history as much as a whole one
    assert [r.output_text for r in chained] == converse_whole(client, 8)
    check_cached(chained)


def test_a_continued_response_keeps_its_conversation_in_input_items(client):
    first = client.responses.create(model="x", input="Hi", temperature=0, max_output_tokens=4)
    second = client.responses.create(model="x", input="Again", previous_response_id=first.id, temperature=0,
                                     max_output_tokens=4)
    assert second.previous_response_id == first.id
    assert [i.content[0].text for i in client.responses.input_items.list(second.id).data] == ["Again"]


# ---------------------------------------------------------------------------------------------- refusals
def test_malformed_requests_are_400_naming_the_field(http):
    ok = {"input": "Hi", "max_output_tokens": 2}
    cases = [
        ({"input": [{"type": "banana", "text": "x"}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "call_id": "call_nope", "output": "1"}]}, "input[0].call_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]},
         "input[0].content[0].type"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
        ({"previous_response_id": "resp_does_not_exist"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
        ({"background": True}, "background"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_output_tokens": "many"}, "max_output_tokens"),
        ({"input": 7}, "input"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "strict": True,
                              "schema": {"properties": {"c": {"type": "string", "format": "colour"}}}}}},
         "text.format.schema"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"tools": [{"type": "custom", "name": "patch", "format": {"type": "grammar", "syntax": "lark",
                                                                   "definition": "start: ((("}}]},
         "tools[0].format.definition"),
        ({"input": []}, "input"),
        ({"conversation": "conv_1"}, "conversation"),
    ]
    for patch, param in cases:
        r = http.post("/v1/responses", json=dict(ok, **patch))
        assert r.status_code == 400, (patch, r.text)
        err = r.json()["error"]
        assert err["param"] == param, (patch, err)
        assert err["type"] == "invalid_request_error" and err["message"]
        if patch.get("tools") == [{"type": "web_search"}]:
            assert "web_search" in err["message"]
    assert http.get("/health").json()["status"] == "ok"
    r = http.post("/v1/responses", json=dict(ok, some_future_field={"x": 1}, truncation="auto",
                                             prompt_cache_key="k", include=["message.output_text.logprobs"]))
    assert r.status_code == 200, r.text  # unknown fields are logged, never refused
    # hosted tools (Codex sends web_search by default) and a schema without strict are accepted: the tools are
    # left out, the schema is enforced as far as it can be (its unknown format left out)
    for patch in ({"tools": [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": []}]},
                  {"text": {"format": {"type": "json_schema", "name": "x", "schema": {
                      "properties": {"c": {"type": "string", "format": "colour"}}}}}}):
        r = http.post("/v1/responses", json=dict(ok, **patch))
        assert r.status_code == 200, (patch, r.text)


def test_not_found_and_the_api_key(server, http):
    assert http.get("/v1/responses/resp_nope").status_code == 404
    assert http.get("/v1/responses/resp_nope/input_items").status_code == 404
    assert httpx.post(server.url + "/v1/responses", json={"input": "Hi"}).status_code == 401


def test_responses_survive_a_restart_and_stay_with_their_key(engine_plan, tmp_path):
    """The store is a file: a new server on it retrieves and continues a response, but a server started
    with another API key finds none of the old key's responses."""
    engine, plan = engine_plan
    db = tmp_path / "r.db"
    srv = ServerThread(make_app(engine, plan, tmp_path, db))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, timeout=300, max_retries=0)
        first = c.responses.create(model="x", input="Hello!", temperature=0, max_output_tokens=8)
    finally:
        srv.stop()
    srv = ServerThread(make_app(engine, plan, tmp_path, db))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, timeout=300, max_retries=0)
        assert c.responses.retrieve(first.id).output_text == first.output_text
        nxt = c.responses.create(model="x", input="How are you?", previous_response_id=first.id, temperature=0,
                                 max_output_tokens=8)
        assert nxt.status in ("completed", "incomplete")
    finally:
        srv.stop()
    srv = ServerThread(make_app(engine, plan, tmp_path, db, api_key="another-key"))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="another-key", timeout=300, max_retries=0)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(first.id)
        with pytest.raises(openai.BadRequestError) as ei:
            c.responses.create(model="x", input="Hi", previous_response_id=first.id, max_output_tokens=2)
        assert ei.value.body["param"] == "previous_response_id"
    finally:
        srv.stop()


def test_truncation_auto_drops_the_oldest_turns(http):
    # the oldest turn alone nearly fills the context, so what is left after dropping it (the only thing
    # prefilled) is short: ≈ 1900 + 200 tokens overflow the 2048, the newer ≈ 200 are kept
    sentence = "The quick brown fox jumps over the lazy dog."  # 10 tokens
    items = []
    for i, n in enumerate((190, 20)):
        items += [{"role": "user", "content": f"{i}: " + " ".join([sentence] * n)},
                  {"role": "assistant", "content": "OK."}]
    items.append({"role": "user", "content": "Thanks."})
    body = {"input": items, "max_output_tokens": 2, "temperature": 0}
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert r.json()["error"]["code"] == "context_length_exceeded"
    r = http.post("/v1/responses", json=dict(body, truncation="auto"))
    assert r.status_code == 200, r.text
    assert r.json()["truncation"] == "auto" and r.json()["usage"]["input_tokens"] < N_CTX
    # exactly the oldest turn went (its user message and the reply to it): the rest is the prompt, whole
    kept = http.post("/v1/responses", json=dict(body, input=items[2:]))
    assert kept.status_code == 200, kept.text
    assert r.json()["usage"]["input_tokens"] == kept.json()["usage"]["input_tokens"] > 200


def test_tools_on_a_template_without_tool_syntax(client):
    """SmolLM2's ChatML template renders no tools: the generic format (reply.py) carries function calls, and
    a forced custom tool needs no tool syntax at all (the whole reply is its input)."""
    weather = {"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    r = client.responses.create(model="x", input="What is the weather in Oslo?", tools=[weather], temperature=0,
                                tool_choice="required", max_output_tokens=60)
    assert [o.type for o in r.output] == ["function_call"] and "city" in json.loads(r.output[0].arguments)
    dial = {"type": "custom", "name": "dial", "format": {"type": "grammar", "syntax": "regex",
                                                         "definition": "[0-9]{3}-[0-9]{4}"}}
    r = client.responses.create(model="x", input="Call Bob.", tools=[weather, dial], temperature=0,
                                tool_choice={"type": "custom", "name": "dial"}, max_output_tokens=20)
    assert [o.type for o in r.output] == ["custom_tool_call"] and len(r.output[0].input) == 8
