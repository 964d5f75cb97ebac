"""`fit`'s tier plan counts a hybrid's context checkpoints (``backends/llamacpp/checkpoints.py``): one is one
sequence's recurrent state, the engine keeps up to 16 per sequence slot and 1 GiB in all; `fit` prints their
RAM on its own line, ``--json``'s ``kv_tiers`` has them, and its RAM total counts them. A hybrid's KV-tier
snapshot holds the attention KV and the recurrent state. Fast tier: header-only files (tests/tiny_layouts.py)
and plans built by hand; the sizes against llama.cpp's own are in test_checkpoint_metrics.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tiny_layouts import WRITERS

from localrun.offload.kv_tiers import (
    CHECKPOINTS_MAX_BYTES,
    CHECKPOINTS_PER_SLOT,
    GIB,
    checkpoint_budget,
    plan_kv_tiers,
)

MiB = 1 << 20


def test_the_planner_bounds_are_the_engine_bounds():
    from localrun.backends.llamacpp import checkpoints

    assert (CHECKPOINTS_PER_SLOT, CHECKPOINTS_MAX_BYTES) == (checkpoints.MAX_PER_SLOT, checkpoints.MAX_BYTES)


def test_checkpoints_are_bounded_per_slot_then_by_bytes():
    assert checkpoint_budget(0, 4) == (0, 0, 0)  # no recurrent layers: no checkpoints
    assert checkpoint_budget(4 * MiB, 2) == (2 * MiB, 32, 64 * MiB)  # 16 per slot × 2 slots
    # issue 45's qwen35-family log at 32k × 4 sequences: recurrent state 301.5 MiB → 75.4 MiB a sequence;
    # 64 by count, but 1 GiB holds 13 of them
    one, n, total = checkpoint_budget(int(301.5 * MiB), 4)
    assert one == int(301.5 * MiB) // 4 and n == 13 and total == 13 * one <= GIB
    assert checkpoint_budget(3 * GIB, 2) == (3 * GIB // 2, 0, 0)  # bigger than the budget: never saved


def _plan(**kw):
    base = dict(kv_cache_bytes=64 * MiB, recurrent_bytes=0, n_parallel=2, n_ctx=4096, ram_bytes=2 * GIB,
                prefill_tok_s=0.0)
    return SimpleNamespace(**{**base, **kw})


def test_a_hybrid_snapshot_holds_its_recurrent_state_and_the_ram_total_counts_the_checkpoints():
    attn = plan_kv_tiers(_plan(), 16 * GIB)
    assert attn.snapshot_bytes == 32 * MiB and attn.checkpoints_max == attn.checkpoints_ram_bytes == 0
    assert attn.ram_total_bytes == 2 * GIB + attn.ram_bytes
    hyb = plan_kv_tiers(_plan(recurrent_bytes=8 * MiB), 16 * GIB)
    assert hyb.snapshot_bytes == (64 + 8) * MiB // 2 and hyb.checkpoint_bytes == 4 * MiB
    assert hyb.checkpoints_max == 32 and hyb.checkpoints_ram_bytes == 128 * MiB
    assert hyb.ram_bytes == attn.ram_bytes  # serve sizes its RAM tier before any checkpoint exists
    assert hyb.ram_total_bytes == 2 * GIB + 128 * MiB + hyb.ram_bytes


@pytest.fixture(scope="module")
def qwen35_header(tmp_path_factory):
    return WRITERS["qwen35"](tmp_path_factory.mktemp("fitcp") / "q.gguf", tokenizer_from=False)


def test_fit_json_has_the_checkpoints_in_its_tier_plan(qwen35_header, capsys):
    from localrun.commands.fit import run_fit

    run_fit(str(qwen35_header), ctx=4096, parallel=2, json_out=True, preset="laptop-16gb")
    d = json.loads(capsys.readouterr().out)
    t = d["kv_tiers"]
    assert d["recurrent_bytes"] > 0 and d["kv_cache_bytes"] > 0
    assert t["snapshot_bytes"] == (d["kv_cache_bytes"] + d["recurrent_bytes"]) // 2
    assert t["checkpoint_bytes"] == d["recurrent_bytes"] // 2
    assert t["checkpoints_max"] == 2 * CHECKPOINTS_PER_SLOT
    assert t["checkpoints_ram_bytes"] == t["checkpoints_max"] * t["checkpoint_bytes"]
    assert t["ram_total_bytes"] == d["ram_bytes"] + t["checkpoints_ram_bytes"] + t["ram_bytes"]
    assert t["snapshots_in_ram"] == t["ram_bytes"] // t["snapshot_bytes"]  # the older fields stay


def test_fit_prints_the_checkpoints_line_for_a_hybrid_only(qwen35_header, smollm_path, capsys):
    from localrun.commands.fit import run_fit
    from localrun.machine.hardware import fmt_bytes

    run_fit(str(qwen35_header), ctx=4096, parallel=2, preset="laptop-16gb")
    lines = [x for x in capsys.readouterr().out.splitlines() if "context checkpoints:" in x]
    assert len(lines) == 1
    run_fit(str(qwen35_header), ctx=4096, parallel=2, json_out=True, preset="laptop-16gb")
    t = json.loads(capsys.readouterr().out)["kv_tiers"]
    assert f"up to {t['checkpoints_max']} × {fmt_bytes(t['checkpoint_bytes'])}" in lines[0]
    assert f"RAM {fmt_bytes(t['checkpoints_ram_bytes'])}" in lines[0]
    assert f"RAM in all ≤ {fmt_bytes(t['ram_total_bytes'])}" in lines[0]
    run_fit(str(smollm_path), ctx=2048, preset="laptop-16gb")
    assert "context checkpoints" not in capsys.readouterr().out
