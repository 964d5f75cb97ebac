"""The 2026 templates (Qwen3.5, Qwen3.6, Gemma 4; real texts in tests/data/templates/2026/, their sources in
SOURCES.md there): detected, rendered with tool calls and results, their replies split into thinking,
content and calls, and the prompt of one turn kept as a prefix of the next where the template allows it.

Pure and fast: no model. The "model replies" are written in each template's own syntax, the calls taken from
what the template itself renders for a past call (so the parser reads exactly what the template writes).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from localrun.dialects import Delta, ReplyParser, ToolCallEnd, ToolCallStart, detect_family, template_kwargs
from localrun.dialects.history import messages_for_template
from localrun.dialects.reply import merged
from localrun.model.chat_template import ChatTemplate

TEMPLATES = Path(__file__).parent / "data" / "templates" / "2026"
QWEN35, QWEN36, GEMMA4 = "Qwen-Qwen3.5-4B.jinja", "Qwen-Qwen3.6-27B.jinja", "google-gemma-4-31B-it.jinja"
BOS = {QWEN35: "", QWEN36: "", GEMMA4: "<bos>"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
ARGS = {"city": "Paris", "days": 3}


@functools.cache
def _src(name: str) -> str:
    return (TEMPLATES / name).read_text()


@functools.cache
def _template(name: str) -> ChatTemplate:
    return ChatTemplate(_src(name), bos_token=BOS[name], eos_token="<eos>")


def _render(name: str, messages: list[dict], *, think: bool = True, gen: bool = True) -> str:
    fam = detect_family(_src(name))
    tpl = _template(name)
    return tpl.render(messages_for_template(messages, fam), tools=TOOLS, add_generation_prompt=gen,
                      template_kwargs=template_kwargs(fam, think=think, level=None))


def _parse(name: str, pieces: list[str], *, thinking: bool = True) -> list:
    p = ReplyParser(detect_family(_src(name)), thinking=thinking, tools=True)
    events = []
    for piece in pieces:
        events += p.feed(piece)
    return merged(events + p.finish())


def _assistant(events: list) -> dict:
    """The parsed reply as the assistant message a client sends back (OpenAI shape, reasoning_content)."""
    thinking = "".join(e.text for e in events if isinstance(e, Delta) and e.channel == "thinking")
    content = "".join(e.text for e in events if isinstance(e, Delta) and e.channel == "content")
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    calls = [{"id": s.id, "type": "function", "function": {"name": s.name, "arguments": json.dumps(e.arguments)}}
             for s, e in zip(starts, ends)]
    msg = {"role": "assistant", "content": content or None}
    if thinking:
        msg["reasoning_content"] = thinking
    if calls:
        msg["tool_calls"] = calls
    return msg


# --- detection ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,family,tools,open_,close,opened,drops,keep", [
    (QWEN35, "qwen3.5", "qwen-xml", "<think>", "</think>", True, True, None),
    (QWEN36, "qwen3.5", "qwen-xml", "<think>", "</think>", True, False, "preserve_thinking"),
    (GEMMA4, "gemma4", "gemma4", "<|channel>thought", "<channel|>", False, True, None),
])
def test_detect_the_2026_families(name, family, tools, open_, close, opened, drops, keep):
    fam = detect_family(_src(name))
    t = fam.thinking
    assert (fam.name, fam.tools, t.open, t.close, t.opened_by_template) == (family, tools, open_, close, opened)
    assert (t.drops_history, t.keep_kwarg, t.toggle_kwarg) == (drops, keep, "enable_thinking")
    assert t.budget_close.strip().startswith(close)
    kw = template_kwargs(fam, think=False, level=None)
    assert kw == ({"enable_thinking": False} | ({keep: True} if keep else {}))


def test_qwen36_keeps_earlier_thinking_only_with_preserve_thinking():
    """The real Qwen3.6 template has the kwarg and defaults it off; Qwen3.5-4B's has none."""
    assert "preserve_thinking is defined and preserve_thinking is true" in _src(QWEN36)
    assert "preserve_thinking" not in _src(QWEN35)


# --- a multi-turn conversation with tool calls and results renders ------------------------------------------

HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "reasoning_content": "EARLIER-THOUGHT",
     "tool_calls": [{"id": "call_a", "type": "function",
                     "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "SUNNY-21C"},
    {"role": "assistant", "content": "It is sunny.", "reasoning_content": "ANSWER-THOUGHT"},
    {"role": "user", "content": "And Rome?"},
    {"role": "assistant", "content": None, "reasoning": "CURRENT-THOUGHT",
     "tool_calls": [{"id": "call_b", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
    {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "RAINY-15C"}]},
]


@pytest.mark.parametrize("name", [QWEN35, QWEN36, GEMMA4])
def test_a_tool_conversation_renders(name):
    prompt = _render(name, HISTORY)
    for text in ("You are terse.", "Weather in Paris?", "SUNNY-21C", "It is sunny.", "And Rome?", "RAINY-15C",
                 "get_weather", "Paris", "Rome", "CURRENT-THOUGHT"):
        assert text in prompt, text
    earlier = "EARLIER-THOUGHT" in prompt, "ANSWER-THOUGHT" in prompt
    assert earlier == ((True, True) if name == QWEN36 else (False, False))  # only 3.6 with preserve_thinking
    # the prompt can be tokenised safely (content told apart from the template's markers)
    fam = detect_family(_src(name))
    parts = _template(name).render_parts(
        messages_for_template(HISTORY, fam), tools=TOOLS, template_kwargs=template_kwargs(fam, think=True,
                                                                                           level=None))
    assert "".join(p for p, _ in parts) == prompt
    assert any(is_content and "RAINY-15C" in p for p, is_content in parts)


def test_each_template_writes_calls_in_its_own_syntax():
    assert "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" \
           "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>" in _render(QWEN35, HISTORY)
    assert '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>' in _render(GEMMA4, HISTORY)


# --- replies in the template's own syntax parse into thinking + content + calls ------------------------------

def _call_text(name: str) -> str:
    """The text the template renders for the call of ARGS (cut out of a rendered history)."""
    prompt = _render(name, HISTORY[:4], gen=False)
    prompt = prompt[prompt.index("Weather in Paris?"):]  # after the system prompt's format example
    open_, close = ("<|tool_call>", "<tool_call|>") if name == GEMMA4 else ("<tool_call>", "</tool_call>")
    return prompt[prompt.index(open_):prompt.index(close) + len(close)]


REPLIES = {  # a reply as the model writes it after the generation prompt (Qwen: the template opened <think>)
    QWEN35: "I should look it up.\n</think>\n\nLet me check.\n\n{call}",
    QWEN36: "I should look it up.\n</think>\n\nLet me check.\n\n{call}",
    GEMMA4: "<|channel>thought\nI should look it up.\n<channel|>Let me check.{call}",
}


@pytest.mark.parametrize("name", [QWEN35, QWEN36, GEMMA4])
def test_a_reply_splits_into_thinking_content_and_calls_however_it_is_cut(name):
    reply = REPLIES[name].format(call=_call_text(name) * 2)  # two parallel calls
    want = [Delta("thinking", "I should look it up."), Delta("content", "Let me check.")]
    for cut in [[reply], list(reply)] + [[reply[:i], reply[i:]] for i in range(1, len(reply), 7)]:
        events = _parse(name, cut)
        assert [e for e in events if isinstance(e, Delta)] == want
        assert [(e.index, e.arguments) for e in events if isinstance(e, ToolCallEnd)] == [(0, ARGS), (1, ARGS)]


def test_qwen_xml_values_and_a_malformed_call():
    call = ("<tool_call>\n<function=f>\n<parameter=text>\nline one\nline two\n</parameter>\n"
            "<parameter=n>\n2.5\n</parameter>\n<parameter=flags>\n[\"a\", {\"b\": null}]\n</parameter>\n"
            "</function>\n</tool_call>")
    events = _parse(QWEN35, ["x\n</think>\n\n" + call])
    assert [e.arguments for e in events if isinstance(e, ToolCallEnd)] == [
        {"text": "line one\nline two", "n": 2.5, "flags": ["a", {"b": None}]}]
    bad = "<tool_call>\n<function=f>\nstray text\n</function>\n</tool_call>"
    events = _parse(QWEN35, ["x\n</think>\n\n" + bad])
    assert not any(isinstance(e, ToolCallEnd) for e in events) and bad in events[-1].text  # nothing lost


def test_gemma4_nested_arguments():
    body = '<|tool_call>call:f{a:<|"|>x, y: z<|"|>,b:{c:[1,true,<|"|>q<|"|>]},d:-2}<tool_call|>'
    events = _parse(GEMMA4, [body], thinking=False)
    assert [e.arguments for e in events if isinstance(e, ToolCallEnd)] == [
        {"a": "x, y: z", "b": {"c": [1, True, "q"]}, "d": -2}]


# --- the prompt of one turn is a prefix of the next's ------------------------------------------------------

# a call turn: Qwen writes a line before its call (the template renders it there); Gemma 4 calls at once (its
# template writes a call turn's text after the tool results: see the last test)
CALL_REPLIES = {QWEN35: REPLIES[QWEN35], QWEN36: REPLIES[QWEN36],
                GEMMA4: "<|channel>thought\nI should look it up.\n<channel|>{call}"}
CALL_REPLIES_NO_THINKING = {QWEN35: "Let me check.\n\n{call}", QWEN36: "Let me check.\n\n{call}", GEMMA4: "{call}"}
END = {QWEN35: "<|im_end|>", QWEN36: "<|im_end|>", GEMMA4: "<|tool_response>"}  # what ends a call turn
FINAL = {QWEN35: "It looks fine.\n</think>\n\nSunny.", QWEN36: "It looks fine.\n</think>\n\nSunny.",
         GEMMA4: "<|channel>thought\nIt looks fine.\n<channel|>Sunny."}
FINAL_END = {QWEN35: "<|im_end|>", QWEN36: "<|im_end|>", GEMMA4: "<turn|>"}


def _conversation(name: str, *, think: bool = True) -> list[tuple[str, str]]:
    """(prompt, what the model generated after it) for three requests: a call, the answer after its result,
    then a new user question: a client sending back what the server returned (thinking included)."""
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]
    p1 = _render(name, msgs, think=think)
    r1 = (CALL_REPLIES if think else CALL_REPLIES_NO_THINKING)[name].format(call=_call_text(name))
    msgs += [_assistant(_parse(name, [r1], thinking=think)), {"role": "tool", "tool_call_id": "x",
                                                               "content": "SUNNY-21C"}]
    msgs[-1]["tool_call_id"] = msgs[-2]["tool_calls"][0]["id"]
    p2 = _render(name, msgs, think=think)
    r2 = FINAL[name] if think else "Sunny."
    msgs += [_assistant(_parse(name, [r2], thinking=think)), {"role": "user", "content": "And Rome?"}]
    p3 = _render(name, msgs, think=think)
    return [(p1, r1 + END[name]), (p2, r2 + FINAL_END[name]), (p3, "")]


@pytest.mark.parametrize("name", [QWEN35, QWEN36, GEMMA4])
def test_within_a_tool_chain_each_prompt_extends_the_last(name):
    """After the last user message every template keeps the chain's thinking: the call turn's prompt and
    reply are a prefix of the next prompt (the whole cache is reused)."""
    (p1, r1), (p2, _), _ = _conversation(name)
    assert p2.startswith(p1 + r1)


def test_qwen36_with_preserve_thinking_keeps_every_prompt_a_prefix():
    for think in (True, False):
        (p1, r1), (p2, r2), (p3, _) = _conversation(QWEN36, think=think)
        assert p2.startswith(p1 + r1) and p3.startswith(p2 + r2)


@pytest.mark.parametrize("name", [QWEN35, GEMMA4])
def test_a_template_that_drops_earlier_thinking_cuts_the_prefix_at_the_first_earlier_answer(name):
    """Qwen3.5's and Gemma 4's templates drop a turn's thinking once a new user message follows: the next
    prompt leaves the cached text right after the first earlier assistant turn's header, so everything from
    there (the whole earlier chain, its results, the answer) is prefilled again."""
    (p1, r1), (p2, r2), (p3, _) = _conversation(name)
    cached = p2 + r2
    header = "<|im_start|>assistant\n" if name == QWEN35 else "<|turn>model\n"
    keep = p1[:p1.rindex(header) + len(header)]  # up to the first assistant turn's header
    opener = detect_family(_src(name)).thinking.open
    assert cached.startswith(keep + opener) and p3.startswith(keep) and not p3[len(keep):].startswith(opener)
    assert len(os.path.commonprefix([cached, p3])) - len(keep) <= 2  # "<|" of two markers at most
    assert "I should look it up." in cached and "I should look it up." not in p3


@pytest.mark.parametrize("name,empty", [(QWEN35, "<think>\n\n</think>\n\n"), (GEMMA4, "<|channel>thought\n<channel|>")])
def test_without_thinking_each_turn_rereads_its_reply_after_an_empty_block(name, empty):
    """Thinking off: Qwen3.5's and Gemma 4's generation prompts end with an empty thinking block that history
    does not repeat, so each turn re-reads that block's place and the reply generated after it (Qwen3.6 with
    preserve_thinking repeats it: no cut, test above)."""
    (p1, r1), (p2, r2), (p3, _) = _conversation(name, think=False)
    assert p1.endswith(empty) and p2.endswith(empty) and not p2.startswith(p1 + r1)
    assert p2.startswith(p1.removesuffix(empty) + r1) and p3.startswith(p2.removesuffix(empty) + r2)


def test_gemma4_moves_the_text_before_a_call_after_the_results():
    """Gemma 4's template writes a call turn's content after its tool results (and closes the turn there), so
    a reply with text before its call is not a prefix of the next prompt: the cut falls at the call."""
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    p1 = _render(GEMMA4, msgs)
    r1 = REPLIES[GEMMA4].format(call=_call_text(GEMMA4))
    msgs += [_assistant(_parse(GEMMA4, [r1])), {"role": "tool", "content": "SUNNY-21C"}]  # no id: a name is found
    p2 = _render(GEMMA4, msgs)
    r1 += END[GEMMA4]
    assert "<tool_response|>Let me check.<turn|>" in p2
    common = os.path.commonprefix([p1 + r1, p2])
    assert common == p1 + "<|channel>thought\nI should look it up.\n<channel|>"


# --- a forced call (tool_choice required / a named function) in each template's own syntax -------------------

class _Bytes:
    """A vocabulary of the 256 single bytes plus EOS (id 256): enough for llguidance to run a grammar."""

    eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
    tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]

    def __call__(self, s):
        return list(s.encode() if isinstance(s, str) else s)


@functools.cache
def _byte_tokenizer():
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def _control(constraint):
    from localrun.constrain import GrammarControl
    from localrun.constrain.control import fresh_matcher

    return GrammarControl(fresh_matcher(constraint, _byte_tokenizer()), 257)


ADD = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"},
                                     "op": {"enum": ["plus", "minus"]}}, "required": ["b", "a"]}}}]


@pytest.mark.parametrize("name", [QWEN35, GEMMA4])
def test_a_forced_call_is_written_in_the_templates_syntax_and_parses(name):
    """Random draws under the grammar's mask (a byte vocabulary, no model) end in a call that the family's
    reply parser reads back with the schema's types; the template's own rendering of a call is accepted."""
    import random

    from localrun.constrain import check, tool_call_constraint

    fam = detect_family(_src(name))
    c = tool_call_constraint(fam.tools, ADD, "add", parallel=True)
    check(c)
    for seed in range(3):
        ctl, out = _control(c), b""
        rng = random.Random(seed)
        while not ctl.complete() and len(out) < 400:
            tok = ctl.forced()
            if tok is None:
                allowed = [int(t) for t in ctl.mask().nonzero()[0]]
                tok = rng.choice(allowed)
                if tok == 256:
                    break
            ctl.accept(tok)
            out += bytes([tok])
        ctl.close()
        events = _parse(name, [out.decode()], thinking=False)
        args = [e.arguments for e in events if isinstance(e, ToolCallEnd)]
        assert args and all(isinstance(a["a"], int) and isinstance(a["b"], int) for a in args), out
        assert all(a.get("op", "plus") in ("plus", "minus") for a in args)
    # the call the template renders for get_weather (a string and an integer) is one the grammar takes
    ctl = _control(tool_call_constraint(fam, TOOLS, "get_weather"))
    text = _call_text(name)
    if fam.thinking.opened_by_template:
        text = "Checking.\n</think>\n\n" + text  # Qwen: the block the template opened is closed first
    for b in text.encode():
        ctl.accept(b)
    assert ctl.accepting()
    ctl.close()


# --- through a real server: what keeping earlier thinking saves (SmolLM2 speaks ChatML, as Qwen does) ----------

@pytest.fixture(scope="module")
def qwen_servers(smollm_path, tmp_path_factory):
    """name → a server of SmolLM2 with that Qwen template, one slot, a thinking budget of 6 tokens (SmolLM2
    never closes ``<think>`` itself: the engine closes it, then the model answers)."""
    from dataclasses import replace

    from helpers import ServerThread

    from localrun.backends import load_engine
    from localrun.config import Settings
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = replace(simple_plan(read_gguf(smollm_path), n_ctx=1024, n_parallel=1), n_threads=1, n_threads_batch=1)
    out = {}
    for name in (QWEN35, QWEN36):
        engine = load_engine(smollm_path, plan, chat_template=_src(name))
        home = tmp_path_factory.mktemp("tmpl2026")
        app = create_app(engine, Settings(home=home, models_dir=home / "models"),
                         ServeOptions(plan=plan, reasoning_budget=6))
        out[name] = (ServerThread(app), engine)
    yield out
    for srv, engine in out.values():
        srv.stop()
        engine.close()


def _chat(url: str, messages: list[dict]) -> dict:
    import httpx

    r = httpx.post(url + "/v1/chat/completions", timeout=300,
                   json={"model": "x", "messages": messages, "temperature": 0, "max_tokens": 16})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.model
def test_keeping_earlier_thinking_keeps_the_cache(qwen_servers):
    """Turn 2 sends turn 1's reply back with its thinking. Qwen3.6 (preserve_thinking passed) reuses turn 1's
    whole prompt; Qwen3.5's template drops that thinking, so the cache is cut inside turn 1's prompt (at its
    assistant header, before the ``<think>`` the generation prompt opened). How far into turn 1's reply the
    reuse reaches depends on the model: both templates trim the thinking's edges, and SmolLM2 starts its
    thinking with a newline (a Qwen model trained on the template writes none), so here it stops there."""
    cached = {}
    for name, (srv, _) in qwen_servers.items():
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
        r1 = _chat(srv.url, msgs)
        m = r1["choices"][0]["message"]
        assert m.get("reasoning_content"), m  # the thinking came back apart
        msgs += [{"role": "assistant", "content": m["content"], "reasoning_content": m["reasoning_content"]},
                 {"role": "user", "content": "Another one?"}]
        r2 = _chat(srv.url, msgs)
        n1 = r1["usage"]["prompt_tokens"]
        cached[name] = (r2["usage"]["prompt_tokens_details"]["cached_tokens"], n1)
    c36, n1_36 = cached[QWEN36]
    c35, n1_35 = cached[QWEN35]
    assert n1_36 == n1_35 and c36 >= n1_36  # the same first prompt; all of it reused
    assert c35 < n1_35  # cut inside turn 1's prompt
