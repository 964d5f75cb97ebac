"""dialects.history: a tool-using history (arguments as string and as object, null content, tool results,
earlier thinking) renders through every real template (tests/data/templates/) without an error."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from localrun.dialects import detect_family, template_kwargs
from localrun.dialects.history import messages_for_template
from localrun.model.chat_template import ChatTemplate

TEMPLATES = Path(__file__).parent / "data" / "templates"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
HISTORY = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "reasoning_content": "EARLIER-THOUGHT",
     "tool_calls": [{"id": "call_abc", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},  # OpenAI: a string
    {"role": "tool", "tool_call_id": "call_abc", "content": "SUNNY-21C"},
    {"role": "assistant", "content": "<think>\nOLD-THINK\n</think>\n\nIt is sunny."},
    {"role": "user", "content": "And Rome?"},
    {"role": "assistant", "content": None, "reasoning": "CURRENT-THOUGHT",
     "tool_calls": [{"id": "call_def", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},  # Ollama
    {"role": "tool", "tool_call_id": "call_def", "content": [{"type": "text", "text": "RAINY-15C"}]},
]


@pytest.mark.parametrize("name", sorted(p.name for p in TEMPLATES.glob("*.jinja")))
def test_tool_history_renders_through_every_template(name):
    src = (TEMPLATES / name).read_text()
    fam = detect_family(src)
    before = copy.deepcopy(HISTORY)
    msgs = messages_for_template(HISTORY, fam)
    assert HISTORY == before  # the caller's messages are not touched
    prompt = ChatTemplate(src, bos_token="<s>", eos_token="</s>")._tpl.render(
        messages=msgs, tools=TOOLS, add_generation_prompt=True, bos_token="<s>", eos_token="</s>",
        **template_kwargs(fam, think=True, level=None))
    assert "SUNNY-21C" in prompt and "RAINY-15C" in prompt
    assert "Rome" in prompt and "It is sunny." in prompt
    if fam.thinking is not None and fam.thinking.drops_history:
        assert "OLD-THINK" not in prompt and "EARLIER-THOUGHT" not in prompt


def test_thinking_of_the_current_tool_chain_is_kept_where_the_template_reads_it():
    src = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    msgs = messages_for_template(HISTORY, detect_family(src))
    prompt = ChatTemplate(src).render(msgs, tools=TOOLS)
    assert "CURRENT-THOUGHT" in prompt and "EARLIER-THOUGHT" not in prompt


def test_arguments_follow_the_template():
    r1_old = detect_family((TEMPLATES / "DeepSeek-R1-Distill-Qwen-7B.gguf.jinja").read_text())
    llama = detect_family((TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text())
    calls = [m for m in messages_for_template(HISTORY, r1_old) if m.get("tool_calls")]
    assert [c["tool_calls"][0]["function"]["arguments"] for c in calls] == ['{"city": "Paris"}', '{"city": "Rome"}']
    assert all(c["content"] is None for c in calls)  # its template writes tool calls only for a null content
    calls = [m for m in messages_for_template(HISTORY, llama) if m.get("tool_calls")]
    assert [c["tool_calls"][0]["function"]["arguments"] for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]


def test_mistral_ids_are_nine_alphanumerics_and_stay_paired():
    nemo = detect_family((TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text())
    msgs = messages_for_template(HISTORY, nemo)
    ids = [tc["id"] for m in msgs for tc in m.get("tool_calls", [])]
    answers = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
    assert ids == answers and len(set(ids)) == 2
    assert all(len(i) == 9 and i.isalnum() for i in ids)
