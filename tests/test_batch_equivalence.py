"""Concurrent = solo: a greedy generation gives the same tokens whether it runs alone or in a batch of 16
sequences (the engine's continuous batching, as `serve --parallel 16` uses it), on SmolLM2 and on
Gemma-3 (sliding-window attention; one prompt is longer than its 512-token window, so the SWA masks and
cell reuse of several sequences are exercised too).

The fault this guards (issue 19.10): Gemma-3's Q4_K weights were repacked by llama.cpp for its CPU GEMM,
which takes the rows of a batch four at a time and the rest with a GEMV (ggml-cpu/repack.cpp); the two
round differently enough to move Gemma's logits by up to 0.6, so a sequence's output depended on how
many others were decoding (0.15 in log-probability, greedy text parting). The engine keeps repacked
weights off when it runs several sequences: decode batches of sequences with equal KV lengths then give
bit-identical logits for every batch size (SmolLM2 and Gemma-3).

OPEN (Gemma-3, xfail): when sequences of different KV lengths share a batch (here a 550-token prompt with
short ones; the numbers were measured at 730), some streams' logits still differ from their solo run,
deterministically, by up to ~1 in the largest logit and 0.21 in the chosen token's log-probability (0.19 with
repacking on: the repack was not the whole cause). It also happens with flash attention off and with
kv_unified, and not on SmolLM2.

Reproduction: two sequences of different lengths plus a third > 512 tokens, one decode token each,
batched vs alone (see the report of helper E).

SmolLM2's short prompts give bit-identical logits batched and alone. Its long prompt (550 tokens; the numbers
below were measured at 730) need not, by llama.cpp's CPU flash attention alone: the kernel shares a long KV
among the threads by the batch's shape, and one query row and eight round differently: max 0.0085 nats on an
AVX2 EPYC, 0.064 on an AVX-512 EPYC (2 threads), and exactly 0 with one thread or with flash attention off
(measured). That sequence is held to ``LONG_KV_TOL``, the others to ``LOGPROB_TOL``.

The 16 start on scattered sequence ids of 24 slots, so the engine first moves them into one run of ids
(``llamacpp/placement.py``): every decode step is then one ubatch, and the moved KV must change nothing.

Each step of each sequence is checked against its solo run: the solo token's
log-probability within its tolerance, the same token where the solo top-1/top-2 margin is wider than
``WIDE_MARGIN``, compared up to the first near-tie that went the other way."""

from __future__ import annotations

import pytest

from localrun.backends.base import SamplingParams

pytestmark = pytest.mark.model  # loads SmolLM2 and Gemma-3 (request.getfixturevalue: not seen by conftest)

N_SEQ = 16
N_SLOTS = 24  # the batch starts on ids i + i // 2: {0, 1, 3, 4, 6, …, 22}, compacted before the first decode
LOGPROB_TOL = 0.02  # nats (SmolLM2's short prompts measured 0; Gemma 0.21: open, see the docstring)
LONG_KV_TOL = 0.15  # nats, past 512 cells: flash attention's split-KV rounding (≤ 0.064 measured; docstring)
LONG = 512  # cells: prompts longer than this are held to LONG_KV_TOL
WIDE_MARGIN = 2 * LONG_KV_TOL
# decode steps per sequence. Gemma's open fault shows within its first 3-5 steps (|Δ logprob| 0.06-0.11 against
# the 0.02 tolerance on several sequences, measured): 12 steps keep the strict xfail, at half of 24's cost
STEPS = {"smollm": 24, "gemma": 12}
PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "The river flows through the old town, past the market and the church, until it",
    " ".join(f"Line {i}: the river flows past house number {i}." for i in range(38)),  # > 512 tokens
]


def _engine(path, n_parallel: int):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(path), n_ctx=1024)
    plan.n_parallel = n_parallel
    return load_engine(path, plan)


def _run(eng, gens):
    """Step ``gens`` to the end; per generation the list of (token, logprob, top1 - top2 margin)."""
    trace = {id(g): [] for g in gens}
    while not all(g.done for g in gens):
        for g, chunk in eng.step([g for g in gens if not g.done]):
            lp = chunk.logprobs[0] if chunk.logprobs else None
            margin = lp.top[0][1] - lp.top[1][1] if lp and len(lp.top) > 1 else float("inf")
            trace[id(g)].append((chunk.token_id, lp.logprob if lp else 0.0, margin))
    return [trace[id(g)] for g in gens]


def _compare(solo, batched):
    """(max |Δ logprob| over the comparable steps, number of steps compared); asserts token equality
    where the solo margin is wide."""
    worst, n = 0.0, 0
    for (t_s, lp_s, m_s), (t_b, lp_b, _) in zip(solo, batched):
        if t_s != t_b:
            assert m_s < WIDE_MARGIN, f"token {t_b} instead of {t_s} at a margin of {m_s:.3f}"
            break
        worst, n = max(worst, abs(lp_s - lp_b)), n + 1
    return worst, n


@pytest.mark.parametrize("model", ["smollm", pytest.param("gemma", marks=pytest.mark.xfail(
    strict=True, reason="open: Gemma-3 logits depend on the other sequences' KV lengths (docstring)"))])
def test_sixteen_concurrent_greedy_sequences_equal_their_solo_runs(model, request):
    path = request.getfixturevalue(f"{model}_path")
    eng = _engine(path, N_SLOTS)
    try:
        n = STEPS[model]
        p = SamplingParams(temperature=0, max_tokens=n, logprobs=2, ignore_eos=True)
        # the short prompts in turn and the long one once (sequence 4): one sequence past the window is
        # what the SWA case needs, and two more copies cost 1,100 tokens of prefill for nothing new
        prompts = [eng.tokenize(PROMPTS[4 if i == 4 else i % 4]) for i in range(N_SEQ)]
        solo = {}
        for toks in prompts:
            key = tuple(toks)
            if key not in solo:
                g = eng.start(toks, p, slot=eng.slots[0])
                solo[key] = _run(eng, [g])[0]
                eng.release(g, keep_kv=False)
        # all sixteen at once, on scattered slots (prefills take turns, then one decode batch of 16 per step)
        before = eng.step_totals.to_dict()
        gens = [eng.start(toks, p, slot=eng.slots[i + i // 2]) for i, toks in enumerate(prompts)]
        traces = _run(eng, gens)
        t = eng.step_totals
        steps, ubatches = t.decode_steps - before["decode_steps"], t.decode_ubatches - before["decode_ubatches"]
        assert t.moves > before["moves"] and ubatches == steps > 0, (steps, ubatches)  # one pass per decode step
        worst, worst_long, compared = 0.0, 0.0, 0
        for toks, g, tr in zip(prompts, gens, traces):
            assert len(tr) == n and g.finish_reason == "length"
            w, n = _compare(solo[tuple(toks)], tr)
            if len(toks) > LONG:
                worst_long = max(worst_long, w)
            else:
                worst = max(worst, w)
            compared += n
            eng.release(g, keep_kv=False)
        assert worst <= LOGPROB_TOL, f"max |Δlogprob| {worst:.4f} (prompts ≤ {LONG} tokens)"
        assert worst_long <= LONG_KV_TOL, f"max |Δlogprob| {worst_long:.4f} (the prompt past {LONG} tokens)"
        assert compared >= N_SEQ * n // 2  # most steps were comparable (near-ties are rare)
        print(f"{model}: max |Δlogprob| {worst:.2e}, {worst_long:.2e} past {LONG} cells, over {compared} steps")
    finally:
        eng.close()
