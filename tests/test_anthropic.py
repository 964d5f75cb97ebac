"""Anthropic's Messages API end to end (issue 13.3): a real uvicorn server on SmolLM2 and the real `anthropic`
SDK pointed at it (``base_url``, ``api_key``), raw httpx for the wire format.

Two servers: ``chatml`` is SmolLM2 with its own template and an API key; ``qwq`` serves SmolLM2 with Qwen's
QwQ-32B template (tests/data/templates/Qwen-QwQ-32B.jinja: ChatML markers, the generation prompt opens
``<think>`` itself, Hermes ``<tool_call>`` tools), one sequence and one waiting place. Whatever SmolLM2 writes
after that prompt is thinking until the thinking budget (``thinking.budget_tokens``) makes the engine force
the close tag; then it answers. Tool calls come from ``tool_choice: any`` (constrained decoding).
Assertions are properties (CPU-independent): streamed equals non-streamed at temperature 0, counts agree,
errors are the SDK's typed exceptions.

(SDK 2.x dropped ``temperature`` from ``messages.create``'s keywords; it goes in ``extra_body``, as the API
still takes it.)"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from helpers import ServerThread

pytestmark = pytest.mark.model

anthropic = pytest.importorskip("anthropic")

API_KEY = "test-key-anthropic"
TEMPLATES = Path(__file__).parent / "data" / "templates"
GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a long story about a cat named Tom."}]
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _serve(smollm_path, home, *, template: str | None = None, api_key: str | None = None, n_parallel: int = 2,
           max_queue: int = 64):
    from localrun.backends import load_engine
    from localrun.config import Settings
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = simple_plan(read_gguf(smollm_path), n_ctx=1024, n_parallel=n_parallel)
    plan.n_threads = plan.n_threads_batch = 1  # 2 shared cores: more threads only spin
    engine = load_engine(smollm_path, plan, chat_template=(TEMPLATES / template).read_text() if template else None)
    app = create_app(engine, Settings(home=home, models_dir=home / "models"),
                     ServeOptions(api_key=api_key, plan=plan, max_queue=max_queue))
    srv = ServerThread(app)
    srv.engine = engine
    return srv


@pytest.fixture(scope="module")
def chatml(smollm_path, tmp_path_factory):
    srv = _serve(smollm_path, tmp_path_factory.mktemp("anthropic_home"), api_key=API_KEY)
    yield srv
    srv.stop()
    srv.engine.close()


@pytest.fixture(scope="module")
def qwq(smollm_path, tmp_path_factory):
    srv = _serve(smollm_path, tmp_path_factory.mktemp("anthropic_qwq"), template="Qwen-QwQ-32B.jinja",
                 n_parallel=1, max_queue=1)
    yield srv
    srv.stop()
    srv.engine.close()


@pytest.fixture(scope="module")
def client(chatml):
    return anthropic.Anthropic(base_url=chatml.url, api_key=API_KEY, timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def qclient(qwq):
    return anthropic.Anthropic(base_url=qwq.url, api_key="unused", timeout=300, max_retries=0)


def plain_and_streamed(c, **kw):
    """The same greedy request plain and streamed (the SDK's accumulator) → (plain, streamed) messages;
    asserts they are the same message apart from the ids."""
    full = c.messages.create(model="x", extra_body=GREEDY, **kw)
    with c.messages.stream(model="x", extra_body=GREEDY, **kw) as s:
        streamed = s.get_final_message()
    a, b = _comparable(full), _comparable(streamed)
    assert a == b
    assert full.usage.output_tokens == streamed.usage.output_tokens > 0
    assert full.usage.input_tokens + full.usage.cache_read_input_tokens == \
        streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens
    return full, streamed


def _comparable(m) -> dict:
    d = m.model_dump(exclude_none=True, exclude={"id", "usage"})
    for block in d["content"]:
        if block["type"] == "tool_use":
            assert block.pop("id").startswith("toolu_")
    return d


def test_message_streamed_equals_plain(client):
    full, _ = plain_and_streamed(client, max_tokens=24, system="You are terse.", messages=ASK)
    assert full.id.startswith("msg_") and full.type == "message" and full.role == "assistant"
    assert [b.type for b in full.content] == ["text"] and full.content[0].text
    assert full.stop_reason in ("end_turn", "max_tokens")
    assert full.stop_reason != "max_tokens" or full.usage.output_tokens == 24


def test_count_tokens_equals_the_prompt_the_message_reports(client):
    kw = {"system": [{"type": "text", "text": "You are terse."}], "messages": ASK}
    n = client.messages.count_tokens(model="x", **kw).input_tokens
    m = client.messages.create(model="x", max_tokens=4, extra_body=GREEDY, **kw)
    assert n > 10 and m.usage.input_tokens + m.usage.cache_read_input_tokens == n
    m2 = client.messages.create(model="x", max_tokens=4, extra_body=GREEDY, **kw)
    assert m2.usage.cache_read_input_tokens > 0  # the same prompt again: its prefix comes from the cache
    assert m2.usage.input_tokens + m2.usage.cache_read_input_tokens == n


def test_prefill_continues_the_last_assistant_turn(client):
    prefill = [*ASK, {"role": "assistant", "content": "The capital of France is"}]
    n = client.messages.count_tokens(model="x", messages=prefill).input_tokens
    assert n > client.messages.count_tokens(model="x", messages=ASK).input_tokens
    full, _ = plain_and_streamed(client, max_tokens=8, messages=prefill)
    assert full.usage.input_tokens + full.usage.cache_read_input_tokens == n
    assert not full.content or not full.content[0].text.startswith("The capital of France is")


def test_raw_stream_is_anthropics_event_sequence(chatml):
    body = {"model": "x", "max_tokens": 12, "temperature": 0, "stream": True, "messages": ASK}
    with httpx.stream("POST", chatml.url + "/v1/messages", json=body, headers={"x-api-key": API_KEY},
                      timeout=300) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    names = [ln.removeprefix("event: ") for ln in lines[0::2]]
    datas = [json.loads(ln.removeprefix("data: ")) for ln in lines[1::2]]
    assert all(ln.startswith("event: ") for ln in lines[0::2]) and all(ln.startswith("data: ") for ln in lines[1::2])
    assert names == [d["type"] for d in datas]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert datas[0]["message"]["usage"]["output_tokens"] == 0 and datas[0]["message"]["content"] == []
    assert datas[2]["content_block"] == {"type": "text", "text": ""}
    assert datas[-2]["delta"]["stop_reason"] in ("end_turn", "max_tokens") and datas[-2]["usage"]["output_tokens"] > 0


@pytest.mark.parametrize("kw, needle", [
    ({"max_tokens": anthropic.omit if hasattr(anthropic, "omit") else anthropic.NOT_GIVEN, "messages": ASK},
     "max_tokens"),
    ({"max_tokens": 8, "messages": [*ASK, {"role": "system", "content": [{"type": "tool_use", "id": "a", "name": "f",
                                                                          "input": {}}]}]}, "text blocks only"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "--mmproj"),  # a model loaded without its projector
    ({"max_tokens": 8, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 8}}, "budget_tokens"),
    # tools on SmolLM2's own template use the generic format (tests/test_generic_tools_server.py), not a 400
])
def test_bad_requests_are_the_sdks_bad_request_error(client, kw, needle):
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(model="x", **kw)
    err = ei.value.body["error"]
    assert ei.value.status_code == 400 and ei.value.body["type"] == "error"
    assert err["type"] == "invalid_request_error" and needle in err["message"], err


def test_errors_keep_the_server_serving_and_other_routes_keep_their_shape(chatml, client):
    h = {"x-api-key": API_KEY}
    r = httpx.post(chatml.url + "/v1/messages", content=b"{not json", headers={**h, "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(chatml.url + "/v1/messages/nope", json={}, headers=h)
    assert r.status_code == 404 and r.json() == {"type": "error", "error": {"type": "not_found_error",
                                                                           "message": r.json()["error"]["message"]}}
    r = httpx.post(chatml.url + "/v1/chat/completions", json={"messages": []}, headers=h)  # x-api-key works here too
    assert r.status_code == 400 and "param" in r.json()["error"]  # OpenAI's shape
    assert client.messages.create(model="x", max_tokens=2, messages=ASK).content is not None


def test_api_key_as_x_api_key_or_bearer(chatml):
    with pytest.raises(anthropic.AuthenticationError) as ei:
        anthropic.Anthropic(base_url=chatml.url, api_key="wrong", max_retries=0).messages.create(
            model="x", max_tokens=2, messages=ASK)
    assert ei.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(chatml.url + "/v1/messages", json={"max_tokens": 2, "messages": ASK})  # no key at all
    assert r.status_code == 401 and r.json()["type"] == "error"
    bearer = anthropic.Anthropic(base_url=chatml.url, auth_token=API_KEY, max_retries=0)  # Authorization: Bearer
    assert bearer.messages.create(model="x", max_tokens=2, messages=ASK).usage.output_tokens > 0
    r = httpx.get(chatml.url + "/api/tags", headers={"x-api-key": API_KEY})
    assert r.status_code == 200


def test_stop_sequence_is_named(client):
    free = client.messages.create(model="x", max_tokens=30, extra_body=GREEDY, messages=STORY)
    text = free.content[0].text
    words = text.split()
    assert len(words) >= 4
    stop = " " + words[3]  # a word the greedy reply writes
    m = client.messages.create(model="x", max_tokens=30, extra_body=GREEDY, messages=STORY,
                               stop_sequences=["NEVER-WRITTEN", stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert text.startswith(m.content[0].text) and stop not in m.content[0].text
    with client.messages.stream(model="x", max_tokens=30, extra_body=GREEDY, messages=STORY,
                                stop_sequences=["NEVER-WRITTEN", stop]) as s:
        sm = s.get_final_message()
    assert (sm.stop_reason, sm.stop_sequence, sm.content[0].text) == (m.stop_reason, m.stop_sequence,
                                                                      m.content[0].text)


def test_thinking_blocks_streamed_equal_plain(qclient, qwq):
    budget = 12
    full, _ = plain_and_streamed(qclient, max_tokens=40, messages=STORY,
                                 thinking={"type": "enabled", "budget_tokens": budget})
    kinds = [b.type for b in full.content]
    assert kinds == ["thinking", "text"], kinds
    think, answer = full.content[0], full.content[1]
    assert think.thinking and think.signature and answer.text
    assert "</think>" not in answer.text and "<think>" not in answer.text
    assert len(qwq.engine.tokenize(think.thinking, add_special=False)) <= budget + 2
    off = qclient.messages.create(model="x", max_tokens=16, extra_body=GREEDY, messages=STORY,
                                  thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]


def test_tool_use_round_trip(qclient):
    """tool_choice any → a tool_use block (constrained), then the assistant tool_use + user tool_result
    history renders and the model answers."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with pytest.raises(anthropic.BadRequestError, match="'nope'"):
        qclient.messages.create(model="x", max_tokens=8, messages=ask, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "nope"})
    full, _ = plain_and_streamed(qclient, max_tokens=60, messages=ask, tools=[WEATHER],
                                 tool_choice={"type": "any"}, thinking={"type": "disabled"})
    calls = [b for b in full.content if b.type == "tool_use"]
    assert calls and full.stop_reason == "tool_use", full
    call = calls[0]
    assert call.name == "get_weather" and isinstance(call.input, dict) and isinstance(call.input.get("city"), str)
    history = ask + [{"role": "assistant", "content": full.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": [{"type": "text", "text": "18 C and sunny"}]}]}]
    n = qclient.messages.count_tokens(model="x", messages=history, tools=[WEATHER],
                                      thinking={"type": "disabled"}).input_tokens  # the prompt depends on it
    answer = qclient.messages.create(model="x", max_tokens=24, extra_body=GREEDY, messages=history, tools=[WEATHER],
                                     thinking={"type": "disabled"})
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == n
    # SmolLM2 may end its turn at once after a tool result: an answer, if an empty one
    assert answer.usage.output_tokens > 0 and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_thinking_history_is_accepted(qclient):
    history = [*STORY, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "A cat story, short.", "signature": "whatever-a-client-kept"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Tom was a cat."}]},
        {"role": "user", "content": "Go on."}]
    m = qclient.messages.create(model="x", max_tokens=8, extra_body=GREEDY, messages=history,
                                thinking={"type": "enabled", "budget_tokens": 4})
    assert m.usage.output_tokens > 0


def test_full_queue_is_529_overloaded(qwq, qclient):
    """One sequence, one waiting place: a third request is refused with Anthropic's 529 overloaded_error (which
    the SDK retries after Retry-After), and the server goes on serving."""
    # the one sequence is held by a stream that cannot end by itself before r.close(): OpenAI's route with
    # ignore_eos (llama-server's extension; the queue is the server's, whatever the wire format), 900 tokens of
    # the 1024-token context. A greedy story's length is the CPU's (its end-of-text can be a near-tie).
    body = {"model": "x", "max_tokens": 900, "stream": True, "ignore_eos": True, "temperature": 0,
            "messages": STORY}
    with httpx.stream("POST", qwq.url + "/v1/chat/completions", json=body, timeout=300) as r:
        # one iterator, kept: `next(r.iter_lines())` dropped its generator at once, and closing it closes httpx's
        # stream and the connection, so the server cancelled the story. Whether the waiting request then
        # queued, or the third was refused, was a race (failed 1 run in 4 here).
        lines = r.iter_lines()
        next(lines)  # the one sequence is taken
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(qclient.messages.create, model="x", max_tokens=2, messages=ASK)
            deadline = time.monotonic() + 60
            while httpx.get(qwq.url + "/health").json()["queued"] < 1:
                assert time.monotonic() < deadline and not waiting.done()
                time.sleep(0.05)
            with pytest.raises(anthropic.InternalServerError) as ei:
                qclient.messages.create(model="x", max_tokens=2, messages=ASK)
            r.close()  # the first stream ends: the waiting request gets the sequence
            assert waiting.result(timeout=300).usage.output_tokens > 0
    assert ei.value.status_code == 529 and ei.value.body["error"]["type"] == "overloaded_error"
    assert ei.value.response.headers.get("retry-after")
    assert qclient.messages.create(model="x", max_tokens=2, messages=ASK).usage.output_tokens > 0


def test_sdk_accumulator_rebuilds_every_block_type():
    """Thinking, text and two tool calls (one with streamed argument pieces, one without) through the SDK's own
    stream accumulator give exactly the non-streamed message (no model: the events are built by hand)."""
    from anthropic.lib.streaming._messages import accumulate_event

    from localrun.dialects.reply import Delta, ToolCallArgs, ToolCallEnd, ToolCallStart
    from localrun.server.anthropic.convert import MessageBuilder

    b = MessageBuilder("m", prompt_tokens=30, cached_tokens=10)
    events = b.start()
    for e in [Delta("thinking", "Let me "), Delta("thinking", "think."), Delta("content", "Calling it."),
              ToolCallStart(0, "c0", "get_weather"), ToolCallArgs(0, '{"city": '), ToolCallArgs(0, '"Paris"}'),
              ToolCallEnd(0, {"city": "Paris"}), ToolCallStart(1, "c1", "get_weather"),
              ToolCallEnd(1, {"city": "Rome"})]:
        events += b.feed(e)
    events += b.finish("tool_calls", 17)
    snap, bufs = None, {}
    for _, data in events:
        snap = accumulate_event(event=json.loads(json.dumps(data)), current_snapshot=snap, json_bufs=bufs)
    msg = b.message()
    assert snap.model_dump(exclude_none=True) == {k: v for k, v in msg.items() if v is not None}
    assert [c["type"] for c in msg["content"]] == ["thinking", "text", "tool_use", "tool_use"]
