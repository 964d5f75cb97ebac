"""One pass over the weights per decode step (docs/architecture.md §1, "One pass per step"): llama.cpp's own
ubatch count (its eval callback, ``LOCALRUN_COUNT_UBATCHES=1``) equals localrun's prediction; sequences
started on scattered ids, or leaving holes as they finish, are moved into one run of ids, so every decode
step is one ubatch, and their greedy tokens equal their solo runs; a long cached prefix on a far slot is
copied into the run instead of being given up; a moved sequence's KV (Gemma-3's sliding window included)
continues exactly as it would have in place."""

from __future__ import annotations

import pytest

from localrun.backends.base import SamplingParams

pytestmark = pytest.mark.model

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):",
           "The river flows through the old town, past the market and the church, until it"]


def _engine(path, n_parallel: int, n_ctx: int = 512, **plan_kw):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(path), n_ctx=n_ctx, **plan_kw)
    plan.n_parallel = n_parallel
    return load_engine(path, plan)


def _run(eng, gens, release: bool = False) -> list[list[int]]:
    """Step ``gens`` to the end → each one's tokens; ``release``: free each as it finishes (the scheduler's
    order: finished sequences are released after the step that ended them)."""
    out = {id(g): [] for g in gens}
    while not all(g.done for g in gens):
        for g, chunk in eng.step([g for g in gens if not g.done]):
            out[id(g)].append(chunk.token_id)
            if release and g.done:
                eng.release(g)
    return [out[id(g)] for g in gens]


@pytest.mark.parametrize("unified", [False, True])
def test_llama_cpp_counts_the_ubatches_localrun_predicts(smollm_path, monkeypatch, unified):
    from localrun.backends.llamacpp.ubatch import predict_ubatches

    monkeypatch.setenv("LOCALRUN_COUNT_UBATCHES", "1")
    eng = _engine(smollm_path, 6, kv_unified=unified)
    try:
        assert eng.step_totals.measured and eng.kv_unified is unified
        toks = eng.tokenize(PROMPTS[3])
        C, b = eng.C, eng._batch
        layouts = [[(0, 1), (1, 1), (2, 1), (3, 1)], [(0, 1), (1, 1), (3, 1), (4, 1)], [(0, 1), (2, 1), (4, 1)],
                   [(0, 5), (1, 1), (2, 1), (3, 1)], [(0, 5), (1, 3), (2, 1), (3, 5)], [(5, 9)]]
        seen = []
        for layout in layouts:
            n, ids = 0, []
            for s, k in layout:
                C.llama_memory_seq_rm(eng.mem, s, 0, -1)
                for j in range(k):
                    b.token[n], b.pos[n], b.n_seq_id[n], b.seq_id[n][0], b.logits[n] = toks[j], j, 1, s, 1
                    ids.append(s)
                    n += 1
            b.n_tokens = n
            eng._ubatch_counter.take()
            assert C.llama_decode(eng.ctx, b) == 0
            measured = eng._ubatch_counter.take()
            assert measured == predict_ubatches(ids, eng.n_ubatch, unified), layout
            seen.append(measured)
        print("ubatches per layout:", seen)
        assert seen == ([1] * len(layouts) if unified else [1, 2, 3, 2, 4, 1])
    finally:
        eng.close()


def test_scattered_sequences_decode_in_one_ubatch_per_step_and_equal_their_solo_runs(smollm_path, monkeypatch):
    monkeypatch.setenv("LOCALRUN_COUNT_UBATCHES", "1")
    eng = _engine(smollm_path, 8)
    try:
        lengths = [6, 20, 12, 20]  # the shorter ones finish first, leaving holes in the run
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
        prompts = [eng.tokenize(p) for p in PROMPTS]
        solo = []
        for toks, p in zip(prompts, params):
            g = eng.start(toks, p, slot=eng.slots[0])
            solo.append(_run(eng, [g])[0])
            eng.release(g, keep_kv=False)
        before = eng.step_totals.to_dict()
        gens = [eng.start(toks, p, slot=eng.slots[i]) for toks, p, i in zip(prompts, params, (0, 2, 5, 7))]
        batched = _run(eng, gens, release=True)
        t = eng.step_totals
        steps = t.decode_steps - before["decode_steps"]
        ubatches = t.decode_ubatches - before["decode_ubatches"]
        moves = t.moves - before["moves"]
        print(f"{steps} decode steps, {ubatches} ubatches (measured), {moves} sequences moved")
        assert batched == solo
        assert steps > 0 and ubatches == steps  # one pass over the weights per decode step
        assert moves >= 2  # 5 and 7 into the run at the start; a hole left by a finished one later
    finally:
        eng.close()


def test_a_long_cached_prefix_on_a_far_slot_is_copied_into_the_run(smollm_path):
    from localrun.backends.llamacpp.placement import MOVE_MIN_TOKENS

    eng = _engine(smollm_path, 8)
    try:
        p = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        long = eng.tokenize(" ".join(f"item {i} is number {i};" for i in range(20)))
        assert len(long) > 2 * MOVE_MIN_TOKENS
        g = eng.start(long, p, slot=eng.slots[6])
        _run(eng, [g])
        eng.release(g)
        cached = list(g.slot.tokens)
        busy = [eng.start(eng.tokenize(t), SamplingParams(temperature=0, max_tokens=16), slot=eng.slots[i])
                for i, t in enumerate(PROMPTS[:2])]
        follow = long + eng.tokenize(" and item 20 is", add_special=False)
        slot = eng.acquire_slot(follow)
        assert slot.seq_id == 2 and slot.tokens == cached  # the run 0, 1 extended, the prefix kept
        g2 = eng.start(follow, p, slot=slot)
        assert g2.cached_tokens >= len(long)
        _run(eng, busy + [g2])
        assert eng.step_totals.moves >= 1
        for x in busy + [g2]:
            eng.release(x)
    finally:
        eng.close()


def test_a_moved_gemma_sequence_continues_as_in_place(gemma_path):
    """Gemma-3's SWA cache: a moved sequence's state carries the sliding window (llama.cpp serialises the
    cells the next token can still see), so a continuation of the same prompt reuses everything and gives
    the in-place run's tokens. Not bit-exact: the window lands on fewer cells, and Gemma-3's logits move
    with the KV layout (flash attention splits the cells among threads by their number; the open Gemma
    case of tests/test_batch_equivalence.py): held to ``GEMMA_TOL`` and equal tokens where the margin is
    wide. SmolLM2's moves are exact (test_scattered_…)."""
    GEMMA_TOL = 0.25  # nats: Gemma-3's layout sensitivity, 0.21 measured in test_batch_equivalence
    eng = _engine(gemma_path, 4, n_ctx=1024)
    try:
        assert eng.n_swa == 512
        p = SamplingParams(temperature=0, max_tokens=6, logprobs=2, ignore_eos=True)
        prompt = eng.tokenize(" ".join(f"Line {i}: the river flows past house number {i}." for i in range(50)))
        assert len(prompt) > 600

        def turn(slot, toks):
            g = eng.start(toks, p, slot=slot)
            out = []
            while not g.done:
                for _, c in eng.step([g]):
                    lp = c.logprobs[0]
                    out.append((c.token_id, lp.logprob, lp.top[0][1] - lp.top[1][1]))
            eng.release(g)
            return g, out

        results = []
        for move in (False, True):
            for s in eng.slots:
                eng.C.llama_memory_seq_rm(eng.mem, s.seq_id, 0, -1)
                s.tokens.clear()
            slot = next(s for s in eng.slots if s.seq_id == 3)
            g, first = turn(slot, prompt)
            if move:
                pos_min = eng.C.llama_memory_seq_pos_min(eng.mem, 3)
                dst = next(s for s in eng.slots if s.seq_id == 0)
                assert eng.move_kv(slot, dst) and slot.seq_id == 0 and not dst.tokens
                # the state holds the sliding window's cells: the SWA cache starts no earlier than before
                assert eng.C.llama_memory_seq_pos_min(eng.mem, 0) >= pos_min
                assert eng.C.llama_memory_seq_pos_max(eng.mem, 0) == len(slot.tokens) - 1
                assert eng.C.llama_memory_seq_pos_max(eng.mem, 3) == -1
            g2, second = turn(slot, prompt + g.generated + eng.tokenize(" Line 50:", add_special=False))
            assert g2.cached_tokens == len(prompt) + len(g.generated) - 1  # nothing prefilled again
            results.append((first, second))
        (first_a, second_a), (first_b, second_b) = results
        assert first_a == first_b  # before the move: the same run twice
        worst = 0.0
        for (t_a, lp_a, m_a), (t_b, lp_b, _) in zip(second_a, second_b):
            if t_a != t_b:
                assert m_a < 2 * GEMMA_TOL, (t_a, t_b, m_a)
                break
            worst = max(worst, abs(lp_a - lp_b))
        print(f"gemma after a move: max |Δlogprob| {worst:.4f}")
        assert worst <= GEMMA_TOL
    finally:
        eng.close()
