"""The chat's thinking control without a model (fast tier): the real templates' families → template kwargs
and budget fields per /think setting, /think argument parsing, the turn meter on raw reply text, the
"end the thinking now" flag in the engine's budget control, and /save//load keeping a turn's thinking."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from localrun.backends.base import Constraint, SamplingParams
from localrun.backends.control import ReasoningBudget, build_control
from localrun.chat.session import ChatMessage, ChatSession
from localrun.chat.thinking import ThinkingMeter, describe, parse_budget, switch_message, thinks, turn_setup
from localrun.chat.thinking_view import fold_line, unfinished_note
from localrun.dialects import detect_family
from localrun.errors import ConfigError

TEMPLATES = Path(__file__).parent / "data" / "templates"


def family(name: str):
    return detect_family((TEMPLATES / name).read_text())


QWQ = family("Qwen-QwQ-32B.jinja")  # opens <think> itself; enable_thinking switch
QWEN3 = family("Qwen-Qwen3-0.6B.jinja")  # the model opens <think>; enable_thinking switch
R1 = family("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")  # opens <think> itself; no switch
PLAIN = family("SmolLM2-135M-Instruct.gguf.jinja")


def test_turn_setup_default_on_sets_the_budget_fields_and_the_stop_flag():
    end = threading.Event()
    base = SamplingParams(temperature=0)
    s = turn_setup(QWQ, base, think=None, budget=8, end_thinking=end)
    assert s.thinking and s.kwargs == {"enable_thinking": True}
    p = s.params
    assert (p.reasoning_budget, p.budget_close, p.think_open, p.think_close, p.starts_in_thinking) == (
        8, "\n</think>\n\n", "<think>", "</think>", True)
    assert p.end_thinking is end
    assert base.reasoning_budget is None and base.end_thinking is None  # the session's params are untouched
    q = turn_setup(QWEN3, base, think=True, budget=None, end_thinking=end).params
    assert q.reasoning_budget is None and q.end_thinking is end and not q.starts_in_thinking


def test_think_off_uses_the_template_switch_or_a_zero_budget():
    off = turn_setup(QWEN3, SamplingParams(), think=False, budget=100)
    assert off.kwargs == {"enable_thinking": False} and not off.thinking
    assert off.params.reasoning_budget is None and off.params.end_thinking is None
    r1 = turn_setup(R1, SamplingParams(), think=False, budget=100, end_thinking=threading.Event())
    assert r1.kwargs == {} and r1.thinking and r1.params.reasoning_budget == 0  # closed at once
    assert "no switch" in switch_message(R1, False) and "enable_thinking" in switch_message(QWEN3, False)
    assert thinks(R1, False) and not thinks(QWQ, False) and not thinks(PLAIN, True)


def test_a_model_that_does_not_think_and_a_constrained_answer_get_no_budget():
    plain = turn_setup(PLAIN, SamplingParams(), think=True, budget=5, end_thinking=threading.Event())
    assert plain.kwargs == {} and not plain.thinking and plain.params.reasoning_budget is None
    assert "does not think" in describe(PLAIN, None, None)
    c = turn_setup(QWEN3, SamplingParams(constraint=Constraint("regex", "a+")), think=None, budget=5)
    assert c.params.reasoning_budget is None and c.params.end_thinking is None


@pytest.mark.parametrize("arg,want", [("0", 0), ("8", 8), (" 512 ", 512), ("off", None), ("none", None),
                                      ("-1", None)])
def test_parse_budget(arg, want):
    assert parse_budget(arg) == want


@pytest.mark.parametrize("arg", ["x", "-5", "1.5", ""])
def test_parse_budget_refuses_with_a_hint(arg):
    with pytest.raises(ConfigError) as e:
        parse_budget(arg)
    assert "/think budget N" in e.value.hint


def test_describe_names_setting_budget_and_switch():
    line = describe(QWQ, False, 64)
    assert "thinking off" in line and "64 tokens" in line and "enable_thinking" in line
    assert "budget 0" in describe(R1, None, None)


def test_meter_follows_the_raw_text_over_split_markers():
    m = ThinkingMeter(QWQ, thinking=True)  # the template opened the block
    assert m.open
    for piece in ["Let", " me", "\n</", "think", ">\n\n"]:
        m.add(piece, True, False)
    assert not m.open and m.seen and m.thought.tokens == 5 and m.thought.seconds >= 0
    q = ThinkingMeter(QWEN3, thinking=True)  # the model opens the block itself, cut over tokens
    for piece in ["<th", "ink>", "hm", "</think>", "Hi"]:
        q.add(piece, True, piece == "Hi")
    assert not q.open and q.thought.tokens == 3  # from the token completing <think> to </think>
    direct = ThinkingMeter(QWEN3, thinking=True)  # answers without thinking
    direct.add("Hello", True, True)
    assert not direct.open and not direct.seen


def test_fold_line():
    m = ThinkingMeter(QWQ, thinking=True)
    m.thought.tokens, m.thought.seconds = 412, 12.43
    assert fold_line(m.thought) == "thought for 12.4 s, 412 tokens"
    m.thought.ended_early = True
    assert fold_line(m.thought).endswith("(ended early: Ctrl-C)")
    assert "token limit" in unfinished_note("length") and unfinished_note(None) == "stopped"


class ToyVocab:
    """The vocabulary side of an engine as control.py reads it."""

    PIECES = [b"a", b" b", b"</think>", b"\n"]
    n_vocab = len(PIECES)

    def token_bytes(self, t: int, special: bool = False) -> bytes:
        return self.PIECES[t]

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return {"\n</think>\n": [3, 2, 3]}[text]


def test_end_thinking_flag_forces_the_close_at_the_next_token_without_a_budget():
    end = threading.Event()
    p = SamplingParams(budget_close="\n</think>\n", think_open="<think>", think_close="</think>",
                       starts_in_thinking=True, end_thinking=end)
    ctl = build_control(ToyVocab(), p)
    assert isinstance(ctl, ReasoningBudget)  # built for the flag alone (reasoning_budget None)
    out = []
    for step in range(40):  # no budget: the model thinks freely
        assert ctl.forced() is None
        ctl.accept(step % 2)
        out.append(step % 2)
    end.set()  # Ctrl-C
    forced = []
    while (t := ctl.forced()) is not None:
        ctl.accept(t)
        forced.append(t)
    assert forced == [3, 2, 3] and ctl.state == "answer" and ctl.n_thinking == 40
    mask = ctl.mask()
    assert mask is not None and not mask[2]  # the answer can never write </think> again


def test_save_and_load_keep_the_thinking(tmp_path):
    eng = SimpleNamespace(model_path="m.gguf", template_source=None)
    s = ChatSession(eng, SamplingParams())
    s.messages = [ChatMessage("user", "hi"), ChatMessage("assistant", "Hello.", thinking="greet back")]
    path = s.save(tmp_path / "chat.json")
    saved = json.loads(path.read_text())["messages"]
    assert saved[1] == {"role": "assistant", "content": "Hello.", "thinking": "greet back"}
    t = ChatSession(eng, SamplingParams())
    assert t.load(path) == 2 and t.messages[1].thinking == "greet back" and t.messages[0].thinking is None


def test_one_shot_thinking_goes_to_stderr_and_hide_keeps_only_the_fold_line():
    import io

    from rich.console import Console

    from localrun.chat.thinking_view import StderrThinking

    for hide in (False, True):
        buf = io.StringIO()
        m = ThinkingMeter(QWQ, thinking=True)
        m.thought.tokens, m.thought.seconds = 3, 0.5
        view = StderrThinking(Console(file=buf, force_terminal=False), m.thought, hide=hide)
        view.add("\nweighing the options")
        view.fold()
        view.fold()  # folding twice prints once
        out = buf.getvalue()
        assert out.count("thought for 0.5 s, 3 tokens") == 1
        assert ("weighing the options" in out) is not hide
