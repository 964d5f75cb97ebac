"""localrun.dialects: template families detected from real templates (tests/data/templates/), the reply
parser on each family's real markers. Pure and fast: no model."""

from __future__ import annotations

from pathlib import Path

import pytest

from localrun.dialects import Delta, ReplyParser, ToolCallArgs, ToolCallEnd, ToolCallStart, detect_family
from localrun.dialects.reply import merged

TEMPLATES = Path(__file__).parent / "data" / "templates"


def family_of(name: str):
    return detect_family((TEMPLATES / name).read_text())


def run(parser: ReplyParser, pieces) -> list:
    events = []
    for p in pieces:
        events += parser.feed(p)
    return merged(events + parser.finish())


def test_qwen3_thinking_and_hermes_call_split_per_character():
    fam = family_of("Qwen-Qwen3-0.6B.jinja")
    text = ('<think>\nI should call.\n</think>\n\nSure.<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    ev = run(ReplyParser(fam, thinking=True, tools=True), list(text))
    assert ev[:2] == [Delta("thinking", "I should call."), Delta("content", "Sure.")]
    start, args, end = ev[2:]
    assert isinstance(start, ToolCallStart) and start.name == "get_weather" and start.index == 0
    assert isinstance(args, ToolCallArgs) and args.text == '{"city": "Paris"}'
    assert isinstance(end, ToolCallEnd) and end.arguments == {"city": "Paris"}


def test_deepseek_r1_template_opens_the_block():
    fam = family_of("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    assert fam.name == "deepseek-r1" and fam.thinking.opened_by_template
    ev = run(ReplyParser(fam, thinking=True, tools=False), ["Let me th", "ink.\n</th", "ink>\n\n42"])
    assert ev == [Delta("thinking", "Let me think."), Delta("content", "42")]


@pytest.mark.parametrize("cut", range(1, 30))
def test_unterminated_call_comes_back_as_content(cut):
    fam = family_of("Qwen-Qwen2.5-7B-Instruct.jinja")
    text = 'ok <tool_call>{"name": "f", "argu'
    ev = run(ReplyParser(fam, thinking=False, tools=True), [text[:cut], text[cut:]])
    assert ev == [Delta("content", text)]
