"""The 2026 catalog entries (Qwen3.6 dense and MoE, Qwen3.5 4B/9B, Nemotron Nano 9B v2, Gemma 4, LFM2): `fit NAME` plans
them from models.toml alone, their
synthetic layouts agree with the model cards' parameter counts and published file sizes, and the planner's
recurrent-state arithmetic reproduces a public llama.cpp log of a qwen35-family model."""

from __future__ import annotations

import json

import pytest

from localrun.model.catalog import CatalogEntry, get_entry
from localrun.model.synthetic import spec_from_entry
from localrun.offload.memory import MiB, kv_cache

GiB = 1 << 30


KV_LAYERS = {"qwen3.6-27b": 16, "qwen3.6-35b-a3b": 10, "gemma-4-e4b": 42 - 18, "lfm2-1.2b": 6, "lfm2-2.6b": 8,
             "qwen3.5-9b": 8, "qwen3.5-4b": 8, "nemotron-nano-9b-v2": 4,
             "granite-4.0-h-micro": 4, "granite-4.0-h-tiny": 4, "granite-4.0-h-small": 4, "granite-4.0-h-1b": 4,
             "granite-4.0-h-350m": 4}


@pytest.mark.parametrize("name", list(KV_LAYERS))
def test_fit_plans_the_2026_entries_from_the_catalog(name, isolated_home, capsys):
    """`localrun fit NAME --ctx 32768 --json` on a 24 GB GPU: from the catalog, its KV cache counted on the layers
    that hold KV, the recurrent state (hybrids) on a line and a field of its own."""
    from localrun.commands.fit import run_fit

    assert run_fit(name, ctx=32768, preset="nvidia-24gb", json_out=True) in (0, 1)
    d = json.loads(capsys.readouterr().out)
    assert d["source"] == "catalog" and d["n_layers"] == get_entry(name).n_layer
    spec = spec_from_entry(get_entry(name), d["quant"])
    kv = kv_cache(spec, d["n_ctx"], n_parallel=1, kv_type=d["kv_type"], flash_attn=d["flash_attn"])
    assert (d["kv_cache_bytes"], d["recurrent_bytes"]) == (kv.attn_bytes, kv.recurrent_bytes)
    assert len(spec.layers.kv_layers) == KV_LAYERS[name]
    hybrid = not name.startswith("gemma")
    assert (d["recurrent_bytes"] > 0) == hybrid
    assert any(r.startswith("recurrent state") for r in d["reasons"]) == hybrid


def test_qwen36_27b_kv_at_32k_is_a_quarter_of_an_all_layer_count():
    """16 attention layers of 64 hold KV: 32768 × 16 × 4 KV heads × 256 × (K + V) × 2 bytes = 2 GiB (f16), a
    quarter of what counting every layer gave; the state is 48 layers × (R 3 × 10240 + S 128 × 6144) F32."""
    spec = spec_from_entry(get_entry("qwen3.6-27b"), "Q4_K_M")
    kv = kv_cache(spec, 32768, flash_attn=True)
    assert kv.attn_bytes == 32768 * 16 * 4 * 256 * 2 * 2 == 2 * GiB
    assert kv.recurrent_bytes == 48 * (3 * (6144 + 2 * 16 * 128) + 128 * 6144) * 4


def test_public_llamacpp_log_of_a_48_layer_qwen35_family_model():
    """The issue's public llama.cpp log: a qwen35-family model (48 layers, 12 of them attention; 2 KV heads of
    256; delta-net 32 V / 16 QK heads of 128) at 32k × 4 sequences: KV 768 MiB, RS 301.5 MiB = R 13.5 + S 288."""
    e = CatalogEntry(name="qwen35-48", family="qwen3.5", arch="qwen35moe", params_total=1, params_active=1,
                     n_layer=48, n_embd=2048, n_ff=512, n_ff_exp=512, n_ff_shexp=512, n_expert=512, n_expert_used=10,
                     n_head=16, n_head_kv=2, head_dim=256, vocab_size=151936, n_ctx_train=262144,
                     full_attention_interval=4, ssm_conv_kernel=4, ssm_inner_size=4096, ssm_state_size=128,
                     ssm_group_count=16, ssm_time_step_rank=32)
    spec = spec_from_entry(e, "Q4_K_M")
    for unified in (False, True):
        kv = kv_cache(spec, 8192, n_parallel=4, kv_unified=unified, flash_attn=True)
        rs = kv.parts[-1]
        assert kv.attn_bytes == 768 * MiB and len(spec.layers.kv_layers) == 12
        assert (rs.k_bytes, rs.v_bytes) == (13.5 * MiB, 288 * MiB) and rs.n_layers == 36


def test_layouts_agree_with_model_cards():
    """Parameters against the cards (27B; 35B total / 3B active; Gemma 4 E4B ≈ 7.5B with its per-layer
    embeddings), and the synthetic quantization mixes against published file sizes within 5 % (IQ4_XS of
    Qwen3.6-27B, Q6_K of Gemma 4 E4B). Not held: bartowski's Q3_K_M of Qwen3.6-27B is 14 % bigger than
    llama.cpp's plain Q3_K_M mix that localrun models (its newer rules raise the delta-net projections)."""
    q27, q35, g4 = (get_entry(n) for n in ("qwen3.6-27b", "qwen3.6-35b-a3b", "gemma-4-e4b"))
    assert q27.params_total == pytest.approx(27e9, rel=0.01)
    assert q35.params_total == pytest.approx(35e9, rel=0.02) and q35.params_active == pytest.approx(3e9, rel=0.2)
    assert g4.params_total == pytest.approx(7.5e9, rel=0.01)
    for e, quant in ((q27, "IQ4_XS"), (g4, "Q6_K")):
        planned = spec_from_entry(e, quant).tensor_bytes
        assert planned == pytest.approx(e.file_bytes[quant], rel=0.05), (e.name, quant, planned)


@pytest.mark.parametrize("name", ["qwen3.5-9b", "qwen3.5-4b"])
def test_qwen35_small_sizes_kv_and_state_follow_from_the_cited_dims(name):
    """Qwen3.5 9B and 4B (models.toml cites transformers' 9B-style defaults, miles' Megatron scripts and a GGUF dump):
    8 of 32 layers hold KV, 4 KV heads of 256: 32768 × 8 × 4 × 256 × (K + V) × 2 bytes = 1 GiB (f16) a sequence;
    24 delta-net layers of 32 value heads × 128 (d_inner 4096), 16 key heads × 128, conv 4: R = 3 × (4096 + 2 × 16 ×
    128), S = 128 × 4096 F32 a layer and sequence → 201 MiB at 4 sequences, whatever the context."""
    spec = spec_from_entry(get_entry(name), "Q4_K_M")
    assert len(spec.layers.kv_layers) == 8 and len(spec.layers.recurrent_layers) == 24
    kv = kv_cache(spec, 32768, n_parallel=4, flash_attn=True)
    assert kv.attn_bytes == 4 * 32768 * 8 * 4 * 256 * 2 * 2 == 4 * GiB
    rs = kv.parts[-1]
    assert (rs.k_bytes, rs.v_bytes) == (4 * 24 * 3 * (4096 + 2 * 16 * 128) * 4, 4 * 24 * 128 * 4096 * 4)
    assert kv.recurrent_bytes == (9 + 192) * MiB
    assert kv_cache(spec, 4096, n_parallel=4, flash_attn=True).recurrent_bytes == kv.recurrent_bytes


def test_nemotron_nano_9b_v2_kv_and_state_follow_from_the_cited_dims():
    """NVIDIA's provider pattern: 4 attention layers of 56 hold KV (8 KV heads of 128): 32768 × 4 × 8 × 128 × 2 × 2
    bytes = 512 MiB (f16) a sequence; 27 Mamba-2 layers, d_inner 128 heads × 80 = 10240, 8 groups × d_state 128,
    conv 4: R = 3 × (10240 + 2 × 8 × 128), S = 128 × 10240 F32 a layer and sequence; the 25 MLP layers hold
    neither."""
    e = get_entry("nemotron-nano-9b-v2")
    assert (e.layer_pattern.count("R"), e.layer_pattern.count("A"), e.layer_pattern.count("F")) == (27, 4, 25)
    spec = spec_from_entry(e, "Q4_K_M")
    kv = kv_cache(spec, 32768, n_parallel=4, flash_attn=True)
    assert kv.attn_bytes == 4 * 32768 * 4 * 8 * 128 * 2 * 2 == 2 * GiB
    rs = kv.parts[-1]
    assert rs.n_layers == 27
    assert (rs.k_bytes, rs.v_bytes) == (4 * 27 * 3 * (10240 + 2 * 8 * 128) * 4, 4 * 27 * 128 * 10240 * 4)


def test_small_hybrids_agree_with_published_counts_and_sizes():
    """Parameters: Qwen3.5-9B 8.95B (its GGUF's metadata), Nemotron Nano 9B v2 8.9B (llmrun.dev) — both untied;
    Qwen3.5-4B's tied layout against the Q6_K "3.5e9" and Qwen3.5-9B's against the Q4_K_M "5.6e9" published with
    llama.cpp's default embedding and output types (steampunque's cards), within 5 %."""
    q9, q4, nemo = (get_entry(n) for n in ("qwen3.5-9b", "qwen3.5-4b", "nemotron-nano-9b-v2"))
    assert q9.params_total == pytest.approx(8.95e9, rel=0.005) and not q9.tie_embeddings
    assert nemo.params_total == pytest.approx(8.89e9, rel=0.005) and not nemo.tie_embeddings
    assert q4.tie_embeddings
    for e, quant in ((q9, "Q4_K_M"), (q4, "Q6_K")):
        planned = spec_from_entry(e, quant).tensor_bytes
        assert planned == pytest.approx(e.file_bytes[quant], rel=0.05), (e.name, quant, planned)
