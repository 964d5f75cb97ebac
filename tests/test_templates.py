"""The built-in chat templates render what the official templates they stand for render (issue 19.2).

The official texts are in tests/templates/ (SOURCES.md says where each comes from); SmolLM2's own
ChatML template is read from the test model's GGUF. A role a built-in format cannot express raises
ChatTemplateError; no message is ever dropped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from localrun.errors import ChatTemplateError
from localrun.model.chat_template import BUILTIN_TEMPLATES, ChatTemplate

TEMPLATES = Path(__file__).parent / "templates"
OFFICIAL = {"chatml": "chatml.jinja", "llama3": "llama3.jinja", "gemma": "gemma3.jinja",
            "mistral": "mistral_v03.jinja", "phi3": "phi3.jinja"}
TOKENS = {"chatml": ("", "<|im_end|>"), "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
          "gemma": ("<bos>", "<eos>"), "mistral": ("<s>", "</s>"), "phi3": ("<s>", "<|endoftext|>")}

SYS = {"role": "system", "content": "You are terse. Answer in French."}
U1 = {"role": "user", "content": "  What is the capital of France?\n"}
A1 = {"role": "assistant", "content": "Paris. "}
U2 = {"role": "user", "content": "And of Italy?"}
CONVERSATIONS = {
    "user": [U1],
    "system+user": [SYS, U1],
    "multi-turn": [U1, A1, U2],
    "system+multi-turn": [SYS, U1, A1, U2],
    "ends-with-assistant": [SYS, U1, A1],
}


def _pair(name: str) -> tuple[ChatTemplate, ChatTemplate]:
    bos, eos = TOKENS[name]
    official = ChatTemplate((TEMPLATES / OFFICIAL[name]).read_text(), bos_token=bos, eos_token=eos)
    return ChatTemplate(BUILTIN_TEMPLATES[name], bos_token=bos, eos_token=eos), official


@pytest.mark.parametrize("gen", [True, False], ids=["gen-prompt", "no-gen-prompt"])
@pytest.mark.parametrize("conv", list(CONVERSATIONS))
@pytest.mark.parametrize("name", list(OFFICIAL))
def test_builtin_renders_like_the_official_template(name, conv, gen):
    msgs = CONVERSATIONS[conv]
    if name == "mistral" and msgs[-1]["role"] != "user":
        # Mistral v0.3 writes the system message into the LAST message only if it is a user message;
        # the official template drops it otherwise, the built-in keeps it (before the last user message)
        builtin, _ = _pair(name)
        assert SYS["content"] in builtin.render(msgs, add_generation_prompt=gen)
        return
    builtin, official = _pair(name)
    want = official.render(msgs, add_generation_prompt=gen)
    assert builtin.render(msgs, add_generation_prompt=gen) == want
    if msgs[0] is SYS:
        assert SYS["content"] in want  # the comparison covers the system message


def test_gemma_keeps_the_system_message():
    """The bug: a Jinja variable set inside the loop did not survive, so the system text vanished."""
    out = ChatTemplate(BUILTIN_TEMPLATES["gemma"], bos_token="<bos>").render([SYS, U1, A1, U2])
    assert out.startswith("<bos><start_of_turn>user\nYou are terse. Answer in French.\n\nWhat is")
    assert out.count(SYS["content"]) == 1


def test_chatml_equals_smollm2s_own_template(smollm_path):
    """SmolLM2's GGUF template is ChatML plus a default system prompt when none is given."""
    from localrun.model.gguf_info import read_gguf

    own = ChatTemplate(read_gguf(smollm_path).chat_template)
    builtin = ChatTemplate(BUILTIN_TEMPLATES["chatml"])
    for conv in ("system+user", "system+multi-turn", "ends-with-assistant"):
        for gen in (True, False):
            msgs = CONVERSATIONS[conv]
            assert builtin.render(msgs, add_generation_prompt=gen) == own.render(msgs, add_generation_prompt=gen)
    assert "SmolLM" in own.render([U1]) and "SmolLM" not in builtin.render([U1])


@pytest.mark.parametrize("name,msgs", [
    ("gemma", [U1, A1, {"role": "tool", "content": "42"}]),
    ("mistral", [U1, A1, {"role": "tool", "content": "42"}]),
    ("mistral", [SYS]),
    ("phi3", [U1, {"role": "tool", "content": "42"}]),
])
def test_a_role_the_format_cannot_express_is_refused(name, msgs):
    with pytest.raises(ChatTemplateError) as e:
        ChatTemplate(BUILTIN_TEMPLATES[name]).render(msgs)
    assert "built-in" in e.value.message and name in e.value.message


def test_every_builtin_has_an_official_counterpart():
    assert set(BUILTIN_TEMPLATES) == set(OFFICIAL)


LATE_SYSTEM = [{"role": "system", "content": "Top."}, {"role": "user", "content": "hi"},
               {"role": "assistant", "content": "hello"}, {"role": "system", "content": "Reminder."},
               {"role": "user", "content": "again"}]


@pytest.mark.parametrize("name, midway", [("chatml", True), ("llama3", True), ("gemma", False), ("mistral", False)])
def test_a_system_message_after_the_first_turn_is_never_dropped(name, midway):
    """Where the template renders a late system message (ChatML, Llama 3) it stays in place; where it cannot
    (Gemma's alternation rule) it is merged into the leading system message, in order. Never lost, never
    a template error (Claude Code sends such messages)."""
    t = ChatTemplate(BUILTIN_TEMPLATES[name], bos_token="<bos>")
    assert t.renders_system_midway is midway
    text = t.render(LATE_SYSTEM)
    assert "Top." in text and "Reminder." in text
    if midway:
        assert text.index("hello") < text.index("Reminder.") < text.index("again")
    else:
        assert text.index("Top.") < text.index("Reminder.")  # where the template puts its system text
        no_late = t.render([{"role": "system", "content": "Top.\n\nReminder."}] + LATE_SYSTEM[1:3] + LATE_SYSTEM[4:])
        assert text == no_late
