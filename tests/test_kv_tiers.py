"""KV-cache tiers (issue 17) on the real models, through the engine: a restored snapshot reuses its prefix
and gives what a cold run gives; the disk tier survives a restart; bad files are ignored, reported and
deleted; budgets hold; Gemma-3's sliding window restores only exact boundaries."""

from __future__ import annotations

import logging
import shutil

import pytest

from localrun.backends.base import SamplingParams
from localrun.backends.kv_cache import SUFFIX, attach_kv_cache

MiB = 1 << 20


def _engine(path, n_ctx=1024):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    return load_engine(path, simple_plan(read_gguf(path), n_ctx=n_ctx))


def _cached(path, folder, *, n_ctx=1024, ram=256 * MiB, disk=256 * MiB):
    eng = _engine(path, n_ctx)
    attach_kv_cache(eng, ram_bytes=ram, disk_dir=folder, disk_bytes=disk)
    return eng


def _run(eng, tokens, max_tokens=8):
    """Greedy → ([(token id, logprob, margin over the runner-up)], cached prompt tokens)."""
    p = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2, seed=0)
    out, stats = [], None
    for c in eng.generate(list(tokens), p):
        for lp in c.logprobs or []:
            others = [v for t, (_, v) in zip(lp.top_ids, lp.top) if t != lp.token_id]
            out.append((lp.token_id, lp.logprob, lp.logprob - (others[0] if others else -1e9)))
        stats = c.stats or stats
    return out, stats.cached_tokens


def _same_greedy(a, b, tol=0.15):
    """Token ids equal and logprobs within ``tol`` (the kernels round differently for other batch shapes),
    up to the first step where either run is a near-tie (the CPU decides it)."""
    assert a and b
    for (ta, la, ma), (tb, lb, mb) in zip(a, b):
        assert ta == tb
        assert abs(la - lb) < tol
        if min(ma, mb) < 0.3:
            break


def _text(eng, n_items):
    return " ".join(f"Item {i} is a {['red', 'blue', 'green'][i % 3]} box." for i in range(n_items))


def _files(folder):
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_restored_prefix_equals_slot_and_cold_runs(smollm_path, tmp_path):
    eng = _cached(smollm_path, tmp_path)
    prefix = eng.tokenize(_text(eng, 8))  # ≈ 65 tokens: over the 32-token minimum a snapshot needs
    suffix = eng.tokenize(" The colour of item 7 is", add_special=False)
    other = eng.tokenize("A different prompt about cats and dogs, long enough to be saved. " * 4)
    try:
        first, _ = _run(eng, prefix)
        held = list(eng.slots[0].tokens)  # the prompt and the decoded answer
        assert held[: len(prefix)] == prefix and len(held) > len(prefix)
        _, cached = _run(eng, held + suffix)  # the slot's own prefix cache
        assert cached == len(held)
        in_slot, cached = _run(eng, held + suffix)  # all cached: only the last prompt token is decoded again
        assert cached == len(held + suffix) - 1
        _run(eng, other)  # the slot is reused: its KV is saved to the RAM tier first
        restored, cached = _run(eng, held + suffix)
        assert cached == len(held + suffix) - 1 and eng.kv_cache.stats.hits_ram == 1
        assert restored == in_slot  # the same KV, the same computation after it: bit-identical logits
    finally:
        eng.close()
    cold_eng = _engine(smollm_path)
    try:
        cold, cached = _run(cold_eng, held + suffix)
    finally:
        cold_eng.close()
    assert cached == 0
    _same_greedy(restored, cold)


def test_restart_hits_the_disk_tier(smollm_path, tmp_path):
    """A 120-token shared prefix (≈ 2.8 MB of KV, more than the 2 MiB RAM tier holds: it goes to disk and is
    not promoted back): the second process restores it from disk and prefills only the rest."""
    eng = _cached(smollm_path, tmp_path, n_ctx=512, ram=2 * MiB)
    prefix = eng.tokenize(_text(eng, 15))[:120]
    try:
        _run(eng, prefix, max_tokens=1)
    finally:
        eng.close()  # persist: the slot → RAM tier → disk
    assert len(_files(tmp_path)) == 1
    eng = _cached(smollm_path, tmp_path, n_ctx=512, ram=2 * MiB)
    try:
        suffix = eng.tokenize(" The colour of item 7 is", add_special=False)
        _, cached = _run(eng, prefix + suffix, max_tokens=2)
        assert len(prefix) == cached == 120
        assert eng.kv_cache.stats.hits_disk == 1 and eng.kv_cache.stats.hits_ram == 0
    finally:
        eng.close()


@pytest.fixture(scope="module")
def pristine_snapshot(smollm_path, tmp_path_factory):
    """A disk tier holding one SmolLM2 snapshot, written once for the module → (folder, its file's path in it,
    the prompt that restores it)."""
    folder = tmp_path_factory.mktemp("pristine")
    eng = _cached(smollm_path, folder)
    prompt = eng.tokenize(_text(eng, 5))  # ≈ 40 tokens: over the 32-token minimum, ≈ 0.9 MB of KV
    longer = prompt + eng.tokenize(" Item 3 is", add_special=False)
    try:
        _run(eng, prompt, max_tokens=1)
    finally:
        eng.close()
    (f,) = _files(folder)
    return folder, f.relative_to(folder), longer


@pytest.fixture
def one_snapshot(pristine_snapshot, tmp_path):
    """A disk tier holding one SmolLM2 snapshot (a copy of the module's) → (folder, its file, the prompt that
    restores it)."""
    src, rel, longer = pristine_snapshot
    shutil.copytree(src, tmp_path / "cache")
    return tmp_path / "cache", tmp_path / "cache" / rel, longer


def _reload_and_run(smollm_path, folder, prompt, caplog):
    with caplog.at_level(logging.WARNING, logger="localrun.kv_cache"):
        eng = _cached(smollm_path, folder)
        try:
            out, cached = _run(eng, prompt, max_tokens=2)
        finally:
            eng.kv_cache.disk_dir = None  # no persisting: the test looks at what the bad file left
            eng.close()
    return cached, [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING], eng.kv_cache.stats


def test_flipped_byte_is_ignored_reported_and_deleted(smollm_path, one_snapshot, caplog):
    folder, f, prompt = one_snapshot
    data = bytearray(f.read_bytes())
    data[-1000] ^= 0x40  # in the payload: only the checksum can tell
    f.write_bytes(bytes(data))
    cached, warnings, stats = _reload_and_run(smollm_path, folder, prompt, caplog)
    assert cached == 0 and stats.corrupt_files == 1 and stats.hits_disk == 0
    assert any("checksum" in w for w in warnings)
    assert not f.exists()


def test_truncated_file_is_ignored_reported_and_deleted(smollm_path, one_snapshot, caplog):
    folder, f, prompt = one_snapshot
    f.write_bytes(f.read_bytes()[:-4096])
    cached, warnings, stats = _reload_and_run(smollm_path, folder, prompt, caplog)
    assert cached == 0 and stats.corrupt_files == 1
    assert any("truncated" in w for w in warnings)
    assert not f.exists()


def test_other_models_file_is_ignored_reported_and_deleted(smollm_path, gemma_path, one_snapshot, caplog, tmp_path):
    folder, f, prompt = one_snapshot
    g = _cached(gemma_path, tmp_path / "gemma")
    try:
        _run(g, g.tokenize(_text(g, 5)), max_tokens=1)
    finally:
        g.close()
    (gf,) = _files(tmp_path / "gemma")
    f.unlink()
    foreign = f.parent / gf.name
    shutil.copy(gf, foreign)
    cached, warnings, stats = _reload_and_run(smollm_path, folder, prompt, caplog)
    assert cached == 0 and stats.corrupt_files == 1
    assert any("another model" in w for w in warnings)
    assert not foreign.exists()


def test_budgets_are_kept(smollm_path, tmp_path):
    """RAM holds about one snapshot (≈ 45 tokens, 1.1 MB), disk about two: older ones spill, then leave the disk
    LRU first."""
    eng = _cached(smollm_path, tmp_path, ram=3 * MiB // 2, disk=7 * MiB // 2)
    kv = eng.kv_cache
    try:
        for i in range(5):
            _run(eng, eng.tokenize(f"Prompt number {i}. " + _text(eng, 5)), max_tokens=1)
            assert kv.ram_used_bytes <= kv.ram_bytes
            assert sum(p.stat().st_size for p in _files(tmp_path)) <= kv.disk_bytes
        assert kv.stats.saves == 4 and kv.stats.spills >= 2
        assert 1 <= len(_files(tmp_path)) <= 3
        assert all(p.suffix == SUFFIX for p in _files(tmp_path))
    finally:
        eng.close()
    assert sum(p.stat().st_size for p in _files(tmp_path)) <= 7 * MiB // 2


def test_gemma_sliding_window_restores_only_exact_boundaries(gemma_path, tmp_path, caplog):
    eng = _cached(gemma_path, tmp_path, n_ctx=1024)
    assert eng.n_swa and eng.n_swa + 32 < 560
    turn = eng.tokenize(_text(eng, 70))[:560]  # longer than the window: the SWA cache has dropped its start
    other = eng.tokenize("Another document about the weather in spring and summer. " * 3)
    suffix = eng.tokenize(" Item 7 is a", add_special=False)
    try:
        first, _ = _run(eng, turn, max_tokens=4)
        boundary = list(eng.slots[0].tokens)  # the end of the first turn
        _run(eng, other, max_tokens=1)  # saves the first turn's KV at its end: a boundary
        with caplog.at_level(logging.DEBUG, logger="localrun.kv_cache"):
            restored, cached = _run(eng, boundary + suffix)
        assert cached == len(boundary) and eng.kv_cache.stats.hits_ram == 1
        assert any("exact boundary" in r.getMessage() for r in caplog.records)
        # a prompt that leaves the boundary inside the window is not restored (its window would be wrong)
        _run(eng, other, max_tokens=1)
        _, cached = _run(eng, turn[:160] + suffix)  # 160 > 564 - n_swa: inside the snapshot's window
        assert cached <= 1 and eng.kv_cache.stats.hits_ram == 1  # at most the BOS the slot's prompt shares
    finally:
        eng.close()
    cold_eng = _engine(gemma_path, 1024)
    try:
        cold, cached = _run(cold_eng, boundary + suffix)
    finally:
        cold_eng.close()
    assert cached == 0
    _same_greedy(restored, cold)


def test_chat_save_then_load_in_a_new_engine_evaluates_only_the_new_turn(smollm_path, tmp_path):
    from localrun.chat.session import ChatSession, kv_path

    params = SamplingParams(temperature=0.0, max_tokens=8)
    eng = _engine(smollm_path, 1024)
    try:
        s = ChatSession(eng, params)
        list(s.send("Here is a list to remember. " + _text(eng, 8) + " Which items are red?"))
        first = s.last_stats
        path = s.save(tmp_path / "chat.json")
    finally:
        eng.close()
    assert kv_path(path).is_file() and first.cached_tokens == 0
    eng = _engine(smollm_path, 1024)  # a new process would load the same way
    try:
        t = ChatSession(eng, params)
        assert t.load(path) == 2 and t.kv_restored_tokens > first.prompt_tokens and not t.notices
        question = "And which are blue?"
        list(t.send(question))
        st = t.last_stats
        assert st.cached_tokens == t.kv_restored_tokens
        # evaluated: the end of the answer's turn, the new user turn and the assistant header, nothing older
        assert 0 < st.prompt_tokens - st.cached_tokens <= len(eng.tokenize(question, add_special=False)) + 12
    finally:
        eng.close()


def test_chat_load_ignores_another_models_kv_and_prefills(smollm_path, gemma_path, tmp_path):
    from localrun.chat.session import ChatSession, kv_path

    eng = _engine(smollm_path, 1024)
    try:
        s = ChatSession(eng, SamplingParams(temperature=0.0, max_tokens=4))
        list(s.send("Say hi."))
        path = s.save(tmp_path / "chat.json")
    finally:
        eng.close()
    g = _engine(gemma_path, 1024)
    try:
        t = ChatSession(g, SamplingParams(temperature=0.0, max_tokens=4))
        assert t.load(path) == 2 and t.kv_restored_tokens == 0
        assert any("another model" in n for n in t.notices) and not g.slots[0].tokens
        assert kv_path(path).is_file()  # the user's file is left alone
    finally:
        g.close()
