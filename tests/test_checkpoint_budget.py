"""A hybrid's context-checkpoint budget follows the model (``backends/llamacpp/checkpoints.py`` with
``offload.kv_tiers.checkpoint_max_bytes``, the formula `fit` prices them with): the engine sizes it from
llama.cpp's own size of a checkpoint, its slots and the RAM left, so a large layout's slots each keep their 16
where a fixed 1 GiB kept 6 in all. A tiny random-weight Qwen3.5 (tests/tiny_layouts.py) whose delta-net layers
have Qwen3.6-27B's widths (d_inner 6144 = 48 heads × 128, 16 groups × d_state 128, conv 4: models.toml), n_embd
64 and 4 layers (3 delta-net), loaded by the real llama.cpp with 4 sequence slots; its text means nothing."""

from __future__ import annotations

import pytest
from tiny_layouts import cached_layout

from localrun.backends.base import Message, SamplingParams
from localrun.backends.llamacpp.checkpoints import MAX_PER_SLOT, Checkpoints
from localrun.offload.kv_tiers import CHECKPOINTS_MIN_BYTES, checkpoint_budget, checkpoint_max_bytes

pytestmark = pytest.mark.model

GiB, MiB = 1 << 30, 1 << 20
WIDE = dict(n_embd=64, n_layer=4, ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=48)  # Qwen3.6-27B's delta-net
LAYER_STATE = (3 * (6144 + 2 * 16 * 128) + 128 * 6144) * 4  # its R + S per layer and sequence, F32 bytes


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    from dataclasses import replace

    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    path = cached_layout(tmp_path_factory, "qwen35", **WIDE)
    plan = replace(simple_plan(read_gguf(path), n_ctx=512), n_parallel=4, n_threads=1, n_threads_batch=1)
    eng = load_engine(str(path), plan)
    yield eng
    eng.close()


def test_a_large_layouts_slots_each_keep_their_checkpoints(wide):
    """llama.cpp's checkpoint of the 3 wide delta-net layers is 3 × the 27B's per-layer state (+ its headers);
    the engine's budget is the shared formula of that size, 4 slots and the RAM left; a long prompt checkpointed
    every 16 tokens keeps exactly 16 in its slot (evicted by count, never by bytes). Scaled to the 27B's 48
    delta-net layers at 4 slots: with 40 GiB left every slot keeps 16 (9.35 GiB); the fixed 1 GiB kept 6."""
    eng = wide
    assert eng.checkpoints is not None and eng.checkpoints.follows_model and len(eng.slots) == 4
    cps = eng.checkpoints = Checkpoints(eng, interval=16)  # the engine's own budget rule, denser positions
    words = " ".join(f"crate {i} holds {i * 7 % 13} bolts." for i in range(24))
    p = SamplingParams(temperature=0.0, max_tokens=2, seed=0)
    list(eng.chat([Message("user", words)], p))
    held = [c for s in eng.slots for c in s.checkpoints]
    size = max(c.nbytes for c in held)
    assert 3 * LAYER_STATE <= size <= 3 * LAYER_STATE * 1.01  # 9.35 MiB: the 27B's state for 3 layers
    assert cps.max_bytes == checkpoint_max_bytes(size, 4, cps.ram_left_bytes) >= 4 * MAX_PER_SLOT * size
    assert cps.stats.saves > MAX_PER_SLOT and len(held) == MAX_PER_SLOT == 16
    assert cps.stats.evictions == cps.stats.saves - MAX_PER_SLOT and cps.stats.held_bytes <= cps.max_bytes
    # the same formula at the 27B's 48 delta-net layers (fit's checkpoint_budget is the plan's side of it)
    one = size // 3 * 48
    assert one == pytest.approx(149.6 * MiB, rel=0.01) and CHECKPOINTS_MIN_BYTES // one == 6
    assert checkpoint_max_bytes(one, 4, 40 * GiB) == 64 * one
    assert checkpoint_budget(4 * one, 4, 40 * GiB)[1] == 64 and checkpoint_budget(4 * one, 4, 0)[1] == 6
