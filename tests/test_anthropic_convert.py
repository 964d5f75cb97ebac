"""Anthropic Messages API, the pure half (no model): request → chat history / tools / reasoning / sampling,
reply events → Anthropic blocks and stream events (checked against the real `anthropic` SDK's own stream
accumulator), and the error shape."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from localrun.dialects.reply import Delta, ToolCallArgs, ToolCallEnd, ToolCallStart
from localrun.server.anthropic import convert as ac
from localrun.server.anthropic.schemas import CountTokensRequest, MessagesRequest
from localrun.server.errors import RequestError

TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def req(**kw) -> MessagesRequest:
    body = {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **kw}
    return MessagesRequest.model_validate(body)


def test_history_from_a_tool_use_round_trip():
    r = req(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call the tool.", "signature": "abc"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
            {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}}]},
    ])
    h = ac.history_from_anthropic(r)
    assert h[0] == {"role": "system", "content": "Be brief.\n\nUse tools."}
    assert h[1] == {"role": "user", "content": "Weather in Paris?"}
    a = h[2]
    assert a["role"] == "assistant" and a["content"] == "Let me check."
    assert a["reasoning_content"] == "I should call the tool."
    call = a["tool_calls"][0]
    assert call["id"] == "toolu_1" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}  # a JSON string, as OpenAI's
    assert h[3] == {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "18 C"}
    assert h[4] == {"role": "user", "content": "And tomorrow?"}
    assert len(h) == 5


def test_tool_result_forms_and_errors():
    r = req(messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "boom",
                                      "is_error": True}]},
    ])
    h = ac.history_from_anthropic(r)
    assert h[1]["content"] is None and h[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert h[2] == {"role": "tool", "tool_call_id": "t1", "name": "f", "content": "Error: boom"}
    assert len(h) == 3  # no empty user turn after the results
    with pytest.raises(RequestError, match="belongs in a user turn"):
        ac.history_from_anthropic(req(messages=[{"role": "assistant", "content": [
            {"type": "tool_result", "tool_use_id": "x", "content": "y"}]}]))


def test_prefill_is_the_last_assistant_text():
    assert ac.prefill_text(req()) is None
    r = req(messages=[{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{"}])
    assert ac.prefill_text(r) == "{"
    r = req(messages=[{"role": "user", "content": "go"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}])
    with pytest.raises(RequestError, match="tool_result"):
        ac.prefill_text(r)


def test_tools_and_tool_choice_map_to_openai():
    tools, choice = ac.tools_from_anthropic(req(tools=TOOLS))
    assert choice == "auto"
    assert tools == [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                       "parameters": TOOLS[0]["input_schema"]}}]
    assert ac.tools_from_anthropic(req(tools=TOOLS, tool_choice={"type": "any"}))[1] == "required"
    assert ac.tools_from_anthropic(req(tools=TOOLS, tool_choice={"type": "none"}))[1] == "none"
    named = ac.tools_from_anthropic(req(tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}))[1]
    assert named == {"type": "function", "function": {"name": "get_weather"}}
    with pytest.raises(RequestError, match="needs 'name'"):
        ac.tools_from_anthropic(req(tools=TOOLS, tool_choice={"type": "tool"}))
    with pytest.raises(RequestError, match="needs 'tools'"):
        ac.tools_from_anthropic(req(tool_choice={"type": "any"}))
    assert ac.tools_from_anthropic(req()) == (None, None)


def test_thinking_maps_to_the_one_reasoning_control():
    assert ac.reasoning_from_anthropic(req()) == (None, None, None)
    assert ac.reasoning_from_anthropic(req(thinking={"type": "enabled", "budget_tokens": 40})) == (True, None, 40)
    assert ac.reasoning_from_anthropic(req(thinking={"type": "disabled"})) == (False, None, None)
    assert ac.reasoning_from_anthropic(req(thinking={"type": "adaptive", "display": "omitted"})) == (True, None, None)
    assert ac.reasoning_from_anthropic(req(output_config={"effort": "max"})) == (True, "high", None)
    assert ac.reasoning_from_anthropic(req(thinking={"type": "disabled"}, output_config={"effort": "low"})) == \
        (False, None, None)
    with pytest.raises(RequestError, match="greater than thinking.budget_tokens"):
        ac.reasoning_from_anthropic(req(thinking={"type": "enabled", "budget_tokens": 64}))
    with pytest.raises(RequestError, match="budget_tokens is required"):
        ac.reasoning_from_anthropic(req(thinking={"type": "enabled"}))
    # count_tokens has no max_tokens: any budget is fine there
    ct = CountTokensRequest.model_validate({"messages": [{"role": "user", "content": "x"}],
                                            "thinking": {"type": "enabled", "budget_tokens": 5000}})
    assert ac.reasoning_from_anthropic(ct) == (True, None, 5000)


def test_sampling_takes_anthropic_defaults_and_fields():
    p = ac.sampling_from_anthropic(req(stop_sequences=["\n\nHuman:", ""], temperature=0, top_k=5))
    assert p.max_tokens == 64 and list(p.stop) == ["\n\nHuman:"]
    assert p.temperature == 0 and p.top_k == 5 and p.top_p == 1.0 and p.min_p == 0.0
    assert ac.sampling_from_anthropic(req()).temperature == 1.0  # Anthropic's default
    assert ac.sampling_from_anthropic(req()).constraint is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    c = ac.sampling_from_anthropic(req(output_config={"format": {"type": "json_schema", "schema": schema}})).constraint
    assert (c.kind, c.source, c.param) == ("json_schema", schema, "output_config.format.schema")


def test_system_turns_inside_messages_stay_in_order():
    """Claude Code sends system turns inside ``messages`` (with its per-turn ``output_config``): each becomes a
    system message where it stands; the chat template places or merges it (tests/test_templates.py)."""
    r = req(system="Top.", messages=[{"role": "user", "content": "hi"},
                                     {"role": "system", "content": [{"type": "text", "text": "Reminder."}],
                                      "output_config": {"effort": "low"}},
                                     {"role": "user", "content": "again"}])
    assert ac.history_from_anthropic(r) == [{"role": "system", "content": "Top."}, {"role": "user", "content": "hi"},
                                            {"role": "system", "content": "Reminder."},
                                            {"role": "user", "content": "again"}]


@pytest.mark.parametrize("body, needle", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}, "an image source is"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                                                   "content": [{"type": "image"}]}]}]},
     "must be of type 'text'"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a"}]}]},
     "(tool_use) name"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "localrun reads"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]},
     "needs 'input_schema'"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "greater than 0"),
    ({"max_tokens": 5, "messages": []}, "at least 1"),
])
def test_bad_requests_name_the_problem(body, needle):
    with pytest.raises(ValidationError) as ei:
        MessagesRequest.model_validate(body)
    assert needle in str(ei.value)


def test_server_tools_are_left_out_and_a_strict_tool_is_marked(caplog):
    """Anthropic's own tool types (web_search_…, code_execution_…, bash_…) are accepted and not shown to the
    model, logged once; tool_choice naming one is a 400; ``strict: true`` reaches the constraint."""
    from localrun.server.errors import RequestError

    tools = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
             {"type": "code_execution_20250825", "name": "code_execution"},
             {"name": "Read", "input_schema": {"type": "object"}, "strict": True}]
    req = MessagesRequest.model_validate({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                                          "tools": tools})
    with caplog.at_level("INFO", logger="localrun.server"):
        for _ in range(2):
            out, choice = ac.tools_from_anthropic(req)
    assert [t["function"]["name"] for t in out] == ["Read"] and out[0]["function"]["strict"] is True
    assert choice == "auto"
    assert sum("web_search" in r.getMessage() for r in caplog.records) == 1
    only_hosted = MessagesRequest.model_validate({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                                                  "tools": tools[:1]})
    assert ac.tools_from_anthropic(only_hosted) == (None, None)
    forced = MessagesRequest.model_validate({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                                             "tools": tools, "tool_choice": {"type": "tool", "name": "web_search"}})
    with pytest.raises(RequestError, match="Anthropic's servers"):
        ac.tools_from_anthropic(forced)


def _events():
    return [Delta("thinking", "Let me "), Delta("thinking", "think."), Delta("content", ""),
            Delta("content", "Calling "), Delta("content", "it."),
            ToolCallStart(0, "call_x", "get_weather"), ToolCallArgs(0, '{"city": '), ToolCallArgs(0, '"Paris"}'),
            ToolCallEnd(0, {"city": "Paris"}),
            ToolCallStart(1, "call_y", "get_weather"), ToolCallEnd(1, {"city": "Rome"})]


def test_builder_blocks_and_events():
    """(The same events through the `anthropic` SDK's own accumulator: test_anthropic.py; importing the SDK
    takes seconds, too slow for the fast tier.)"""
    b = ac.MessageBuilder("smollm", prompt_tokens=30, cached_tokens=10)
    events = b.start()
    for e in _events():
        events += b.feed(e)
    events += b.finish("tool_calls", 17, prompt_tokens=30, cached_tokens=10)
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 4
    assert all(d["type"] == n for n, d in events)
    msg = b.message()
    assert [c["type"] for c in msg["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert msg["content"][0]["thinking"] == "Let me think."
    assert msg["content"][0]["signature"] == ac.thinking_signature("Let me think.")
    assert msg["content"][1]["text"] == "Calling it."
    assert msg["content"][2]["input"] == {"city": "Paris"} and msg["content"][3]["input"] == {"city": "Rome"}
    assert msg["content"][2]["id"].startswith("toolu_") and msg["id"].startswith("msg_")
    assert msg["stop_reason"] == "tool_use"
    assert msg["usage"] == {"input_tokens": 20, "output_tokens": 17, "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 10}
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"] == \
        ['{"city": ', '"Paris"}', '{"city": "Rome"}']  # a call without streamed pieces sends its input whole
    assert sum(d["type"] == "signature_delta" for d in deltas) == 1
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert starts[0] == {"type": "thinking", "thinking": "", "signature": ""}
    assert starts[2] == {"type": "tool_use", "id": msg["content"][2]["id"], "name": "get_weather", "input": {}}


def test_stop_reasons():
    for reason, want in [("stop", "end_turn"), ("length", "max_tokens"), ("loop", "end_turn"),
                         ("cancelled", "end_turn")]:
        b = ac.MessageBuilder("m", 3)
        b.feed(Delta("content", "x"))
        b.finish(reason, 1)
        assert b.message()["stop_reason"] == want
    b = ac.MessageBuilder("m", 3)
    b.feed(Delta("content", "x"))
    out = b.finish("stop", 1, stop_sequence="END")
    assert out[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert b.message()["stop_sequence"] == "END"
    b = ac.MessageBuilder("m", 3)
    b.finish("stop", 0)
    assert b.message()["content"] == [] and b.message()["stop_reason"] == "end_turn"


def test_error_shape():
    assert ac.error_response(400, "bad") == (400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                              "message": "bad"}})
    assert ac.error_response(503, "busy", overloaded=True)[0] == 529
    assert ac.error_response(503, "busy", overloaded=True)[1]["error"]["type"] == "overloaded_error"
    assert ac.error_response(401, "key")[1]["error"]["type"] == "authentication_error"
    assert ac.error_response(404, "no")[1]["error"]["type"] == "not_found_error"
    assert ac.error_response(413, "big")[1]["error"]["type"] == "request_too_large"
    assert ac.error_response(500, "oops")[1]["error"]["type"] == "api_error"
    assert ac.is_anthropic_path("/v1/messages") and ac.is_anthropic_path("/v1/messages/count_tokens")
    assert not ac.is_anthropic_path("/v1/messagesx") and not ac.is_anthropic_path("/v1/chat/completions")


def test_sse_framing():
    assert ac.sse_event("ping", {"type": "ping"}) == 'event: ping\ndata: {"type":"ping"}\n\n'


def test_heartbeats_fill_the_silences():
    """A reply that is slow to start (a long prefill) gets heartbeats meanwhile (every wing turns them into
    its own event: server/heartbeat.py); the events themselves are all delivered, in order."""
    import asyncio

    from localrun.server.heartbeat import with_heartbeats

    async def slow():
        await asyncio.sleep(0.3)
        yield "a"
        yield "b"

    async def run():
        return [e async for e in with_heartbeats(slow(), interval_s=0.05)]

    got = asyncio.run(run())
    assert got[-2:] == ["a", "b"] and got[:-2] and set(got[:-2]) == {None}
