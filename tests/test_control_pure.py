"""backends/control.py without a model: the reasoning budget's state machine on a small made-up vocabulary,
the close-tag ban masks, ControlSet composition, and a constraint without a compiler (docs/architecture.md §2)."""

from __future__ import annotations

import numpy as np
import pytest

from localrun.backends import control
from localrun.backends.base import Constraint, SamplingParams
from localrun.backends.control import ControlSet, ReasoningBudget, build_control, tag_ban_masks
from localrun.errors import BackendUnavailableError, LocalrunError

# a toy vocabulary: what the budget sees of a tokenizer (bytes per id)
PIECES = [b"a", b" b", b"</", b"think", b">", b"</think>", b"\n", b"<think>", b"x</think>y", b"k>"]
CLOSE, NL = 5, 6


class ToyVocab:
    """The vocabulary side of an engine as control.py reads it: n_vocab, token_bytes, tokenize."""

    n_vocab = len(PIECES)

    def token_bytes(self, t: int, special: bool = False) -> bytes:
        return PIECES[t]

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return {"\n</think>\n": [NL, CLOSE, NL], "</think>": [CLOSE]}[text]


def budget(n: int, *, starts: bool = True, close: str = "\n</think>\n") -> ReasoningBudget:
    p = SamplingParams(reasoning_budget=n, budget_close=close, think_open="<think>", think_close="</think>",
                       starts_in_thinking=starts)
    return ReasoningBudget.for_engine(ToyVocab(), p)


def run(ctl, sampled: list[int]) -> list[int]:
    """Emit ``sampled`` as the model's choices, taking forced tokens first, as an engine does."""
    out, it = [], iter(sampled)
    while True:
        tok = ctl.forced()
        if tok is None:
            tok = next(it, None)
            if tok is None:
                return out
            m = ctl.mask()
            assert m is None or m[tok], f"the model was allowed to pick only {np.flatnonzero(m)}"
        ctl.accept(tok)
        out.append(tok)


def test_budget_forces_close_after_exactly_budget_thinking_tokens():
    ctl = budget(3)
    assert run(ctl, [0, 1, 0, 1, 1]) == [0, 1, 0, NL, CLOSE, NL, 1, 1]
    assert ctl.state == "answer" and ctl.n_thinking == 3


def test_budget_zero_closes_at_once_and_natural_close_needs_no_forcing():
    assert run(budget(0), [0]) == [NL, CLOSE, NL, 0]
    ctl = budget(5)
    assert run(ctl, [0, 2, 3, 4, 0, 0, 0, 0, 0]) == [0, 2, 3, 4, 0, 0, 0, 0, 0]  # "</" "think" ">" closes it
    assert ctl.state == "answer" and not ctl.forcing
    m = ctl.mask()  # the model's own close: the close tag is left alone, the open tag is banned
    assert m[CLOSE] and not m[7]


def test_budget_counts_only_after_the_model_opens_the_block():
    ctl = budget(2, starts=False)
    assert run(ctl, [0, 0, 0, 7, 0, 0, 1]) == [0, 0, 0, 7, 0, 0, NL, CLOSE, NL, 1]


def test_no_close_tag_in_the_answer():
    """After the block: a token holding the tag, or completing it after a partial tag, is masked."""
    ctl = budget(0)
    run(ctl, [])
    assert ctl.state == "answer"
    m = ctl.mask()
    assert not m[CLOSE] and not m[8] and m[2] and m[3]  # "</think>" and "x</think>y" banned; "</" allowed
    ctl.accept(2)  # "</"
    m = ctl.mask()
    assert m[3] and not m[CLOSE]  # "think" alone does not complete it
    ctl.accept(3)  # "</think"
    m = ctl.mask()
    assert not m[4] and m[0]  # ">" would complete it
    masks = tag_ban_masks(ToyVocab(), b"</think>")
    assert len(masks) == len(b"</think>") and not masks[6][9]  # "</thin" + "k>" completes it


def test_no_second_thinking_block_in_the_answer():
    """Once the block is closed (forced or by the model) the answer cannot open another: "<think>" whole, or
    completed after a partial tag, is masked. A thinking request without a budget gets the control too."""
    ctl = budget(1)
    assert run(ctl, [0, 1]) == [0, NL, CLOSE, NL, 1]
    assert not ctl.mask()[7] and ctl.mask()[0]
    ctl = build_control(ToyVocab(), SamplingParams(think_open="<think>", think_close="</think>",
                                                   starts_in_thinking=True))
    assert isinstance(ctl, ReasoningBudget) and ctl.forced() is None and ctl.mask() is None  # thinking: free
    assert run(ctl, [0, CLOSE, 1]) == [0, CLOSE, 1]
    assert not ctl.mask()[7] and ctl.mask()[CLOSE]


def test_harmony_keeps_its_later_analysis_messages():
    """gpt-oss writes several messages per reply: after its own <|end|> another analysis message is allowed;
    after a forced close neither tag is."""
    pieces = [b"<|channel|>", b"analysis", b"<|message|>", b"<|end|>", b"x"]

    class Vocab:
        n_vocab = len(pieces)

        def token_bytes(self, t: int, special: bool = False) -> bytes:
            return pieces[t]

        def tokenize(self, text: str, **kw) -> list[int]:
            return [3]

    p = SamplingParams(think_open="<|channel|>analysis<|message|>", think_close="<|end|>")
    ctl = build_control(Vocab(), p)
    assert run(ctl, [0, 1, 2, 4, 3, 0, 1]) == [0, 1, 2, 4, 3, 0, 1]
    assert ctl.mask() is None or ctl.mask()[2]
    forced = build_control(Vocab(), SamplingParams(reasoning_budget=0, think_open=p.think_open, think_close="<|end|>",
                                                   starts_in_thinking=True))
    assert run(forced, [0, 1]) == [3, 0, 1] and not forced.mask()[2] and not forced.mask()[3]


def test_budget_needs_a_close_marker():
    with pytest.raises(LocalrunError, match="think_close"):
        build_control(ToyVocab(), SamplingParams(reasoning_budget=4))


class Fixed:
    """A control that forces ``force`` once, allows ``allow``, completes after ``n`` tokens."""

    def __init__(self, force=None, allow=None, n=99):
        self.force, self.allow, self.n, self.seen = force, allow, n, []

    def forced(self):
        return self.force if self.force is not None and self.force not in self.seen else None

    def mask(self):
        if self.allow is None:
            return None
        m = np.zeros(len(PIECES), dtype=bool)
        m[list(self.allow)] = True
        return m

    def accept(self, tok):
        self.seen.append(tok)

    def complete(self):
        return len(self.seen) >= self.n


def test_control_set_composes_forced_masks_accept_complete():
    a, b = Fixed(force=4, allow={0, 1, 2}), Fixed(force=3, allow={1, 2, 3}, n=2)
    s = ControlSet([a, b])
    assert s.forced() == 4
    s.accept(4)
    assert s.forced() == 3 and a.seen == b.seen == [4]
    s.accept(3)
    assert s.forced() is None
    assert np.flatnonzero(s.mask()).tolist() == [1, 2]
    assert s.complete()


def test_no_control_for_plain_params_and_constraint_without_compiler(monkeypatch):
    assert build_control(ToyVocab(), SamplingParams()) is None
    pytest.importorskip("localrun.constrain")  # the default compiler (control.compile_with_llguidance) imports it
    monkeypatch.setattr(control, "_compiler", None)  # as when llguidance is missing
    with pytest.raises(BackendUnavailableError, match="constrained decoding"):
        build_control(ToyVocab(), SamplingParams(constraint=Constraint("regex", "[0-9]+")))
    monkeypatch.setattr(control, "_compiler", lambda eng, c: Fixed(n=1))
    ctl = build_control(ToyVocab(), SamplingParams(constraint=Constraint("regex", "[0-9]+"), reasoning_budget=2,
                                                   think_close="</think>", starts_in_thinking=True))
    assert isinstance(ctl, ControlSet) and isinstance(ctl.controls[0], ReasoningBudget)
