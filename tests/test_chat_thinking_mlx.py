"""The chat's thinking on the MLX engine (mlx[cpu], SmolLM2's GGUF under QwQ's template): the same session
code path as on llama.cpp (tests/test_chat_thinking.py) — the budget bounds the thinking, ending it now
gets an answer, and no tag reaches the answer."""

from __future__ import annotations

import pytest
from helpers import mlx_smollm_engine

pytestmark = pytest.mark.model

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from test_chat_thinking import QWQ, STORY, TAGS, _n_close, _turn  # noqa: E402

from localrun.backends.base import SamplingParams  # noqa: E402
from localrun.chat.session import ChatSession  # noqa: E402


@pytest.fixture(scope="module")
def mlx_qwq(smollm_path, tmp_path_factory):
    yield from mlx_smollm_engine(smollm_path, tmp_path_factory, chat_template=QWQ.read_text())


def test_budget_and_ending_the_thinking_on_mlx(mlx_qwq):
    # 16 tokens a turn: the thinking (6, or 4 when ended), the forced close (5) and the start of the answer
    s = ChatSession(mlx_qwq, SamplingParams(temperature=0, max_tokens=16), reasoning_budget=6)
    thinking, answer, _ = _turn(s, STORY)
    assert thinking.strip() and answer.strip() and not any(t in answer for t in TAGS)
    assert 6 <= s.thought.tokens <= 6 + _n_close(mlx_qwq)

    s = ChatSession(mlx_qwq, SamplingParams(temperature=0, max_tokens=16))
    seen = {}

    def after(piece, pieces):
        if len(pieces) == 4:
            seen["tokens"] = sum(p.token_id is not None for p in pieces)
            assert s.end_thinking()

    thinking, answer, _ = _turn(s, STORY, on_piece=after)
    assert s.thought.ended_early and seen["tokens"] <= s.thought.tokens <= seen["tokens"] + _n_close(mlx_qwq)
    assert answer.strip() and not any(t in answer for t in TAGS)


def test_stop_strings_and_a_second_block_on_mlx(mlx_qwq):
    """The MLX engine shares TextStream and the token control: stop strings apply to the answer only (the
    thinking and the forced close are never cut), and the answer never opens a second thinking block."""
    thinking, answer, _ = _turn(ChatSession(mlx_qwq, SamplingParams(temperature=0, max_tokens=16),
                                            reasoning_budget=6), STORY)
    stops = ["</", "think>", "\n", thinking.split()[0]]
    s = ChatSession(mlx_qwq, SamplingParams(temperature=0, max_tokens=16, stop=stops), reasoning_budget=6)
    cut = min([answer.find(x) for x in stops if x in answer], default=len(answer))
    assert _turn(s, STORY)[:2] == (thinking, answer[:cut])
    bias = {t: 20.0 for t in mlx_qwq.tokenize("<think>", add_special=False)}
    s = ChatSession(mlx_qwq, SamplingParams(temperature=0, max_tokens=16, logit_bias=bias), reasoning_budget=2)
    answer = _turn(s, STORY)[1]
    assert "<think" in answer and "<think>" not in answer, answer
