"""KV-cache tiers (issue 17 item 4): a snapshot at the end of the system prompt. Two chat requests with the
same long system prompt and different user turns: the first stops its prefill there and saves the KV; the
second restores it and evaluates only the rest, on SmolLM2 and on Gemma-3 (sliding window: an exact
boundary), and answers as a cold run does. Also: the tiers' budgets hold for the folder and the RSS."""

from __future__ import annotations

import pytest
from test_kv_tiers import MiB, _cached, _files, _run, _same_greedy, _text

from localrun.backends.base import Message
from localrun.backends.text import common_prefix

pytestmark = pytest.mark.model


def _chat_engine(path, folder=None, *, n_ctx=2048):
    """An engine with a chat template (Gemma-3-270M is a base model: the builtin gemma template)."""
    from localrun.backends import load_engine
    from localrun.backends.kv_cache import attach_kv_cache
    from localrun.model.chat_template import load_template
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    tmpl = load_template("gemma") if "gemma" in str(path).lower() else None
    eng = load_engine(path, simple_plan(read_gguf(path), n_ctx=n_ctx), chat_template=tmpl)
    if folder is not None:
        attach_kv_cache(eng, ram_bytes=256 * MiB, disk_dir=folder, disk_bytes=256 * MiB)
    return eng


@pytest.fixture(params=["smollm", "gemma"])
def model_path(request, smollm_path, gemma_path):
    return smollm_path if request.param == "smollm" else gemma_path


def test_second_request_restores_the_system_prompt_snapshot(model_path, tmp_path):
    eng = _chat_engine(model_path, tmp_path)
    # Gemma: ≈ 560 tokens, past its 512-token window (the SWA cache has dropped the start); SmolLM2 has no
    # window: ≈ 110 tokens, well over the cache's 32-token minimum
    n_items = 62 if eng.n_swa else 12
    system = Message("system", "You are a careful assistant. Here is the inventory. " + _text(eng, n_items))
    first = [system, Message("user", "What colour is item 7?")]
    second = [system, Message("user", "Tell me which items are green, and how many boxes there are.")]
    kv = eng.kv_cache
    try:
        _, ids1 = eng.tokenize_chat(first)
        _, ids2 = eng.tokenize_chat(second)
        (b,) = set(kv.boundaries.values())
        assert ids1[:b] == ids2[:b]  # the system prompt (Gemma: 32+ tokens longer than its window) ...
        assert b > (eng.n_swa + 32 if eng.n_swa else 100)
        assert b >= common_prefix(ids1, ids2) - 3  # ... ending where the user turns part (± the BPE at the edge)
        _, cached = _run(eng, ids1, max_tokens=4)
        assert cached == 0 and kv.stats.saves == 1  # stopped at the boundary and saved it, mid-prefill
        assert any(len(t) == b for t in kv.snapshots) or not eng.n_swa  # (SmolLM2 may fold it into a longer one)
        _run(eng, eng.tokenize("An unrelated document about the weather in spring. " * 4), max_tokens=1)
        restored, cached = _run(eng, ids2, max_tokens=8)  # the slot was reused: only a snapshot can help
        assert kv.stats.hits_ram == 1
        if eng.n_swa:
            assert cached == b  # exactly the boundary: evaluated = the user's turn only
        else:
            assert b <= cached == common_prefix(ids1, ids2)
        assert len(ids2) - cached < len(ids2) - b + 4
    finally:
        eng.close()
    cold_eng = _chat_engine(model_path)
    try:
        cold, cached = _run(cold_eng, ids2, max_tokens=8)
    finally:
        cold_eng.close()
    assert cached == 0
    _same_greedy(restored, cold)


def test_no_boundary_without_a_system_message_or_a_cache(smollm_path, tmp_path):
    eng = _chat_engine(smollm_path, tmp_path)
    try:
        eng.tokenize_chat([Message("user", _text(eng, 40))])
        eng.tokenize_chat([Message("system", "Be brief."), Message("user", _text(eng, 40))])  # too short
        assert not eng.kv_cache.boundaries
    finally:
        eng.close()


def test_budgets_hold_for_the_folder_and_the_rss(smollm_path, tmp_path):
    """Ten ~450-token snapshots (≈ 10 MB each, 100 MB unbounded) through a 12 MiB RAM tier and a 24 MiB disk
    tier: the folder stays within its budget after every request, and the process RSS grows by at most the
    RAM budget (plus 24 MiB for the allocator's slack)."""
    import psutil

    ram, disk = 12 * MiB, 24 * MiB
    eng = _cached(smollm_path, tmp_path, n_ctx=1024, ram=ram, disk=disk)
    kv = eng.kv_cache
    proc = psutil.Process()
    try:
        base = eng.tokenize(_text(eng, 60))[:450]
        _run(eng, base, max_tokens=1)  # the context's KV pages are touched: the baseline holds them
        rss0 = proc.memory_info().rss
        for i in range(10):
            # each prompt cuts the slot's tokens (saved first: one ~10 MB snapshot) and prefills ~10 tokens
            prompt = base[: 440 - 5 * i] + eng.tokenize(f" Question {i}: which item is red?", add_special=False)
            _run(eng, prompt, max_tokens=1)
            assert sum(p.stat().st_size for p in _files(tmp_path)) <= disk
            assert kv.ram_used_bytes <= ram
            assert proc.memory_info().rss - rss0 <= ram + 24 * MiB
        assert kv.stats.saves == 10 and kv.stats.spills >= 5
    finally:
        eng.close()
    assert sum(p.stat().st_size for p in _files(tmp_path)) <= disk
