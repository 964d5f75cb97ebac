"""benches/ttft_floor.py: the floor under a serve bench level's TTFT p50 (prefill only, in the clients' order)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("ttft_floor", Path(__file__).parents[1] / "benches" / "ttft_floor.py")
ttft_floor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ttft_floor)


def test_all_at_once_the_median_waits_for_half_the_prompts():
    # 4 prompts sent together at 100 tok/s: the k-th first token waits for the k shortest prompts
    # (10, 10+20, 10+20+30, 10+20+30+40 tokens) -> bounds 0.1, 0.3, 0.6, 1.0 s; median 0.45 s
    assert ttft_floor.median_floor_s([30, 10, 40, 20], level=4, pp_tok_s=100.0) == pytest.approx(0.45)


def test_later_requests_wait_only_for_their_own_prompt():
    # 2 streams, 4 requests: the first two sent together (bounds 0.1, 0.3 s), the last two each when a stream
    # frees (0.3, 0.4 s on their own) -> sorted 0.1, 0.3, 0.3, 0.4; median 0.3 s
    assert ttft_floor.median_floor_s([10, 20, 30, 40], level=2, pp_tok_s=100.0) == pytest.approx(0.3)
    # one stream: every request alone -> the median prompt's own prefill
    assert ttft_floor.median_floor_s([10, 20, 30], level=1, pp_tok_s=100.0) == pytest.approx(0.2)


def test_no_prompt_or_no_speed_is_an_error():
    with pytest.raises(ValueError):
        ttft_floor.median_floor_s([], level=1, pp_tok_s=100.0)
    with pytest.raises(ValueError):
        ttft_floor.median_floor_s([10], level=1, pp_tok_s=0.0)
