"""The Responses wing's pure parts (issue 28), without a model: input items → the template's messages,
tools and tool_choice, reply events → output items and stream events, and the SQLite store."""

from __future__ import annotations

import json

import pytest

from localrun.backends.base import Stats
from localrun.dialects import Delta, ToolCallArgs, ToolCallEnd, ToolCallStart
from localrun.errors import ConstraintError
from localrun.server.errors import RequestError
from localrun.server.responses import convert as cv
from localrun.server.responses.events import OutputBuilder
from localrun.server.responses.store import ResponseStore, owner_of


def test_items_become_one_assistant_turn_per_reply():
    items = cv.check_items([
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "custom_tool_call", "call_id": "c2", "name": "shell", "input": "ls docs"},
        {"type": "function_call_output", "call_id": "c1", "output": "12 C"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "a.md"},
        {"role": "developer", "content": "Be terse."},
    ], {})
    assert all(i["id"] for i in items)
    msgs = cv.messages_from_items("You help.", items)
    assert msgs == [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me see.", "reasoning_content": "think", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "shell", "arguments": '{"input": "ls docs"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "12 C"},
        {"role": "tool", "tool_call_id": "c2", "name": "shell", "content": "a.md"},
        {"role": "system", "content": "Be terse."}]


def test_encrypted_reasoning_round_trips():
    enc = cv.encode_reasoning("hmm")
    items = cv.check_items([{"type": "reasoning", "summary": [], "encrypted_content": enc},
                            {"role": "assistant", "content": "Yes."}], {})
    assert cv.messages_from_items(None, items) == [{"role": "assistant", "content": "Yes.",
                                                    "reasoning_content": "hmm"}]


@pytest.mark.parametrize("item, param", [
    ({"type": "banana"}, "input[0].type"),
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}, "input[0].arguments"),
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": '"Paris"'}, "input[0].arguments"),
    ({"type": "function_call_output", "output": "x"}, "input[0].call_id"),  # no call to answer
    ({"text": "no type"}, "input[0].type"),
    ({"type": "function_call_output", "call_id": "nope", "output": "x"}, "input[0].call_id"),
    ({"type": "function_call", "call_id": "c", "name": "f"}, "input[0].arguments"),
    ({"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}, "input[0].content[0].type"),
    ({"role": "user", "content": 5}, "input[0].content"),
    ({"type": "item_reference", "id": "msg_1"}, "input[0].type"),
    ("text", "input[0]"),
])
def test_bad_items_name_their_field(item, param):
    with pytest.raises(RequestError) as ei:
        cv.check_items([item], {})
    assert ei.value.param == param


def test_items_clients_send_back_are_accepted():
    """Codex sends calls and outputs without call_id and hosted tools' items: a call takes its id, an output
    answers the earliest unanswered call (by name when it has one), hosted items are left out."""
    items = cv.check_items([
        {"type": "function_call", "id": "fc_1", "name": "shell", "arguments": "{}"},
        {"type": "function_call", "name": "read", "arguments": "{}"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
        {"type": "function_call_output", "name": "read", "output": "r"},
        {"type": "function_call_output", "output": "s"},
        {"type": "local_shell_call", "call_id": None, "status": "completed", "action": {}}], {})
    assert [it["type"] for it in items] == ["function_call", "function_call", "function_call_output",
                                            "function_call_output"]
    assert items[0]["call_id"] == "fc_1" and items[1]["call_id"].startswith("call_")
    assert items[2]["call_id"] == items[1]["call_id"] and items[3]["call_id"] == "fc_1"
    msgs = cv.messages_from_items(None, items)
    assert [m["role"] for m in msgs] == ["assistant", "tool", "tool"] and msgs[1]["name"] == "read"


def test_tools_and_tool_choice():
    fn = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    lark = {"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "x"'}}
    s = cv.tool_setup([fn, lark, {"type": "namespace", "name": "ns", "tools": [dict(fn, name="h")]}], None)
    assert [t["function"]["name"] for t in s.chat_tools] == ["f", "g", "h"] and s.choice == "auto"
    assert s.custom["g"].kind == "lark" and s.forced_custom is None and s.namespaces == {"h": "ns"}
    b = OutputBuilder(namespaces=s.namespaces)
    b.feed(ToolCallStart(0, "call_1", "h"))
    b.feed(ToolCallEnd(0, {}))
    assert b.output[0]["namespace"] == "ns" and b.output[0]["arguments"] == "{}"
    s = cv.tool_setup([fn, lark], {"type": "custom", "name": "g"})
    assert s.forced_custom == "g"
    assert cv.tool_setup([fn], {"type": "function", "name": "f"}).choice == {"type": "function",
                                                                           "function": {"name": "f"}}
    s = cv.tool_setup([fn, lark], {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function",
                                                                                             "name": "f"}]})
    assert [t["function"]["name"] for t in s.chat_tools] == ["f"] and s.choice == "required"
    # hosted tools (Codex sends web_search by default) are left out; forcing one is a 400
    s = cv.tool_setup([{"type": "web_search", "external_web_access": False}, fn,
                       {"type": "namespace", "name": "ns", "tools": [{"type": "file_search"}]}], None)
    assert [t["function"]["name"] for t in s.chat_tools] == ["f"] and s.choice == "auto"
    assert cv.tool_setup([{"type": "web_search"}], None).chat_tools is None
    assert cv.tool_setup([dict(fn, strict=True)], None).chat_tools[0]["function"]["strict"] is True
    for tools, choice, param in [([{"type": "web_search"}], {"type": "web_search"}, "tool_choice.type"),
                                 ([{"name": "x"}], None, "tools[0].type"),
                                 ([fn], {"type": "custom", "name": "f"}, "tool_choice.name"),
                                 ([fn], "sometimes", "tool_choice"),
                                 ([], "required", "tool_choice"),
                                 ([{"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": "ebnf",
                                                                             "definition": "x"}}], None,
                                  "tools[0].format.syntax")]:
        with pytest.raises(RequestError) as ei:
            cv.tool_setup(tools, choice)
        assert ei.value.param == param
    with pytest.raises(ConstraintError):
        cv.tool_setup([{"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": "regex",
                                                                 "definition": "(?=a)b"}}], None)


def test_output_items_and_their_stream_events():
    b = OutputBuilder(custom={"shell"}, encrypted_reasoning=True)
    events = []
    for e in [Delta("thinking", "hm"), Delta("thinking", "m"), Delta("content", "\n\n"), Delta("content", "Hi"),
              Delta("content", "!"), ToolCallStart(0, "call_1", "f"), ToolCallArgs(0, '{"a":'),
              ToolCallArgs(0, " 1}"), ToolCallEnd(0, {"a": 1}), Delta("content", "\n"),
              ToolCallStart(1, "call_2", "shell"), ToolCallArgs(1, '{"input": "ls"}'),
              ToolCallEnd(1, {"input": "ls"})]:
        events += b.feed(e)
    events += b.finish()
    out = b.output
    assert [o["type"] for o in out] == ["reasoning", "message", "function_call", "custom_tool_call"]
    assert out[0]["content"] == [{"type": "reasoning_text", "text": "hmm"}] and out[0]["encrypted_content"]
    assert out[1]["content"][0]["text"] == "\n\nHi!" and out[1]["status"] == "completed"
    assert out[2]["arguments"] == '{"a": 1}' and out[2]["call_id"] == "call_1"
    assert out[3]["input"] == "ls" and out[3]["call_id"] == "call_2"
    types = [e["type"] for e in events]
    assert types == [
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
        "response.output_item.done"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1, 2, 3]
    assert events[-1]["item"] == out[3]


def test_a_forced_custom_tool_is_the_whole_reply():
    b = OutputBuilder(custom={"g"}, forced_custom="g")
    events = b.feed(Delta("content", "ls ")) + b.feed(Delta("content", "docs")) + b.finish()
    assert b.output[0]["type"] == "custom_tool_call" and b.output[0]["input"] == "ls docs"
    assert [e["type"] for e in events] == ["response.output_item.added", "response.custom_tool_call_input.delta",
                                           "response.custom_tool_call_input.delta",
                                           "response.custom_tool_call_input.done", "response.output_item.done"]


def test_the_store_scopes_by_key_and_keeps_a_bounded_number(tmp_path):
    db = tmp_path / "r.db"
    s = ResponseStore(db, scoped=True, max_rows=3)
    a, b = owner_of("key-a"), owner_of("key-b")
    for i in range(5):
        s.put({"id": f"resp_{i}", "model": "m", "output": []}, owner=a, input_items=[{"id": i}])
    assert s.get("resp_0", a) is None and s.get("resp_4", a)["input"] == [{"id": 4}]
    assert s.get("resp_4", b) is None and not s.delete("resp_4", b)
    s.close()
    s = ResponseStore(db, scoped=False)  # reopened (a restart), without keys: every response is visible
    assert s.get("resp_4", b)["response"]["id"] == "resp_4"
    assert s.delete("resp_4", b) and s.get("resp_4", a) is None
    s.close()


def test_a_conversation_is_the_chain_of_its_responses(tmp_path):
    s = ResponseStore(tmp_path / "r.db", scoped=True)
    a = owner_of("k")
    prev = None
    for i in range(3):
        s.put({"id": f"resp_{i}", "previous_response_id": prev, "output": [{"id": f"out{i}"}]}, owner=a,
              input_items=[{"id": f"in{i}"}])
        prev = f"resp_{i}"
    assert [x["id"] for x in s.conversation("resp_2", a)] == ["in0", "out0", "in1", "out1", "in2", "out2"]
    assert s.conversation("resp_2", owner_of("other")) is None
    s.delete("resp_1", a)
    assert s.conversation("resp_2", a) is None  # a link is gone
    assert [x["id"] for x in s.conversation("resp_0", a)] == ["in0", "out0"]
    s.close()


def test_stats_shape_the_usage():
    from localrun.server.reply import Finish
    from localrun.server.responses.resource import final

    r = final({"id": "resp_x", "output": []}, [], Finish("length", Stats(prompt_tokens=10, completion_tokens=4,
                                                                          cached_tokens=6), reasoning_tokens=2))
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 6}, "output_tokens": 4,
                          "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 14}
    json.dumps(r)
