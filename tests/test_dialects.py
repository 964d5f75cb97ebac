"""localrun.dialects: template families detected from real templates (tests/data/templates/, SOURCES.md
there), and the reply parser on outputs written with each family's real markers, cut every way (the
property test at the end). Pure and fast: no model. History rendering: test_dialects_history.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from localrun.dialects import (
    Delta,
    ReplyParser,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    detect_family,
    template_kwargs,
)
from localrun.dialects.reply import merged
from localrun.model.chat_template import ChatTemplate

TEMPLATES = Path(__file__).parent / "data" / "templates"
THINK_CLOSE = "\n</think>\n\n"
HARMONY_CLOSE = "<|end|><|start|>assistant<|channel|>final<|message|>"


def source(name: str) -> str:
    return (TEMPLATES / name).read_text()


def family_of(name: str):
    return detect_family(source(name))


def parse(fam, pieces, *, thinking=True, tools=True, raw=False) -> list:
    p = ReplyParser(fam, thinking=thinking, tools=tools, raw_thinking=raw)
    events = []
    for piece in pieces:
        events += p.feed(piece)
    return merged(events + p.finish())


# --- detection: one row per real template ---------------------------------------------------------------

# file → (family, tools, thinking open marker or None, opened by the template, toggle kwarg, budget_close,
#         drops_history)
DETECTION = {
    "DeepSeek-R1-Distill-Qwen-7B.gguf.jinja": ("deepseek-r1", "deepseek", "<think>", False, None, THINK_CLOSE, True),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("deepseek-r1", "deepseek", "<think>", True, "enable_thinking",
                                                       THINK_CLOSE, True),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": ("deepseek-r1", "deepseek", "<think>", True, None, THINK_CLOSE,
                                                       True),
    "llama-cpp-deepseek-r1.jinja": ("deepseek-r1", "deepseek", "<think>", True, None, THINK_CLOSE, True),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek-v3", "deepseek", "<think>", True, "enable_thinking", THINK_CLOSE,
                                        True),
    "Qwen-Qwen3-0.6B.jinja": ("qwen3", "hermes", "<think>", False, "enable_thinking", THINK_CLOSE, True),
    "Qwen-QwQ-32B.jinja": ("qwq", "hermes", "<think>", True, "enable_thinking", THINK_CLOSE, True),
    "openai-gpt-oss-120b.jinja": ("gpt-oss", "harmony", "<|channel|>analysis<|message|>", False, None, HARMONY_CLOSE,
                                  True),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("magistral", "mistral", "[THINK]", False, None, "[/THINK]",
                                                       False),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("hermes", "hermes", None, False, None, None, None),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("hermes", "hermes", None, False, None, None, None),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("llama3", "llama3", None, False, None, None, None),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3", "llama3", None, False, None, None, None),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral", "mistral", None, False, None, None, None),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("mistral", "mistral", None, False, None, None, None),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("mistral", "mistral", None, False, None, None, None),
    "SmolLM2-135M-Instruct.gguf.jinja": ("plain", None, None, False, None, None, None),
}


def test_every_template_file_is_in_the_table():
    assert sorted(p.name for p in TEMPLATES.glob("*.jinja")) == sorted(DETECTION)


@pytest.mark.parametrize("name", sorted(DETECTION))
def test_detect_family(name):
    fam_name, tools, open_, opened, toggle, budget_close, drops = DETECTION[name]
    fam = family_of(name)
    assert (fam.name, fam.tools) == (fam_name, tools)
    if open_ is None:
        assert fam.thinking is None
        return
    t = fam.thinking
    assert (t.open, t.opened_by_template, t.toggle_kwarg, t.budget_close, t.drops_history) == \
        (open_, opened, toggle, budget_close, drops)
    assert t.budget_close.strip().startswith(t.close)


def test_plain_without_a_template_and_gemma_instruct():
    assert detect_family(None).name == detect_family("").name == "plain"  # Gemma-3-270M base has none
    gemma_it = (Path(__file__).parent / "templates" / "gemma3.jinja").read_text()
    assert detect_family(gemma_it) == detect_family(None)


def _render(name: str, messages, **kwargs) -> str:
    t = ChatTemplate(source(name), bos_token="<s>", eos_token="</s>")
    return t._tpl.render(messages=messages, add_generation_prompt=True, bos_token="<s>", eos_token="</s>", **kwargs)


@pytest.mark.parametrize("name", [n for n, row in DETECTION.items() if row[2] == "<think>"])
def test_opened_by_template_is_what_the_template_renders(name):
    """The generation prompt, rendered with thinking on, ends inside the block exactly when detection says
    so; with the toggle off it never does."""
    fam = family_of(name)
    on = _render(name, [{"role": "user", "content": "hi"}], **template_kwargs(fam, think=True, level=None))
    assert on.rstrip().endswith("<think>") == fam.thinking.opened_by_template
    if fam.thinking.toggle_kwarg:
        off = _render(name, [{"role": "user", "content": "hi"}], **template_kwargs(fam, think=False, level=None))
        assert not off.rstrip().endswith("<think>") and off.rstrip().endswith("</think>")


def test_qwen3_budget_close_is_how_it_renders_past_thinking():
    fam = family_of("Qwen-Qwen3-0.6B.jinja")
    text = _render("Qwen-Qwen3-0.6B.jinja", [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "a", "reasoning_content": "r"}])
    assert "r" + fam.thinking.budget_close + "a" in text


def test_template_kwargs():
    qwen3, oss, r1 = (family_of(n) for n in ("Qwen-Qwen3-0.6B.jinja", "openai-gpt-oss-120b.jinja",
                                              "DeepSeek-R1-Distill-Qwen-7B.gguf.jinja"))
    assert template_kwargs(qwen3, think=False, level=None) == {"enable_thinking": False}
    assert template_kwargs(qwen3, think=None, level="high") == {"enable_thinking": True}
    assert oss.thinking.levels == ("low", "medium", "high")
    assert template_kwargs(oss, think=True, level="high") == {"reasoning_effort": "high"}
    assert template_kwargs(oss, think=False, level=None) == {"reasoning_effort": "low"}
    assert template_kwargs(oss, think=None, level="extreme") == {}
    assert template_kwargs(r1, think=False, level="low") == {}
    assert "Reasoning: high" in _render("openai-gpt-oss-120b.jinja", [{"role": "user", "content": "q"}],
                                        **template_kwargs(oss, think=True, level="high"))


# --- the parser on each family's real markers -------------------------------------------------------------

def openai_tool_calls(events) -> list[dict]:
    """Merged events → OpenAI's ``message.tool_calls`` (arguments a JSON string), checking the event order."""
    calls: list[dict] = []
    for e in events:
        if isinstance(e, ToolCallStart):
            assert e.index == len(calls) and re.fullmatch(r"call_[0-9a-f]{24}", e.id)
            calls.append({"id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}})
        elif isinstance(e, ToolCallArgs):
            calls[e.index]["function"]["arguments"] += e.text
        elif isinstance(e, ToolCallEnd):
            assert json.loads(calls[e.index]["function"]["arguments"]) == e.arguments
    return calls


def content_of(events, channel="content") -> str:
    return "".join(e.text for e in events if isinstance(e, Delta) and e.channel == channel)


PARIS = {"city": "Paris"}
TOOL_OUTPUTS = [  # (template, realistic reply, thinking, content, [(name, arguments)])
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
     "Okay, the user wants the weather and the time.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
     "<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
     "<｜tool▁sep｜>get_time\n```json\n{\"tz\": \"Europe/Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "Okay, the user wants the weather and the time.", "",
     [("get_weather", PARIS), ("get_time", {"tz": "Europe/Paris"})]),
    ("deepseek-ai-DeepSeek-V3.1.jinja",
     "The user asks about Paris.</think>Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
     "<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "The user asks about Paris.", "Let me check.", [("get_weather", PARIS)]),
    ("Qwen-Qwen3-0.6B.jinja",
     "<think>\nTwo cities, two calls.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
     "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
     "{\"city\": \"Rome\"}}\n</tool_call>",
     "Two cities, two calls.", "", [("get_weather", PARIS), ("get_weather", {"city": "Rome"})]),
    ("Qwen-QwQ-32B.jinja",
     "Need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
     "\n</tool_call>", "Need the weather.", "", [("get_weather", PARIS)]),
    ("Qwen-Qwen2.5-7B-Instruct.jinja",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"°C\"}}\n</tool_call>",
     "", "", [("get_weather", {"city": "Paris", "unit": "°C"})]),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
     "I'll look it up.\n<tool_call>\n{\"arguments\": {\"city\": \"Paris\"}, \"name\": \"get_weather\"}\n</tool_call>",
     "", "I'll look it up.", [("get_weather", PARIS)]),  # the whitespace before a call is dropped
    ("meta-llama-Llama-3.1-8B-Instruct.jinja",
     "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "",
     [("get_weather", PARIS)]),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja",
     "<|python_tag|>brave_search.call(query=\"weather in Paris\")", "", "",
     [("brave_search", {"query": "weather in Paris"})]),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja",
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "", [("get_weather", PARIS)]),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja",
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"a1b2c3d4e\"}, "
     "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}, \"id\": \"f5g6h7i8j\"}]", "", "",
     [("get_weather", PARIS), ("get_weather", {"city": "Rome"})]),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja",
     "[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"Paris\"}", "", "", [("get_weather", PARIS)]),
    ("unsloth-mistral-Devstral-Small-2507.jinja",
     "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}", "", "",
     [("get_weather", PARIS), ("get_time", {"tz": "UTC"})]),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja",
     "[THINK]The user wants the weather.[/THINK]Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
     "The user wants the weather.", "Checking.", [("get_weather", PARIS)]),
    ("openai-gpt-oss-120b.jinja",
     "<|channel|>analysis<|message|>Need to call get_weather.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
     "Need to call get_weather.", "", [("get_weather", PARIS)]),
    ("openai-gpt-oss-120b.jinja",  # the engine stops on <|call|> (an end-of-generation token) without its text
     "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant to=functions.get_weather<|channel|>"
     "commentary json<|message|>{\"city\": \"Paris\"}", "Call it.", "", [("get_weather", PARIS)]),
]


@pytest.mark.parametrize("name,text,thinking,content,expected", TOOL_OUTPUTS,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(TOOL_OUTPUTS)])
def test_tool_calls_in_openai_shape(name, text, thinking, content, expected):
    events = parse(family_of(name), [text])
    assert content_of(events, "thinking") == thinking and content_of(events) == content
    calls = openai_tool_calls(events)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == expected
    assert all(isinstance(c["function"]["arguments"], str) for c in calls)
    assert len({c["id"] for c in calls}) == len(calls)
    ends = [e.arguments for e in events if isinstance(e, ToolCallEnd)]
    assert ends == [a for _, a in expected]  # the parsed objects, for Ollama


@pytest.mark.parametrize("name,text", [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "Sure <tool_call>\n{\"name\": \"f\", \"argu"),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "<tool_call>not json</tool_call> after"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "x</think>a<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\":"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "{\"answer\": 42}"),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|python_tag|>print('hi'"),
    ("openai-gpt-oss-120b.jinja", "<|start|>assistant<|channel|>commentary to=functions.f<|message|>{oops"),
])
def test_a_malformed_call_comes_back_as_content(name, text):
    """Nothing is lost: every character of the call's text is in the content, no call is emitted."""
    fam = family_of(name)
    events = parse(fam, [text])
    assert not any(isinstance(e, (ToolCallStart, ToolCallArgs, ToolCallEnd)) for e in events)
    got = content_of(events) + content_of(events, "thinking")
    payload = text.split("</think>")[-1].split("<|message|>")[-1]
    assert payload.replace("<｜tool▁calls▁begin｜>", "") in got.replace("<｜tool▁calls▁begin｜>", "") or payload in got


def test_thinking_and_answer_per_family():
    cases = [
        ("DeepSeek-R1-Distill-Qwen-7B.gguf.jinja", "<think>\nHmm, 2+2.\n</think>\n\nThe answer is 4."),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "Hmm, 2+2.\n</think>\n\nThe answer is 4."),
        ("Qwen-QwQ-32B.jinja", "<think>\nHmm, 2+2.\n</think>\n\nThe answer is 4."),  # repeats the opened tag
        ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "[THINK]Hmm, 2+2.[/THINK]The answer is 4."),
        ("openai-gpt-oss-120b.jinja", "<|channel|>analysis<|message|>Hmm, 2+2.<|end|><|start|>assistant<|channel|>"
                                      "final<|message|>The answer is 4.<|return|>"),
    ]
    for name, text in cases:
        assert parse(family_of(name), [text], tools=False) == \
            [Delta("thinking", "Hmm, 2+2."), Delta("content", "The answer is 4.")], name


def test_budget_close_ends_thinking_and_never_reaches_the_content():
    for name in [n for n, row in DETECTION.items() if row[2]]:
        fam = family_of(name)
        t = fam.thinking
        prefix = "" if t.opened_by_template or t.open.startswith("<|channel|>") else t.open
        if t.open.startswith("<|channel|>"):
            prefix = t.open
        events = parse(fam, [prefix + "long thought that was cut", t.budget_close, "Answer."], tools=False)
        assert events == [Delta("thinking", "long thought that was cut"), Delta("content", "Answer.")], name


def test_raw_thinking_keeps_the_tags_in_content():
    fam = family_of("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    assert parse(fam, ["Hmm.\n</think>\n\n4"], raw=True) == [Delta("content", "<think>Hmm.\n</think>\n\n4")]
    qwen3 = family_of("Qwen-Qwen3-0.6B.jinja")
    text = "<think>\nHmm.\n</think>\n\n4"
    assert parse(qwen3, [text], raw=True) == [Delta("content", text)]


def test_thinking_off_and_tools_off_leave_text_alone():
    qwen3 = family_of("Qwen-Qwen3-0.6B.jinja")
    text = "<think>x</think> and <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"
    assert parse(qwen3, [text], thinking=False, tools=False) == [Delta("content", text)]


def test_a_think_tag_inside_the_answer_is_content():
    qwen3 = family_of("Qwen-Qwen3-0.6B.jinja")
    text = "Use <think> tags like </think> this."
    assert parse(qwen3, [text]) == [Delta("content", text)]


def test_plain_text_is_untouched():
    fam = family_of("SmolLM2-135M-Instruct.gguf.jinja")
    text = "\n  Hello <b>[x]</b> {y} <tool_call> </think>"
    assert parse(fam, list(text)) == [Delta("content", text)]


# --- property: every way of cutting a recorded reply gives the same events --------------------------------

MALFORMED = [  # recorded replies whose call is cut off or broken: they come back as content, whatever the cuts
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "Sure <tool_call>\n{\"name\": \"f\", \"argu"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "  {\"answer\": 42} and more"),
]
RECORDED = [(r[0], r[1]) for r in TOOL_OUTPUTS] + MALFORMED + [
    ("DeepSeek-R1-Distill-Qwen-7B.gguf.jinja", "<think>\nHmm, 2+2.\n</think>\n\nThe answer is 4."),
    ("Qwen-QwQ-32B.jinja", "<think>\nHmm.\n\n</think>\n\n4 <think> stays"),
    ("openai-gpt-oss-120b.jinja", "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final"
                                  "<|message|>It is 4.<|return|>"),
    ("SmolLM2-135M-Instruct.gguf.jinja", "Hello <b>world</b>, 4."),
]
_MARKERS = ("<think>", "</think>", "[THINK]", "[/THINK]", "<tool_call>", "</tool_call>", "<|python_tag|>",
            "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|call|>",
            "<|return|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
            "<｜tool▁calls▁end｜>", "{", "}", "]")


def _canonical(events) -> list:
    return [ToolCallStart(e.index, "ID", e.name) if isinstance(e, ToolCallStart) else e for e in merged(events)]


def _cuts(text: str, seed: int):
    """Every 2-piece cut; every 3-piece cut with both cuts in or next to one marker (at most 6 apart); one
    piece per character; 30 random cuts into 2-12 pieces."""
    import random

    n = len(text)
    yield [text]
    yield list(text)
    for i in range(1, n):
        yield [text[:i], text[i:]]
    near = sorted({j for m in _MARKERS for k in [i.start() for i in re.finditer(re.escape(m), text)]
                   for j in range(max(1, k - 1), min(n, k + len(m) + 1))})
    for a_i, a in enumerate(near):
        for b in near[a_i + 1:]:
            if b - a <= 6:  # a marker (or a marker and its neighbour) cut into three
                yield [text[:a], text[a:b], text[b:]]
    rng = random.Random(seed)
    for _ in range(30):
        points = sorted(rng.sample(range(1, n), min(n - 1, rng.randint(1, 11))))
        yield [text[i:j] for i, j in zip([0] + points, points + [n])]


CUT_CASES = [(n, t, False) for n, t in RECORDED] + [(n, t, True) for n, t in RECORDED if DETECTION[n][2]]


@pytest.mark.parametrize("name,text,raw", CUT_CASES,
                         ids=[f"{r[0]}-{i}{'-raw' if r[2] else ''}" for i, r in enumerate(CUT_CASES)])
def test_every_cut_gives_the_same_events(name, text, raw):
    fam = family_of(name)
    whole = _canonical(parse(fam, [text], raw=raw))
    count = 0
    for pieces in _cuts(text, seed=len(text)):
        assert "".join(pieces) == text
        assert _canonical(parse(fam, pieces, raw=raw)) == whole, pieces
        count += 1
    assert count > len(text)
