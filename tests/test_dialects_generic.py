"""The generic tool-call format (``dialects.generic``, llama-server's fallback for templates without tool
syntax): the reply reader on every cut of the text, the history written as text, the system message, and
the grammar (``constrain.generic_constraint``) checked by llguidance and matched against real answers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from localrun.dialects import Delta, ReplyParser, ToolCallArgs, ToolCallEnd, ToolCallStart, detect_family
from localrun.dialects.generic import GenericReply, add_system, history_as_text, instructions
from localrun.dialects.history import messages_for_template
from localrun.dialects.reply import merged

GENERIC = replace(detect_family("{{ messages }}"), tools="generic")
OSLO = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                       "required": ["zone"]}}}


def events(text: str, cut: int) -> list:
    p = ReplyParser(GENERIC, thinking=False, tools=True)
    out = []
    for i in range(0, len(text), cut):
        out += p.feed(text[i:i + cut])
    return merged(out + p.finish())


def shape(evs: list) -> list:
    return [(type(e).__name__, getattr(e, "channel", None), getattr(e, "text", None), getattr(e, "name", None),
             getattr(e, "arguments", None)) for e in evs]


CASES = [
    ('{"response": "Hi \\"you\\"\\n\\u00e9\\ud83d\\ude00!"}', [Delta("content", 'Hi "you"\né😀!')]),
    ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}',
     [ToolCallStart(0, "", "get_weather"), ToolCallArgs(0, '{"city": "Oslo"}'), ToolCallEnd(0, {"city": "Oslo"})]),
    ('{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]}',
     [ToolCallStart(0, "", "a"), ToolCallArgs(0, "{}"), ToolCallEnd(0, {}),
      ToolCallStart(1, "", "b"), ToolCallArgs(1, '{"x": 1}'), ToolCallEnd(1, {"x": 1})]),
    ('{"response": {"n": 1}}', [Delta("content", '{"n": 1}')]),  # a JSON response_format's answer
    ("not JSON at all", [Delta("content", "not JSON at all")]),
    ('{"tool_call": {"name": "get_weather", "argu', [Delta("content", '{"tool_call": {"name": "get_weather", "argu')]),
    ('{"other": true}', [Delta("content", '{"other": true}')]),
]


@pytest.mark.parametrize("text, want", CASES)
@pytest.mark.parametrize("cut", [1, 2, 3, 5, 1000])
def test_reply_reader_is_the_same_for_every_cut(text, want, cut):
    got = events(text, cut)
    for e in got:
        if isinstance(e, ToolCallStart):
            assert e.id.startswith("call_")
            e.id = ""
    assert shape(got) == shape(want)


def test_the_answer_streams_before_the_object_closes():
    r = GenericReply()
    assert r.feed('{"respo') == []
    assert r.feed('nse": "Hel') == ["Hel"]
    assert r.feed('lo\\') == ["lo"]  # an escape cut in two waits for its second half
    assert r.feed('n"}') == ["\n"]
    assert r.finish() == []


def test_instructions_and_system_message():
    text = instructions([WEATHER, TIME])
    assert '"get_weather"' in text and '"tool_call"' in text and '"response"' in text
    # one wording for every tool_choice (the constraint narrows the reply), so the prompt prefix is shared
    assert instructions([WEATHER, TIME], name="get_time") == instructions([WEATHER, TIME], required=True) == text
    assert '"tool_calls"' in instructions([WEATHER], parallel=True)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    got = add_system(msgs, "TOOLS")
    assert got[0] == {"role": "system", "content": "Be brief.\n\nTOOLS"} and msgs[0]["content"] == "Be brief."
    assert add_system(msgs[1:], "TOOLS") == [{"role": "system", "content": "TOOLS"}, msgs[1]]


def test_history_is_written_as_generic_text():
    msgs = [{"role": "user", "content": "Weather in Oslo and Bergen?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": OSLO},
                {"id": "c2", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Bergen"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 3}'},
            {"role": "tool", "tool_call_id": "c2", "content": "rain"},
            {"role": "assistant", "content": "Checking once more.", "tool_calls": [
                {"id": "c3", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}]},
            {"role": "tool", "tool_call_id": "c3", "content": "12:00"},
            {"role": "user", "content": "Thanks"}]
    out = messages_for_template(msgs, GENERIC)
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant", "user", "user"]
    assert all("tool_calls" not in m for m in out)
    assert json.loads(out[1]["content"]) == {"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Oslo"}},
        {"name": "get_weather", "arguments": {"city": "Bergen"}}]}
    results = [json.loads(line) for line in out[2]["content"].splitlines()]
    assert results == [
        {"tool_response": {"tool": "get_weather", "tool_call_id": "c1", "content": {"temp_c": 3}}},
        {"tool_response": {"tool": "get_weather", "tool_call_id": "c2", "content": "rain"}}]
    said, call = out[3]["content"].split("\n")
    assert said == "Checking once more." and json.loads(call) == {
        "tool_call": {"name": "get_time", "arguments": {"zone": "CET"}}}
    assert history_as_text([{"role": "user", "content": "x"}]) == [{"role": "user", "content": "x"}]


def test_history_renders_on_templates_without_tool_roles():
    from localrun.model.chat_template import BUILTIN_TEMPLATES, ChatTemplate

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": OSLO}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    for name in ("gemma", "chatml", "llama3", "phi3"):
        text = ChatTemplate(BUILTIN_TEMPLATES[name]).render(messages_for_template(msgs, GENERIC))
        assert '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}' in text, name
        assert '"tool_response"' in text and "sunny" in text, name


@pytest.mark.parametrize("kw, answers, refused", [
    ({}, ['{"response": "hi"}', '{"tool_call": {"name": "get_time", "arguments": {"zone": "UTC"}}}'],
     ['{"tool_call": {"name": "get_time", "arguments": {"zone": "EST"}}}', '{"response": 1}']),
    ({"required": True}, ['{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}'],
     ['{"response": "hi"}']),
    ({"name": "get_time"}, ['{"tool_call": {"name": "get_time", "arguments": {"zone": "CET"}}}'],
     ['{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}']),
    ({"parallel": True}, ['{"tool_calls": [{"name": "get_time", "arguments": {"zone": "CET"}}, '
                          '{"name": "get_weather", "arguments": {"city": "Oslo"}}]}'],
     ['{"tool_calls": []}', '{"tool_call": {"name": "get_time", "arguments": {"zone": "CET"}}}']),
    ({"response": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
     ['{"response": {"n": 2}}'], ['{"response": "two"}']),
])
def test_generic_constraint_accepts_the_format_and_nothing_else(kw, answers, refused):
    import llguidance as llg

    from localrun.constrain import check, generic_constraint

    grammar = check(generic_constraint([WEATHER, TIME], **kw))
    tok = llg.LLTokenizer(llg.TokenizerWrapper(_ByteTokenizer()))
    for text, ok in [(a, True) for a in answers] + [(r, False) for r in refused]:
        m = llg.LLMatcher(tok, grammar)
        accepted = m.consume_tokens(list(text.encode())) and m.is_accepting()
        assert bool(accepted) is ok and (not ok or not m.is_error()), (kw, text, m.get_error())


def test_tool_call_constraint_takes_the_generic_syntax():
    from localrun.constrain import check, tool_call_constraint

    c = tool_call_constraint("generic", [WEATHER], "get_weather")
    assert '"tool_call"' in c.source and '"response"' not in check(c) + c.source


class _ByteTokenizer:
    """A 256-token byte vocabulary (each token one byte) for llguidance's matcher."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]
    special_token_ids = [256]

    def __call__(self, s):
        return list(s.encode() if isinstance(s, str) else s)


def test_serve_no_generic_tools_flag_reaches_the_server(monkeypatch, tmp_path):
    """``localrun serve --no-generic-tools`` → ``run_server(generic_tools=False)`` (default True), which sets
    ``ServeOptions.generic_tools`` (the field ``reply.prepare_chat`` and the Ollama wing read)."""
    from helpers import serve_run_kwargs

    from localrun.server.runtime import ServeOptions

    assert serve_run_kwargs(monkeypatch, tmp_path)["generic_tools"] is True
    assert serve_run_kwargs(monkeypatch, tmp_path, "--no-generic-tools")["generic_tools"] is False
    assert ServeOptions().generic_tools is True


class _Engine:
    """What ``reply.prepare_chat`` reads of an engine: a template without tool syntax; it records the render."""

    template_source = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    supports_tools = False

    def tokenize_chat(self, msgs, *, tools=None, template_kwargs=None, parse_special_in_content=False):
        self.msgs, self.tools = msgs, tools
        return "prompt", [1, 2, 3]


class _State:
    def __init__(self, **options) -> None:
        from localrun.server.runtime import ServeOptions

        self.engine, self.options, self.model_id = _Engine(), ServeOptions(**options), "m"

    def check_fits(self, tokens) -> None:
        pass


def _prepare(st, messages, **kw):
    import asyncio

    from localrun.backends.base import SamplingParams
    from localrun.server.reply import prepare_chat

    params = SamplingParams()
    kw = {"tools": [WEATHER, TIME], "tool_choice": None, **kw}
    got = asyncio.run(prepare_chat(st, messages, think=None, level=None, budget=None, params=params, **kw))
    return got, params


def test_prepare_chat_uses_the_generic_format_on_a_template_without_tool_syntax():
    st = _State()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    (_, _, family, opts), params = _prepare(st, msgs)
    assert family.tools == "generic" and opts.tools and opts.tool_choice == "auto"
    assert st.engine.tools is None  # the template never sees `tools`: the system message describes them
    sys_text = st.engine.msgs[0]["content"]
    assert sys_text.startswith("Be brief.\n\n") and '"get_weather"' in sys_text and '"response"' in sys_text
    assert params.constraint.kind == "lark" and '"response"' in params.constraint.source
    (_, _, family, _), params = _prepare(st, msgs[1:], tool_choice={"type": "function",
                                                                   "function": {"name": "get_time"}})
    assert st.engine.msgs[0]["role"] == "system" and st.engine.msgs[0]["content"] == sys_text.removeprefix(
        "Be brief.\n\n")  # the same tool text as under "auto": the constraint alone names the tool
    assert '"response"' not in params.constraint.source and '"get_weather"' not in params.constraint.source
    (_, _, family, opts), params = _prepare(st, msgs, tool_choice="none")
    # "none": the tools stay described (the prefix the other turns share) and only an answer is allowed
    assert opts.tool_choice == "none" and st.engine.msgs[0]["content"] == sys_text
    assert '"response"' in params.constraint.source and '"tool_call"' not in params.constraint.source


def test_prepare_chat_under_no_generic_tools_refuses_tools():
    from localrun.server.errors import RequestError

    with pytest.raises(RequestError) as ei:
        _prepare(_State(generic_tools=False), [{"role": "user", "content": "hi"}])
    assert ei.value.code == "tools_unsupported" and "--no-generic-tools" in ei.value.hint
