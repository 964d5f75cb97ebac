"""The token control on the MLX engine (mlx[cpu], SmolLM2's GGUF): the reasoning budget, a mask +
complete control through the constraint hook, and ``render_special`` — the same checks as
tests/test_control.py runs on llama.cpp (docs/architecture.md §2)."""

from __future__ import annotations

import pytest
from helpers import mlx_smollm_engine

pytestmark = pytest.mark.model

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from test_control import (  # noqa: E402
    BUDGET,
    CLOSE,
    THINK_PROMPT,
    DigitsThenStop,
    budget_params,
    check_budgeted,
)

from localrun.backends import control  # noqa: E402
from localrun.backends.base import Constraint, SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def mlx_engine(smollm_path, tmp_path_factory):
    yield from mlx_smollm_engine(smollm_path, tmp_path_factory)


def test_budget_closes_thinking_on_mlx(mlx_engine):
    n_close = len(mlx_engine.tokenize(CLOSE, add_special=False, parse_special=True))
    # the budget, the forced close and a few tokens of answer (check_budgeted wants one after the close)
    chunks = list(mlx_engine.generate(THINK_PROMPT, budget_params(max_tokens=BUDGET + n_close + 4)))
    check_budgeted(mlx_engine, chunks)
    # without the budget, no close within as many tokens as the budgeted run closed in
    free = list(mlx_engine.generate(THINK_PROMPT, budget_params(reasoning_budget=None, max_tokens=BUDGET + n_close)))
    assert "</think>" not in "".join(c.text for c in free[:BUDGET + n_close])  # the budget closed it


def test_mask_and_complete_on_mlx(mlx_engine, monkeypatch):
    monkeypatch.setattr(control, "_compiler", lambda eng, c: DigitsThenStop(eng))
    p = SamplingParams(temperature=1.0, seed=7, max_tokens=50, constraint=Constraint("regex", "[0-9]+"))
    chunks = list(mlx_engine.generate("The answer is", p))
    text = "".join(c.text for c in chunks)
    assert chunks[-1].finish_reason == "stop" and len(chunks) == 5 and text.isdigit()


def test_render_special_on_mlx(mlx_engine):
    start = mlx_engine.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(start) == 1 and not mlx_engine.is_eog(start[0])
    bias = {start[0]: 30.0}
    shown = list(mlx_engine.generate("Hello", SamplingParams(temperature=0, max_tokens=3, logit_bias=bias,
                                                             render_special=True)))
    hidden = list(mlx_engine.generate("Hello", SamplingParams(temperature=0, max_tokens=3, logit_bias=bias)))
    assert [c.token_id for c in shown] == [c.token_id for c in hidden] == start * 3
    assert "".join(c.text for c in shown) == "<|im_start|>" * 3 and "".join(c.text for c in hidden) == ""
