"""The IBM Granite 4.0 hybrid entries of models.toml (arch ``granitehybrid``: Mamba-2 layers, 4 attention layers,
a SwiGLU FFN on every layer, routed + shared experts on H-Tiny and H-Small): the catalog layout is the one a real
granitehybrid header gives, the layouts count the published parameter totals, and the KV cache and recurrent
state follow from the cited dimensions as llama.cpp sizes them (``llama_hparams::n_embd_r``/``n_embd_s``:
R = (d_conv - 1) × (d_inner + 2 × n_group × d_state), S = d_state × d_inner, F32, per recurrent layer and
sequence; KV only on the layers whose ``head_count_kv`` is non-zero)."""

from __future__ import annotations

import pytest
from tiny_layouts import write_granitehybrid

from localrun.model.catalog import CatalogEntry, get_entry
from localrun.model.gguf_info import read_gguf
from localrun.model.synthetic import spec_from_entry
from localrun.offload.memory import MiB, kv_cache

GiB = 1 << 30
GRANITE = ["granite-4.0-h-micro", "granite-4.0-h-tiny", "granite-4.0-h-small", "granite-4.0-h-1b", "granite-4.0-h-350m"]


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe+shared"])
def test_catalog_layout_is_the_one_a_granitehybrid_header_gives(tmp_path, moe):
    """A tiny granitehybrid GGUF (tests/tiny_layouts.py, the tensors granite-hybrid.cpp creates) and a catalog
    entry of the same dimensions: the same tensor names and shapes, the same attention and recurrent layers, the
    same KV and state bytes — so an entry plans as its GGUF would."""
    kw = dict(n_expert=8, n_expert_used=2, n_ff_shexp=96) if moe else {}
    real = read_gguf(write_granitehybrid(tmp_path / "g.gguf", tokenizer_from=False, **kw))
    n_vocab = next(t.shape[1] for t in real.tensors if t.name == "token_embd.weight")
    e = CatalogEntry(name="granite-tiny-layout", family="granite-4.0", arch="granitehybrid", params_total=1,
                     params_active=1, n_layer=8, n_embd=128, n_ff=256, n_ff_exp=256 if moe else 0,
                     n_ff_shexp=kw.get("n_ff_shexp", 0), n_expert=kw.get("n_expert", 0),
                     n_expert_used=kw.get("n_expert_used", 0), n_head=4, n_head_kv=2, head_dim=32,
                     vocab_size=n_vocab, n_ctx_train=4096, layer_pattern="RRRARRRA", ssm_conv_kernel=4,
                     ssm_inner_size=256, ssm_state_size=16, ssm_group_count=1, ssm_time_step_rank=8,
                     tie_embeddings=True)
    synth = spec_from_entry(e, "F16")
    assert sorted((t.name, t.shape) for t in synth.tensors) == sorted((t.name, t.shape) for t in real.tensors)
    assert synth.layers.kv_layers == real.layers.kv_layers == [3, 7]
    assert synth.layers.recurrent_layers == real.layers.recurrent_layers
    for n_ctx, n_seq in ((4096, 1), (16384, 4)):
        a = kv_cache(synth, n_ctx, n_parallel=n_seq, flash_attn=True)
        b = kv_cache(real, n_ctx, n_parallel=n_seq, flash_attn=True)
        assert (a.attn_bytes, a.recurrent_bytes) == (b.attn_bytes, b.recurrent_bytes) and a.recurrent_bytes > 0


@pytest.mark.parametrize("name", GRANITE)
def test_layouts_count_the_published_parameters(name):
    """params_total is the layout's own count, and that count is the published one: the HF safetensors totals of
    H-Tiny (6939037248) and H-1B (1461538368) exactly (as gkarfakis19/Rapid-LLM records them from the configs), the
    cards' rounded 3B (H-Micro), 32B total / 9B active (H-Small), 7B / 1B (H-Tiny) and 340M (H-350M)."""
    e = get_entry(name)
    spec = spec_from_entry(e, "Q8_0")
    assert sum(t.n_elements for t in spec.tensors) == e.params_total
    assert e.tie_embeddings and not any(t.name == "output.weight" for t in spec.tensors)
    published = {"granite-4.0-h-tiny": (6939037248, 0), "granite-4.0-h-1b": (1461538368, 0),
                 "granite-4.0-h-micro": (3e9, 0.1), "granite-4.0-h-small": (32e9, 0.02),
                 "granite-4.0-h-350m": (340e6, 0.01)}[name]
    assert e.params_total == pytest.approx(published[0], rel=published[1])
    if name == "granite-4.0-h-small":
        assert e.params_active == pytest.approx(9e9, rel=0.05)
    if name == "granite-4.0-h-tiny":  # the card's "1B active" is rounded: 6 + 1 shared experts and the 154M tied
        assert 1e9 < e.params_active < 1.5e9  # embedding count 1.47B


@pytest.mark.parametrize("name", GRANITE)
def test_four_attention_layers_hold_kv_the_rest_hold_mamba2_state(name):
    """4 layers of 40 (32 for H-350M) hold KV, the others a fixed Mamba-2 state; the state per layer is
    (d_conv - 1) × (d_inner + 2 × n_group × d_state) + d_state × d_inner F32 values, d_inner = 2 × n_embd."""
    e = get_entry(name)
    spec = spec_from_entry(e, "Q4_K_M")
    n_rec = e.n_layer - 4
    assert len(spec.layers.kv_layers) == 4 and len(spec.layers.recurrent_layers) == n_rec
    assert e.ssm_inner_size == 2 * e.n_embd  # mamba_expand 2, as llama.cpp's granitehybrid loader asserts
    kv = kv_cache(spec, 32768, n_parallel=2, flash_attn=True)
    assert kv.attn_bytes == 2 * 32768 * 4 * e.n_head_kv * e.head_dim * 2 * 2
    rs = kv.parts[-1]
    di, ds, ng = e.ssm_inner_size, e.ssm_state_size, e.ssm_group_count
    assert (rs.n_layers, rs.k_bytes, rs.v_bytes) == (n_rec, 2 * n_rec * 3 * (di + 2 * ng * ds) * 4,
                                                     2 * n_rec * ds * di * 4)


def test_granite_h_tiny_at_32k_one_sequence():
    """H-Tiny at 32768 tokens, one sequence, f16: KV 32768 × 4 layers × 4 KV heads × 128 × (K + V) × 2 bytes =
    256 MiB; state 36 × (3 × (3072 + 2 × 128) + 128 × 3072) × 4 bytes = 1.37 MiB (R) + 54 MiB (S)."""
    spec = spec_from_entry(get_entry("granite-4.0-h-tiny"), "Q4_K_M")
    kv = kv_cache(spec, 32768, flash_attn=True)
    assert kv.attn_bytes == 256 * MiB
    rs = kv.parts[-1]
    assert (rs.k_bytes, rs.v_bytes) == (36 * 3 * 3328 * 4, 54 * MiB)
    assert kv.recurrent_bytes == 36 * 3 * 3328 * 4 + 54 * MiB
    assert kv_cache(spec, 131072, flash_attn=True).attn_bytes == GiB
