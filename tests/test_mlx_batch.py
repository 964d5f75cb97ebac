"""Continuous batching on MLX (``backends/mlx/batch.py``, docs/architecture.md §1 "MLX batching") on the real
SmolLM2 GGUF through mlx[cpu]: several requests decode in one forward pass, and each one's tokens are the ones
it gets alone (``MlxEngine.generate``) — greedy, seeded, with a constraint, a thinking budget, a stop string,
penalties and logprobs per row. One engine for the module; prompts are short and outputs ≤ 6 tokens (MLX on
this CPU is slow)."""

from __future__ import annotations

import pytest
from helpers import mlx_smollm_engine

pytestmark = pytest.mark.model

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from localrun.backends import as_batch_engine  # noqa: E402
from localrun.backends.base import Constraint, SamplingParams  # noqa: E402

N = 6  # tokens per request: the thinking one's budget (1) and its forced close (5 tokens) fit

THINK = "<|im_start|>user\nWhat is 17 times 23?<|im_end|>\n<|im_start|>assistant\n<think>\n"


def greedy(**kw) -> SamplingParams:
    return SamplingParams(**dict(dict(temperature=0, max_tokens=N), **kw))


def requests(eng) -> list[tuple[list[int], SamplingParams]]:
    """Eight requests at mixed prompt lengths: plain greedy ones, a regex constraint, a thinking budget, a
    seeded sample, a stop string, penalties + logit bias + logprobs."""
    import localrun.constrain  # noqa: F401  registers llguidance's compiler

    tok = eng.tokenize
    return [
        (tok("The capital of France is"), greedy()),
        (tok("1, 2, 3,"), greedy()),
        (tok("Once upon a time there was a little dog who lived in a house by the sea. One day"), greedy()),
        (tok("Is the sky blue? Answer:"), greedy(constraint=Constraint("regex", "(yes|no), [a-z ]+"))),
        (tok(THINK, parse_special=True), greedy(reasoning_budget=1, budget_close="\n</think>\n\n",
                                                think_open="<think>", think_close="</think>",
                                                starts_in_thinking=True)),
        (tok("Hello"), SamplingParams(temperature=0.9, seed=1234, max_tokens=N)),
        (tok("Count with me: one, two, three,"), greedy(stop=[" five"])),
        (tok("def fib(n):"), greedy(repeat_penalty=1.3, logit_bias={198: -5.0}, logprobs=3)),
    ]


@pytest.fixture(scope="module")
def engine(smollm_path, tmp_path_factory):
    yield from mlx_smollm_engine(smollm_path, tmp_path_factory)


@pytest.fixture(scope="module")
def batch(engine):
    engine.plan.n_parallel = 8
    b = as_batch_engine(engine)
    yield b
    for s in b.slots:
        s.cache, s.tokens = None, []


@pytest.fixture(scope="module")
def solo(engine):
    """Each request alone, on a fresh cache: its chunks."""
    out = []
    for prompt, params in requests(engine):
        engine.reset_cache()
        out.append(list(engine.generate(prompt, params)))
    engine.reset_cache()
    return out


def run_together(b, reqs):
    gens = [b.start(p, params, b.acquire_slot(p)) for p, params in reqs]
    chunks = {id(g): [] for g in gens}
    widths = []
    while any(not g.done for g in gens):
        events = b.step([g for g in gens if not g.done])
        widths.append(len(events))
        for g, c in events:
            chunks[id(g)].append(c)
    for g in gens:
        b.release(g)
    return gens, [chunks[id(g)] for g in gens], widths


def ids(chunks) -> list[int]:
    return [c.token_id for c in chunks]


def test_mlx_engine_batches(batch):
    assert type(batch).__name__ == "MlxBatchEngine" and not batch.serial and batch.n_parallel == 8


def test_eight_concurrent_requests_each_equal_their_solo_output(batch, engine, solo):
    gens, together, widths = run_together(batch, requests(engine))
    assert max(widths) >= 2  # rows really shared forward passes
    print("rows per decode step:", widths)
    for i, (alone, tog) in enumerate(zip(solo, together)):
        assert ids(tog) == ids(alone), i
        assert "".join(c.text for c in tog) == "".join(c.text for c in alone), i
        assert tog[-1].finish_reason == alone[-1].finish_reason, i
    # the row-specific controls did their job
    assert "".join(c.text for c in together[3])[:3] in ("yes", "no,")
    assert "</think>" in "".join(c.text for c in together[4])
    assert together[6][-1].finish_reason == "stop" and " five" not in "".join(c.text for c in together[6])
    lp_b = [c.logprobs[0] for c in together[7] if c.logprobs]
    lp_s = [c.logprobs[0] for c in solo[7] if c.logprobs]
    assert [x.top_ids for x in lp_b] == [x.top_ids for x in lp_s] and len(lp_b[0].top) == 3
    assert all(abs(x.logprob - y.logprob) < 1e-3 for x, y in zip(lp_b, lp_s))
    assert batch.rows == [] and batch.batch_cache is None  # finished rows left the batch


def test_new_request_reuses_the_longest_cached_prefix(batch, engine, solo):
    """After the run above, a prompt that extends request 2's prompt lands on that slot and prefills only
    the rest; its output is still its solo output."""
    prompt2 = requests(engine)[2][0]
    longer = prompt2 + engine.tokenize(" the dog", add_special=False)
    slot = batch.acquire_slot(longer)
    assert slot.tokens[:len(prompt2)] == prompt2
    engine.reset_cache()
    alone = ids(engine.generate(longer, greedy(max_tokens=4)))
    engine.reset_cache()
    gens, [tog], _ = run_together(batch, [(longer, greedy(max_tokens=4))])
    assert gens[0].cached_tokens >= len(prompt2) and ids(tog) == alone
    assert tog[-1].stats.cached_tokens == gens[0].cached_tokens


def test_cancel_frees_the_row_at_once_and_others_continue(batch, engine, solo):
    reqs = requests(engine)[:2]
    g0, g1 = [batch.start(p, params, batch.acquire_slot(p)) for p, params in reqs]
    out1 = []
    while len(batch.rows) < 2 or not out1:
        out1 += [c for g, c in batch.step([g0, g1]) if g is g1]
    busy = sum(s.busy for s in batch.slots)
    batch.release(g0, keep_kv=False)  # a cancelled request
    assert g0 not in batch.rows and len(batch.rows) == 1
    assert not g0.slot.busy and g0.slot.tokens == [] and sum(s.busy for s in batch.slots) == busy - 1
    while not g1.done:
        out1 += [c for g, c in batch.step([g1]) if g is g1]
    batch.release(g1)
    assert ids(out1) == ids(solo[1])


def test_slots_bound_admission(batch, engine):
    p = engine.tokenize("Hi")
    gens = [batch.start(p, greedy(max_tokens=1), batch.acquire_slot(p)) for _ in range(batch.n_parallel)]
    assert batch.acquire_slot(p) is None  # every slot busy: the scheduler keeps the request queued
    for g in gens:
        batch.release(g, keep_kv=False)
    assert batch.acquire_slot(p) is not None


def test_kv_tiers_save_a_cut_row_and_restore_it_into_another(engine):
    """KV tiers on batched MLX: a prompt that takes a slot saves the slot's tokens first (RAM tier), and a later
    prompt sharing them restores that snapshot into whichever slot it gets."""
    from localrun.backends.mlx.batch import MlxBatchEngine
    from localrun.backends.mlx.cache import attach_mlx_kv_cache

    tiers = attach_mlx_kv_cache(engine, ram_bytes=64 << 20)
    try:
        b = MlxBatchEngine(engine, n_parallel=2)
        doc = engine.tokenize(" ".join(f"Fact {i}: river {i} flows into lake {i + 1}." for i in range(4)))
        assert len(doc) >= tiers.min_tokens
        run_together(b, [(doc + engine.tokenize(" Which lake?", add_special=False), greedy(max_tokens=2))])
        others = [engine.tokenize("Say hello."), engine.tokenize("Say goodbye.")]
        run_together(b, [(p, greedy(max_tokens=2)) for p in others])  # both slots: the doc's row is cut (saved)
        assert all(s.tokens[:len(doc)] != doc for s in b.slots)
        again = doc + engine.tokenize(" Which river?", add_special=False)
        gens, [chunks], _ = run_together(b, [(again, greedy(max_tokens=2))])
        assert tiers.stats.hits_ram >= 1 and gens[0].cached_tokens >= len(doc) and chunks[-1].finish_reason
    finally:
        engine.kv_cache = None
