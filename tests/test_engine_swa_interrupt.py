"""The llama.cpp engine on Gemma-3 (sliding-window attention, no swa_full): prefix caching across chat
turns, and interrupting a long prefill (Ctrl-C / ``interrupt()``) within one graph node, with the slot's
token list still equal to its KV."""

from __future__ import annotations

import threading
import time

import pytest

from localrun.backends.base import Message, SamplingParams

pytestmark = pytest.mark.model  # every test here loads a real model

GREEDY = SamplingParams(temperature=0, max_tokens=24, logprobs=2)


def _gemma(gemma_path, n_ctx: int, **kw):
    from localrun.backends import load_engine
    from localrun.model.chat_template import load_template
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    return load_engine(gemma_path, simple_plan(read_gguf(gemma_path), n_ctx=n_ctx, **kw),
                       chat_template=load_template("gemma"))


def _answer(stream):
    """(tokens, the narrowest top-1/top-2 logprob margin among them, the final stats)."""
    toks, margin, stats = [], float("inf"), None
    for c in stream:
        if c.logprobs and len(c.logprobs[0].top) > 1:
            margin = min(margin, c.logprobs[0].top[0][1] - c.logprobs[0].top[1][1])
        toks.append(c.token_id)
        stats = c.stats or stats
    return toks, margin, stats


def test_gemma_second_chat_turn_reuses_the_cached_prefix(gemma_path):
    """Gemma-3 keeps only a window of positions in its SWA layers; a new turn that extends the cached
    tokens (or cuts back within the window) reuses them, and answers as a cold run does."""
    from localrun.chat import ChatSession

    eng = _gemma(gemma_path, 2048)
    try:
        assert eng.n_swa == 512  # Gemma-3-270M's window; the plan keeps the small SWA cache
        s = ChatSession(eng, GREEDY, system="You answer briefly.")
        list(s.send("Tell me about rivers."))
        first = s.last_stats.prompt_tokens
        warm, margin, stats = _answer(s.send("And about lakes?"))
        assert stats.cached_tokens >= first, (stats.cached_tokens, first)  # the first turn was not prefilled again
        # a cold run of the same conversation: slot 0's KV dropped first
        eng.slots[0].tokens.clear()
        eng.C.llama_memory_seq_rm(eng.mem, 0, 0, -1)
        cold, _, cold_stats = _answer(eng.chat([Message("system", "You answer briefly.")] + s.messages[:-1], GREEDY))
        assert cold_stats.cached_tokens == 0 and cold_stats.prompt_tokens == stats.prompt_tokens
        if margin > 0.05:  # every token won by a clear margin: the two runs must agree exactly
            assert warm == cold
        else:
            assert warm[:4] == cold[:4]
    finally:
        eng.close()


def test_gemma_cut_back_beyond_the_window_prefills_again(gemma_path):
    """Rolling back to a point whose window the SWA cache already overwrote is refused (full prefill),
    and the answer still equals a cold run's; a cut inside the window is reused. Ubatches of 128 keep the
    SWA cache at n_swa + 128 cells rounded up (768, measured), so an 881-token prompt already evicts."""
    eng = _gemma(gemma_path, 4096, n_batch=128, n_ubatch=128)
    try:
        text = " ".join(f"Line {i}: the river flows past house number {i}." for i in range(60))
        toks = eng.tokenize(text)  # 881 tokens: the SWA cache holds only the last ≈ 768 positions
        assert len(toks) > 850
        p = SamplingParams(temperature=0, max_tokens=8)
        list(eng.generate(toks, p))
        assert eng.C.llama_memory_seq_pos_min(eng.mem, 0) > 0  # early positions were evicted
        near = toks[:-20] + eng.tokenize(" And then", add_special=False)
        warm, _, st = _answer(eng.generate(near, p))
        assert st.cached_tokens == len(toks) - 20  # 20 tokens back: the window is still there
        short = toks[:40] + eng.tokenize(" And then", add_special=False)
        short_warm, _, st = _answer(eng.generate(short, p))
        assert st.cached_tokens == 0  # position 40's window is gone: prefilled from the start
        eng.slots[0].tokens.clear()
        eng.C.llama_memory_seq_rm(eng.mem, 0, 0, -1)
        short_cold, _, _ = _answer(eng.generate(short, p))
        eng.slots[0].tokens.clear()
        eng.C.llama_memory_seq_rm(eng.mem, 0, 0, -1)
        cold, _, _ = _answer(eng.generate(near, p))
        assert warm[:4] == cold[:4] and short_warm == short_cold
    finally:
        eng.close()


def test_interrupting_a_long_prefill_returns_within_a_step(gemma_path):
    """``interrupt()`` (what Ctrl-C does in chat) stops a long prefill mid-chunk: the generation stops
    well before the full prefill time, the slot's tokens are the prefix llama.cpp kept, and the next
    request still answers as a cold run does."""
    eng = _gemma(gemma_path, 4096, n_batch=256, n_ubatch=256)
    try:
        toks = eng.tokenize("The river flows through the old town. " * 150)[:650]  # chunks of 256, 256, 138
        p = SamplingParams(temperature=0, max_tokens=4)
        t0 = time.perf_counter()
        ref = [c.token_id for c in eng.generate(toks, p)]
        full_s = time.perf_counter() - t0
        eng.slots[0].tokens.clear()
        eng.C.llama_memory_seq_rm(eng.mem, 0, 0, -1)

        result = {}

        def run():
            try:
                result["tokens"] = [c.token_id for c in eng.generate(toks, p)]
            except KeyboardInterrupt:
                result["interrupted"] = time.perf_counter()

        th = threading.Thread(target=run)
        th.start()
        deadline = time.perf_counter() + 10 * full_s + 60
        while not eng.slots[0].tokens:  # the first 256-token chunk is in the KV: interrupt the second
            assert time.perf_counter() < deadline and th.is_alive(), "the prefill never got past its first chunk"
            time.sleep(0.005)
        t_int = time.perf_counter()
        eng.interrupt()
        th.join(60)
        assert "interrupted" in result, result
        assert result["interrupted"] - t_int < full_s / 3, (result["interrupted"] - t_int, full_s)
        slot = eng.slots[0]
        assert not slot.busy and 0 < len(slot.tokens) < len(toks) and slot.tokens == toks[:len(slot.tokens)]
        assert eng.C.llama_memory_seq_pos_max(eng.mem, 0) + 1 == len(slot.tokens)  # tokens list = KV
        # the next run reuses the kept prefix and gives the cold run's tokens
        kept = len(slot.tokens)
        chunks = list(eng.generate(toks, p))
        assert chunks[-1].stats.cached_tokens == kept
        assert [c.token_id for c in chunks] == ref
    finally:
        eng.close()
