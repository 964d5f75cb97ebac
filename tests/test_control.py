"""The token control on the llama.cpp engine with SmolLM2 (docs/architecture.md §2): the reasoning budget closes the
thinking block after exactly ``budget`` model tokens and the answer never repeats the close tag; a budgeted
sequence and a free one share a batch and each gets its solo tokens; a mask + complete control (the hook
llguidance constraints use) restricts and ends a generation; ``render_special`` shows control tokens.

SmolLM2 does not think, so its prompt ends inside ``<think>`` (``starts_in_thinking``), as a DeepSeek-R1
distill's generation prompt does. Asserts are on token counts, positions and equalities between two
paths, never on the model's own words (CPU-independence, common.md)."""

from __future__ import annotations

import numpy as np
import pytest

from localrun.backends import control
from localrun.backends.base import Constraint, SamplingParams

THINK_PROMPT = ("<|im_start|>user\nWhat is 17 times 23? Think step by step.<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n")
CLOSE = "\n</think>\n\n"
BUDGET = 16


def budget_params(**kw) -> SamplingParams:
    base = dict(temperature=0, max_tokens=32, reasoning_budget=BUDGET, budget_close=CLOSE, think_open="<think>",
                think_close="</think>", starts_in_thinking=True)
    base.update(kw)
    return SamplingParams(**base)


def thinking_tokens(chunks) -> int:
    """Tokens emitted up to and including the one that completed the first ``</think>``."""
    text = ""
    for i, c in enumerate(chunks):
        text += c.text
        if "</think>" in text:
            return i + 1
    raise AssertionError(f"no </think> in {text!r}")


def check_budgeted(eng, chunks) -> None:
    close_toks = eng.tokenize(CLOSE, add_special=False, parse_special=True)
    toks = [c.token_id for c in chunks]
    text = "".join(c.text for c in chunks)
    assert toks[BUDGET:BUDGET + len(close_toks)] == close_toks  # forced right after the budget ran out
    assert thinking_tokens(chunks) <= BUDGET + len(close_toks)
    assert text.count("</think>") == 1
    assert text.split("</think>", 1)[1].strip()  # and then the model answered


def test_budget_closes_thinking_and_the_model_answers(smollm_engine):
    chunks = list(smollm_engine.generate(THINK_PROMPT, budget_params()))
    check_budgeted(smollm_engine, chunks)
    # without the budget the same prompt does not close the block within those tokens: the budget did it
    n_close = len(smollm_engine.tokenize(CLOSE, add_special=False, parse_special=True))
    free = list(smollm_engine.generate(THINK_PROMPT, budget_params(reasoning_budget=None)))
    assert "</think>" not in "".join(c.text for c in free[:BUDGET + n_close])


def test_answer_never_repeats_the_close_tag(smollm_engine):
    """A logit bias pushes the model to write ``</think>`` over and over; once the budget (0) closed the
    block the control masks the token that would complete the tag again (the same text without the
    budget control repeats it: the test can fail)."""
    bias = {t: 12.0 for t in smollm_engine.tokenize("</think>", add_special=False)}
    free = "".join(c.text for c in smollm_engine.generate(
        THINK_PROMPT, budget_params(reasoning_budget=None, logit_bias=bias, max_tokens=20)))
    assert free.count("</think>") >= 2
    text = "".join(c.text for c in smollm_engine.generate(
        THINK_PROMPT, budget_params(reasoning_budget=0, logit_bias=bias, max_tokens=20)))
    assert text.count("</think>") == 1


def _solo(eng, prompt: list[int], params: SamplingParams) -> list[int]:
    gen = eng.start(prompt, params)
    out = []
    while not gen.done:
        out += [c.token_id for _, c in eng.step([gen])]
    eng.release(gen, keep_kv=False)  # every run prefills from scratch: equal arithmetic
    return out


@pytest.fixture(scope="module")
def smollm_two_slots(smollm_path):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(smollm_path), n_ctx=1024)
    plan.n_parallel = 2
    eng = load_engine(smollm_path, plan)
    yield eng
    eng.close()


def test_budgeted_and_free_sequences_share_a_batch(smollm_two_slots):
    """Both sequences have the same prompt length (equal-length decode batches are bit-identical to solo
    runs, test_batch_equivalence), so each must give exactly its solo tokens."""
    eng = smollm_two_slots
    prompt = eng.tokenize(THINK_PROMPT, parse_special=True)
    budgeted, free = budget_params(), budget_params(reasoning_budget=None)
    solo_b, solo_f = _solo(eng, prompt, budgeted), _solo(eng, prompt, free)
    a = eng.start(prompt, budgeted, eng.slots[0])
    b = eng.start(prompt, free, eng.slots[1])
    out = {id(a): [], id(b): []}
    n_both = 0
    while not (a.done and b.done):
        events = eng.step([g for g in (a, b) if not g.done])
        n_both += len(events) == 2
        for g, c in events:
            out[id(g)].append(c)
    eng.release(a, keep_kv=False)
    eng.release(b, keep_kv=False)
    assert n_both >= BUDGET + 5  # the forced tokens were decoded in two-sequence batches
    assert [c.token_id for c in out[id(a)]] == solo_b
    assert [c.token_id for c in out[id(b)]] == solo_f
    check_budgeted(eng, out[id(a)])


class DigitsThenStop:
    """A control as a constraint compiler builds one: only digit tokens allowed, complete after ``n``."""

    def __init__(self, engine, n: int = 5) -> None:
        pieces = control.vocab_pieces(engine)
        self.allowed = np.array([p.isdigit() for p in pieces], dtype=bool)
        self.n, self.seen = n, []

    def forced(self):
        return None

    def mask(self):
        return self.allowed

    def accept(self, tok):
        self.seen.append(tok)

    def complete(self):
        return len(self.seen) >= self.n


def test_mask_and_complete_through_the_constraint_hook(smollm_engine, monkeypatch):
    built = []
    monkeypatch.setattr(control, "_compiler", lambda eng, c: built.append(DigitsThenStop(eng)) or built[-1])
    p = SamplingParams(temperature=1.0, seed=7, max_tokens=50, constraint=Constraint("regex", "[0-9]+"))
    chunks = list(smollm_engine.generate("The answer is", p))
    text = "".join(c.text for c in chunks)
    assert chunks[-1].finish_reason == "stop" and len(chunks) == 5
    assert text.isdigit() and built[0].seen == [c.token_id for c in chunks]


def test_render_special_shows_control_tokens_and_eog_still_ends(smollm_engine):
    start = smollm_engine.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(start) == 1 and not smollm_engine.is_eog(start[0])
    p = SamplingParams(temperature=0, max_tokens=3, logit_bias={start[0]: 30.0})
    shown = list(smollm_engine.generate("Hello", SamplingParams(**{**p.__dict__, "render_special": True})))
    hidden = list(smollm_engine.generate("Hello", p))
    assert [c.token_id for c in shown] == [c.token_id for c in hidden] == start * 3
    assert "".join(c.text for c in shown) == "<|im_start|>" * 3
    assert "".join(c.text for c in hidden) == ""
    end = smollm_engine.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert smollm_engine.is_eog(end[0])
    eog = list(smollm_engine.generate("Hello", SamplingParams(temperature=0, max_tokens=3, render_special=True,
                                                                logit_bias={end[0]: 30.0})))
    assert len(eog) == 1 and eog[0].finish_reason == "stop" and eog[0].text == ""
