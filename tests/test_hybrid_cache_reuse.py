"""Prefix caching on models with recurrent layers (hybrids: qwen35's gated delta-net, nemotron_h's Mamba-2,
lfm2's short-conv): their state cannot be cut back, so the engine reuses a cached prefix through context
checkpoints (``llamacpp/checkpoints.py``). A five-turn conversation that edits an earlier turn and resends
another reuses as much of its prompts as SmolLM2 (attention only) does, and each turn's greedy tokens are a
fresh engine's; a prompt prefilled whole says why in the log; the KV tiers restore a hybrid's snapshot at its
end or through the checkpoints it carries, from RAM and from disk after a restart; speculative decoding on a
hybrid is refused. Tiny random-weight GGUFs of the real layouts (``tests/tiny_layouts.py``): their text means
nothing, so runs are compared token by token."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from tiny_layouts import cached_layout

from localrun.backends.base import Message, SamplingParams
from localrun.backends.llamacpp.checkpoints import Checkpoint, Checkpoints
from localrun.backends.llamacpp.seq import Slot
from localrun.backends.text import common_prefix

SYSTEM = ("You are a careful assistant for a warehouse. " + " ".join(
    f"Shelf {i} holds {['red', 'blue', 'green'][i % 3]} boxes." for i in range(8)))


def _engine(path, n_ctx=512):
    """One thread: the runs are short, and a busy 2-core machine makes a second thread wait for the first."""
    from dataclasses import replace

    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    return load_engine(path, replace(simple_plan(read_gguf(path), n_ctx=n_ctx), n_threads=1, n_threads_batch=1))


def _empty(eng):
    """``eng`` as freshly loaded: no cached tokens, no checkpoints, no KV tiers, counters at zero."""
    from localrun.backends.llamacpp.checkpoints import CheckpointStats

    for slot in eng.slots:
        eng.C.llama_memory_seq_rm(eng.mem, slot.seq_id, 0, -1)
        slot.forget()
    eng.kv_cache = None
    if eng.checkpoints is not None:
        eng.checkpoints.stats = CheckpointStats()
        eng.checkpoints.noted.clear()
    return eng


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory):
    """arch → (engine, a second engine of the same model for fresh runs), loaded once for the module."""
    loaded: dict = {}

    def get(arch):
        if arch not in loaded:
            path = cached_layout(tmp_path_factory, arch)
            loaded[arch] = (_engine(path), _engine(path))
        return tuple(_empty(e) for e in loaded[arch])

    yield get
    for pair in loaded.values():
        for e in pair:
            e.close()


def _turn(eng, messages, max_tokens=6):
    """Greedy chat turn on slot 0 → ([(token id, margin over the runner-up)], reply text, Stats)."""
    p = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2, seed=0)
    out, text, stats = [], "", None
    for c in eng.chat(messages, p):
        text += c.text
        for lp in c.logprobs or []:
            others = [v for t, (_, v) in zip(lp.top_ids, lp.top) if t != lp.token_id]
            out.append((lp.token_id, lp.logprob - (others[0] if others else -1e9)))
        stats = c.stats or stats
    return out, text, stats


def _same_greedy(a, b):
    """Token ids equal up to the first step where either run is a near-tie (the CPU's rounding decides it)."""
    assert a and b
    for (ta, ma), (tb, mb) in zip(a, b):
        assert ta == tb
        if min(ma, mb) < 0.05:
            break


def _five_turns(eng, fresh=None):
    """Five turns: 1-3 extend each other, 4 edits turn 2's question, 5 resends turn 3 → the prefix-cache hit
    rate (cached ÷ prompt tokens over the five). With ``fresh``, each turn's tokens are checked against a run of
    the same prompt on ``fresh`` with its cache emptied first."""
    u = ["Which shelves hold red boxes?", "And which hold blue ones?", "Count the green boxes.",
         "Sorry: which hold blue ones, and why?"]
    history = [Message("system", SYSTEM), Message("user", u[0])]
    cached = total = 0

    def run(messages):
        nonlocal cached, total
        toks, reply, st = _turn(eng, messages)
        cached += st.cached_tokens
        total += st.prompt_tokens
        if fresh is not None and st.cached_tokens:
            want, _, fst = _turn(_empty(fresh), messages)
            assert fst.cached_tokens == 0 and fst.prompt_tokens == st.prompt_tokens
            _same_greedy(toks, want)
        return reply

    r1 = run(history)  # turn 1
    t2 = history + [Message("assistant", r1), Message("user", u[1])]
    r2 = run(t2)  # turn 2 extends turn 1
    t3 = t2 + [Message("assistant", r2), Message("user", u[2])]
    run(t3)  # turn 3 extends turn 2
    run(history + [Message("assistant", r1), Message("user", u[3])])  # turn 4 edits turn 2's question
    run(t3)  # turn 5 sends turn 3 again
    return cached / total


@pytest.fixture(scope="module")
def smollm_rate(smollm_path):
    eng = _engine(smollm_path)
    try:
        return _five_turns(eng)
    finally:
        eng.close()


@pytest.mark.model
@pytest.mark.parametrize("arch", ["qwen35", "nemotron_h", "lfm2"])
def test_five_turns_reuse_as_much_as_an_attention_model(arch, smollm_rate, hybrids):
    eng, fresh = hybrids(arch)
    assert eng.recurrent and eng.checkpoints is not None
    rate = _five_turns(eng, fresh)
    st = eng.checkpoints.stats
    assert st.restores >= 2 and st.full_prefills == 0  # turns 4 and 5 cut back into the history
    assert st.held <= eng.checkpoints.max_per_slot and st.held_bytes > 0
    assert rate >= smollm_rate - 0.05, (arch, rate, smollm_rate)


@pytest.mark.model
def test_a_whole_prefill_says_why(hybrids, caplog):
    eng, _ = hybrids("lfm2")
    p = SamplingParams(temperature=0.0, max_tokens=3)
    first = eng.tokenize(SYSTEM)
    list(eng.generate(first, p))
    held = len(eng.slots[0].tokens)
    eng.slots[0].checkpoints.clear()  # as if the budget had evicted them all
    second = first[:-20] + eng.tokenize(" Shelf 99 is empty.", add_special=False)
    cut = common_prefix(eng.slots[0].tokens, second)
    assert cut < len(first)
    with caplog.at_level(logging.INFO, logger="localrun.checkpoints"):
        *_, last = eng.generate(second, p)
    assert last.stats.cached_tokens == 0
    assert f"recurrent state cannot be cut at {cut} of {held}; no checkpoint ≤ {cut}" in caplog.text
    assert eng.checkpoints.stats.full_prefills == 1


@pytest.mark.model
def test_tier_snapshots_of_a_hybrid_restore_through_their_checkpoints_from_ram_and_after_a_restart(hybrids,
                                                                                                  tmp_path):
    from localrun.backends.kv_cache import attach_kv_cache

    eng, other = hybrids("qwen35")
    attach_kv_cache(eng, ram_bytes=64 << 20, disk_dir=tmp_path, disk_bytes=64 << 20)
    h = [Message("system", SYSTEM), Message("user", "Which shelves hold red boxes?")]
    _, r1, st1 = _turn(eng, h)
    _turn(eng, h + [Message("assistant", r1), Message("user", "And which hold blue ones?")])
    held = tuple(eng.slots[0].tokens)
    _turn(eng, [Message("user", "Something else entirely, to take the slot. " * 3)])  # saves `held`
    snap = eng.kv_cache.snapshots[held]
    assert snap.checkpoints and snap.ram_bytes > snap.nbytes
    eng.kv_cache.persist(eng)  # what closing does: the RAM tier to disk, checkpoints with each snapshot
    # turn 2's question edited: the snapshot cannot be cut at the edit, but its checkpoint where turn 2's
    # question begins is restored after it: from RAM here, from the disk file in a new engine (a restart)
    edited = h + [Message("assistant", r1), Message("user", "Sorry: which hold green ones?")]
    from_ram, _, st = _turn(eng, edited)
    assert eng.kv_cache.stats.hits_ram == 1 and st.cached_tokens > st1.prompt_tokens
    assert st.cached_tokens in {c.n_tokens for c in snap.checkpoints}
    attach_kv_cache(other, ram_bytes=64 << 20, disk_dir=tmp_path, disk_bytes=64 << 20)
    assert [c.n_tokens for c in other.kv_cache.snapshots[held].checkpoints] == [c.n_tokens for c in snap.checkpoints]
    from_disk, _, st2 = _turn(other, edited)
    assert other.kv_cache.stats.hits_disk == 1 and st2.cached_tokens == st.cached_tokens
    assert [t for t, _ in from_disk] == [t for t, _ in from_ram]  # the same state: the same computation after it
    cold, _, _ = _turn(_empty(eng), edited)
    _same_greedy(from_ram, cold)


@pytest.mark.model
def test_speculation_on_a_hybrid_is_refused(hybrids):
    from localrun.errors import LocalrunError

    eng, _ = hybrids("qwen35")
    for mode in ("ngram", "auto"):
        with pytest.raises(LocalrunError) as e:
            eng.set_speculation(mode)
        assert "recurrent layers" in e.value.message and "--spec off" in e.value.hint
    assert eng.speculation is None
    eng.set_speculation("off")  # always allowed


# ---------------------------------------------------------------------------------------- the policy (no model)
def _policy(n_slots=2, **kw):
    eng = SimpleNamespace(C=SimpleNamespace(LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY=1),
                          slots=[Slot(seq_id=i) for i in range(n_slots)])
    return eng, Checkpoints(eng, **kw)


def test_prefill_stops_at_interval_multiples_the_tails_and_the_user_turn():
    _, cps = _policy(interval=512, tails=(4, 1))
    marks = cps.marks(100)
    assert marks == (96, 99) and cps.next_stop(0, 100, marks) == 96 and cps.next_stop(96, 100, marks) == 99
    assert cps.next_stop(99, 100, marks) == 100
    marks = cps.marks(1500, turn_start=1200)
    assert marks == (1200, 1496, 1499)
    assert [cps.next_stop(n, 1500, marks) for n in (0, 512, 1024, 1200, 1496, 1499)] == [512, 1024, 1200, 1496,
                                                                                        1499, 1500]
    assert [n for n in range(1, 1501) if cps.wanted(n, 1500, marks)] == [512, 1024, 1200, 1496, 1499, 1500]
    assert cps.marks(3, turn_start=5) == (2,)  # a mark outside the prompt is none


def test_eviction_keeps_the_spacing_and_the_budgets():
    eng, cps = _policy(max_per_slot=3, max_bytes=10)
    s0, s1 = eng.slots
    for n in (100, 200, 210):
        s0.checkpoints.append(Checkpoint(n, 2, None))
    newest = Checkpoint(400, 2, None)
    s0.checkpoints.append(newest)
    cps._keep_budget(newest)
    assert [c.n_tokens for c in s0.checkpoints] == [100, 200, 400]  # 210 was nearest the one before it
    s1.checkpoints += [Checkpoint(50, 2, None), Checkpoint(60, 2, None), Checkpoint(300, 2, None)]
    cps._keep_budget(s1.checkpoints[-1])  # 12 bytes over 10: the one nearest its predecessor goes, in any slot
    assert [c.n_tokens for c in s1.checkpoints] == [50, 300] and len(s0.checkpoints) == 3
    assert cps.stats.evictions == 2 and cps.stats.held == 5 and cps.stats.held_bytes == 10
