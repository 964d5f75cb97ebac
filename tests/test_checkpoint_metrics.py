"""A hybrid's context checkpoints (``backends/llamacpp/checkpoints.py``) through a real server: /metrics
exports the engine's checkpoint counters per model (saves, restores and the tokens they kept, whole prefills,
evictions, checkpoints and bytes held), and the sizes llama.cpp gives match what `fit` plans: one checkpoint
is one sequence's recurrent state (within 1 %: its serialization headers), a sequence's snapshot its
attention KV plus that state (and llama.cpp's per-cell metadata). A tiny random-weight Qwen3.5 layout
(tests/tiny_layouts.py): its text means nothing, so nothing here reads it."""

from __future__ import annotations

import httpx
import pytest
from helpers import ServerThread, metric_value
from tiny_layouts import cached_layout

pytestmark = pytest.mark.model

SYSTEM = "You are a careful assistant for a warehouse. " + " ".join(
    f"Shelf {i} holds {['red', 'blue', 'green'][i % 3]} boxes." for i in range(6))


def serve(tmp_path):
    from localrun.commands.serve import make_registry
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    settings = Settings(home=tmp_path, models_dir=tmp_path / "models")
    opts = ServeOptions()
    reg = make_registry(settings, opts, parallel=1, ctx=512, threads=1)
    return ServerThread(create_app(None, settings, opts, registry=reg)), reg


def chat(http, model, system, question):
    r = http.post("/v1/chat/completions", json={
        "model": model, "max_tokens": 3, "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    return r.json()


def test_metrics_export_the_checkpoint_counters_and_sizes_match_the_plan(tmp_path, tmp_path_factory):
    from localrun.offload.kv_tiers import plan_kv_tiers

    path = str(cached_layout(tmp_path_factory, "qwen35"))
    srv, reg = serve(tmp_path)
    try:
        with httpx.Client(base_url=srv.url, timeout=600) as http:
            first = chat(http, path, SYSTEM, "Which shelves hold red boxes?")
            model = first["model"]
            res = reg.residents[path]
            eng, plan = res.state.engine, res.planned.plan
            assert eng.checkpoints is not None and eng.n_parallel == 1
            # a snapshot of the sequence now (llama.cpp's size): its cells' attention KV + its recurrent state,
            # and per cell its position, sequence ids and M-RoPE's extra positions (≤ 24 bytes,
            # src/llama-kv-cache.cpp state_write_meta: 5 % of this tiny model's 512-byte cells, not priced)
            n = len(eng.slots[0].tokens)
            snap = int(eng.C.llama_state_seq_get_size(eng.ctx, eng.slots[0].seq_id))
            tiers = plan_kv_tiers(plan, 1 << 34)
            want = plan.kv_cache_bytes * n // plan.n_ctx + tiers.checkpoint_bytes
            assert want <= snap <= want * 1.01 + 24 * n
            assert tiers.snapshot_bytes == plan.kv_cache_bytes + plan.recurrent_bytes  # one sequence
            # the edited question parts from turn 1 where the user message begins: a checkpoint restores there
            second = chat(http, path, SYSTEM, "Which shelves hold blue boxes?")
            kept = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert 0 < kept < second["usage"]["prompt_tokens"]
            # another system prompt shares only the ChatML header: no checkpoint that early, prefilled whole
            third = chat(http, path, "Answer briefly.", "Hi")
            assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            text = http.get("/metrics").text
            st = eng.checkpoints.stats
    finally:
        srv.stop()
        reg.close()

    def m(name):
        return metric_value(text, name, model=model)

    assert m("localrun_checkpoint_restores_total") == st.restores == 1
    assert m("localrun_checkpoint_restored_tokens_total") == st.restored_tokens == kept
    assert m("localrun_checkpoint_full_prefills_total") == st.full_prefills == 1
    assert metric_value(text, "localrun_checkpoint_full_prefills_total", model=model, reason="no_checkpoint") == 1
    assert metric_value(text, "localrun_checkpoint_full_prefills_total", model=model, reason="restore_failed") == 0
    assert m("localrun_checkpoint_saves_total") == st.saves >= 3  # each prompt's end at least
    assert m("localrun_checkpoint_evictions_total") == st.evictions
    assert m("localrun_checkpoints_held") == st.held >= 1
    assert m("localrun_checkpoint_bytes") == st.held_bytes
    # one checkpoint is one sequence's recurrent state, as fit plans it
    assert st.held_bytes / st.held == pytest.approx(tiers.checkpoint_bytes, rel=0.01)
