"""`fit`'s tier plan counts a hybrid's context checkpoints (``backends/llamacpp/checkpoints.py``): one is one
sequence's recurrent state, the engine keeps up to 16 per sequence slot, and in all what every slot's 16 take,
at most a quarter of the RAM the model leaves (never below 1 GiB: ``checkpoint_max_bytes``); `fit` prints their
RAM on its own line, ``--json``'s ``kv_tiers`` has them, and its RAM total counts them. A hybrid's KV-tier
snapshot holds the attention KV and the recurrent state. Fast tier: header-only files (tests/tiny_layouts.py)
and plans built by hand; the sizes against llama.cpp's own are in test_checkpoint_metrics.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tiny_layouts import WRITERS

from localrun.offload.kv_tiers import (
    CHECKPOINTS_MIN_BYTES,
    CHECKPOINTS_PER_SLOT,
    GIB,
    checkpoint_budget,
    checkpoint_max_bytes,
    plan_kv_tiers,
)

MiB = 1 << 20


def test_the_planner_bounds_are_the_engine_bounds():
    from localrun.backends.llamacpp import checkpoints

    assert CHECKPOINTS_PER_SLOT == checkpoints.MAX_PER_SLOT == 16
    assert checkpoints.checkpoint_max_bytes is checkpoint_max_bytes  # one formula for fit and the engine


def test_checkpoints_are_bounded_per_slot_then_by_bytes():
    assert checkpoint_budget(0, 4) == (0, 0, 0)  # no recurrent layers: no checkpoints
    assert checkpoint_budget(4 * MiB, 2) == (2 * MiB, 32, 64 * MiB)  # 16 per slot × 2 slots
    # issue 45's qwen35-family log at 32k × 4 sequences: recurrent state 301.5 MiB → 75.4 MiB a sequence;
    # with no RAM to spare the 1 GiB floor holds 13 of them (3 a slot) …
    one, n, total = checkpoint_budget(int(301.5 * MiB), 4)
    assert one == int(301.5 * MiB) // 4 and n == 13 and total == 13 * one <= GIB
    # … with 16 GiB left a quarter of it (4 GiB) holds 54; with 20 GiB left (5 GiB) all 64, 16 a slot (4.7 GiB)
    assert checkpoint_budget(int(301.5 * MiB), 4, 16 * GIB)[1] == 54
    assert checkpoint_budget(int(301.5 * MiB), 4, 20 * GIB) == (one, 64, 64 * one)
    assert checkpoint_budget(int(301.5 * MiB), 4, 64 * GIB)[1] == 64  # never more than 16 a slot
    assert checkpoint_budget(3 * GIB, 2) == (3 * GIB // 2, 0, 0)  # bigger than the budget: never saved


def test_the_budget_follows_the_model_bounded_by_the_ram_left():
    """``min(16 × slots × one, max(1 GiB, RAM left / 4))``: a Qwen3.6-27B (48 delta-net layers, d_inner 6144,
    16 groups × d_state 128, conv 4) at 32k × 4 sequences has 149.6 MiB a checkpoint; the former fixed 1 GiB held
    6 in all (1.5 a slot), 40 GiB left holds all 16 a slot (9.35 GiB), 16 GiB left 4 GiB = 27 (6 a slot)."""
    one = 48 * (3 * (6144 + 2 * 16 * 128) + 128 * 6144) * 4
    assert one == 156_893_184 and GIB // one == 6
    assert checkpoint_max_bytes(one, 4, 0) == CHECKPOINTS_MIN_BYTES
    assert checkpoint_max_bytes(one, 4, 40 * GIB) == 16 * 4 * one == pytest.approx(9.35 * GIB, rel=0.001)
    assert checkpoint_max_bytes(one, 4, 16 * GIB) == 4 * GIB and checkpoint_budget(4 * one, 4, 16 * GIB)[1] == 27
    assert checkpoint_max_bytes(MiB, 1, 64 * GIB) == 16 * MiB  # a small model takes only what its 16 need


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
    assert t["checkpoints_max"] == 2 * CHECKPOINTS_PER_SLOT  # a tiny model's 16 a slot fit the 1 GiB floor
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


def test_fit_keeps_every_slot_s_checkpoints_for_a_27b_hybrid_at_32k_by_4(isolated_home, capsys):
    """`fit qwen3.6-27b --ctx 32768 --parallel 4` on the 24 GB GPU + 64 GB RAM preset: a checkpoint is one sequence's
    48-layer delta-net state (149.6 MiB), and the RAM the model leaves holds all 16 a slot (64, 9.35 GiB), where the
    former fixed 1 GiB held 6 in all; `--json`'s numbers are ``checkpoint_budget``'s of the plan."""
    from localrun.commands.fit import run_fit

    assert run_fit("qwen3.6-27b", ctx=32768, parallel=4, preset="nvidia-24gb", json_out=True) == 0
    d = json.loads(capsys.readouterr().out)
    t = d["kv_tiers"]
    assert t["checkpoint_bytes"] == d["recurrent_bytes"] // 4 == 156_893_184
    assert t["checkpoints_max"] == 4 * CHECKPOINTS_PER_SLOT and t["checkpoints_ram_bytes"] == 64 * 156_893_184
    assert GIB // t["checkpoint_bytes"] == 6
