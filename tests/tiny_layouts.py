"""Tiny random-weight GGUFs in the REAL layouts of the 2026 hybrid and Gemma-4 archs, for tests.

No real weights of these models can be had here, so the tests write them: every tensor that the vendored
llama.cpp (llama-cpp-python 0.3.36) creates for the arch in ``src/models/<arch>.cpp`` ``load_arch_tensors``
(and no other: llama.cpp refuses a file with tensors it did not create), and the header keys that
``load_arch_hparams`` there and ``llama_model_base::load_hparams`` (src/llama-model.cpp) read. Widths are small
(n_embd 64-128, 4-8 layers); the vocabulary and tokenizer are SmolLM2-135M's, copied from its GGUF (BPE,
ChatML template), so real text tokenizes. The weights are seeded noise: the text they make
means nothing; token-level identity between two runs and llama.cpp's allocation log are what tests use.
The default tokenizer keeps SmolLM2's first 8192 tokens (special tokens, bytes, the first ~7900 merges) and
its chat template: English text still tokenizes to real words, and each file writes in a fraction of a second.

Every writer is ``write_<arch>(path: Path, **kw) -> Path``; the keywords override the module's defaults
(e.g. ``n_layer=8``, ``n_ctx_train=4096``) and unknown keywords raise TypeError. ``tokenizer_from``: a GGUF to
copy the tokenizer from (default SmolLM2's), or False for a header-only file (256 embedding rows, no
tokenizer: fast to write, for tests that read the header alone; llama.cpp will not load it). ``cached_layout`` writes
each (arch, keywords) once per test session under ``tmp_path_factory``.

The file machinery (``GgufWriter``, the tokenizer copy) is ``tests/tiny_gguf.py``. Numpy shapes are ggml's ``ne``
reversed: a tensor llama.cpp creates as ``{n_embd, n_vocab}`` is written as
an array of shape ``(n_vocab, n_embd)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tiny_gguf import GgufWriter, options, smollm_gguf, write_common

__all__ = ["WRITERS", "cached_layout", "smollm_gguf", "write_gemma4", "write_granitehybrid", "write_lfm2",
           "write_nemotron_h", "write_qwen35", "write_qwen35moe"]

# --------------------------------------------------------------------------------------------- qwen35 / moe
QWEN35 = dict(n_embd=128, n_layer=8, n_ff=256, n_head=4, n_head_kv=2, head_dim=32, n_rot=16,
              full_attention_interval=4, ssm_d_conv=4, ssm_d_state=32, ssm_n_group=2, ssm_dt_rank=4,
              n_ctx_train=4096, seed=0, tokenizer_from=None)
QWEN35MOE = dict(QWEN35, n_expert=8, n_expert_used=2, n_ff_exp=64, n_ff_shexp=128)


def _qwen35(path: Path, arch: str, o: dict) -> Path:
    """src/models/qwen35.cpp and qwen35moe.cpp: gated delta-net layers, every ``full_attention_interval``-th
    layer (1-based) full attention with a gated query (Q projects to 2 × n_head × head_dim), post-attention
    norm, Q/K norms; R = (d_conv - 1) × (d_inner + 2 × n_group × d_state), S = d_state × d_inner."""
    w = GgufWriter(path, arch, o["seed"], o["tokenizer_from"])
    d, hd = o["n_embd"], o["head_dim"]
    head_k, n_k, n_v = o["ssm_d_state"], o["ssm_n_group"], o["ssm_dt_rank"]
    key_dim, value_dim = head_k * n_k, head_k * n_v
    conv_dim = 2 * key_dim + value_dim
    write_common(w, o)
    w.u32("feed_forward_length", o["n_ff"])
    w.u32("attention.head_count", o["n_head"])
    w.u32("attention.head_count_kv", o["n_head_kv"])
    w.u32("attention.key_length", hd)
    w.u32("attention.value_length", hd)
    w.u32("rope.dimension_count", o["n_rot"])
    quarter = o["n_rot"] // 2
    w.arr("rope.dimension_sections", [quarter - 2 * (quarter // 3), quarter // 3, quarter // 3, 0])
    w.u32("ssm.conv_kernel", o["ssm_d_conv"])
    w.u32("ssm.inner_size", value_dim)
    w.u32("ssm.state_size", head_k)
    w.u32("ssm.time_step_rank", n_v)
    w.u32("ssm.group_count", n_k)
    w.u32("full_attention_interval", o["full_attention_interval"])
    moe = arch == "qwen35moe"
    if moe:
        w.u32("expert_count", o["n_expert"])
        w.u32("expert_used_count", o["n_expert_used"])
        w.u32("expert_feed_forward_length", o["n_ff_exp"])
        w.u32("expert_shared_feed_forward_length", o["n_ff_shexp"])
    w.embeddings(d)
    w.ones("output_norm.weight", d)
    for i in range(o["n_layer"]):
        b = f"blk.{i}"
        w.ones(f"{b}.attn_norm.weight", d)
        w.ones(f"{b}.post_attention_norm.weight", d)
        if (i + 1) % o["full_attention_interval"] == 0:
            w.rand(f"{b}.attn_q.weight", d, 2 * hd * o["n_head"])
            w.rand(f"{b}.attn_k.weight", d, hd * o["n_head_kv"])
            w.rand(f"{b}.attn_v.weight", d, hd * o["n_head_kv"])
            w.rand(f"{b}.attn_output.weight", hd * o["n_head"], d)
            w.ones(f"{b}.attn_q_norm.weight", hd)
            w.ones(f"{b}.attn_k_norm.weight", hd)
        else:
            w.rand(f"{b}.attn_qkv.weight", d, conv_dim)
            w.rand(f"{b}.attn_gate.weight", d, value_dim)
            w.rand(f"{b}.ssm_conv1d.weight", o["ssm_d_conv"], conv_dim, scale=0.3)
            w.const(f"{b}.ssm_dt.bias", 0.5, n_v)
            w.const(f"{b}.ssm_a", -1.0, n_v)
            w.rand(f"{b}.ssm_beta.weight", d, n_v)
            w.rand(f"{b}.ssm_alpha.weight", d, n_v)
            w.ones(f"{b}.ssm_norm.weight", head_k)
            w.rand(f"{b}.ssm_out.weight", value_dim, d)
        if moe:
            n_e, ff_e, ff_s = o["n_expert"], o["n_ff_exp"], o["n_ff_shexp"]
            w.rand(f"{b}.ffn_gate_inp.weight", d, n_e)
            w.rand(f"{b}.ffn_gate_exps.weight", d, ff_e, n_e)
            w.rand(f"{b}.ffn_down_exps.weight", ff_e, d, n_e)
            w.rand(f"{b}.ffn_up_exps.weight", d, ff_e, n_e)
            w.rand(f"{b}.ffn_gate_inp_shexp.weight", d)
            w.rand(f"{b}.ffn_gate_shexp.weight", d, ff_s)
            w.rand(f"{b}.ffn_up_shexp.weight", d, ff_s)
            w.rand(f"{b}.ffn_down_shexp.weight", ff_s, d)
        else:
            w.rand(f"{b}.ffn_gate.weight", d, o["n_ff"])
            w.rand(f"{b}.ffn_up.weight", d, o["n_ff"])
            w.rand(f"{b}.ffn_down.weight", o["n_ff"], d)
    return w.close()


def write_qwen35(path: Path, **kw) -> Path:
    """A tiny Qwen3.5 dense hybrid (arch ``qwen35``): 8 layers, attention at layers 3 and 7 (interval 4), the
    rest gated delta-net. Keywords: see ``QWEN35``."""
    return _qwen35(Path(path), "qwen35", options(QWEN35, kw))


def write_qwen35moe(path: Path, **kw) -> Path:
    """A tiny Qwen3.5/3.6 MoE hybrid (arch ``qwen35moe``): ``write_qwen35``'s layout with routed experts plus a
    gated shared expert in every layer. Keywords: see ``QWEN35MOE``."""
    return _qwen35(Path(path), "qwen35moe", options(QWEN35MOE, kw))


# --------------------------------------------------------------------------------------------------- lfm2
LFM2 = dict(n_embd=128, n_layer=6, n_ff=256, n_head=4, n_head_kv=2, attn_layers=(2, 5), l_cache=3,
            n_ctx_train=4096, seed=0, tokenizer_from=None)


def write_lfm2(path: Path, **kw) -> Path:
    """A tiny LFM2 (arch ``lfm2``, src/models/lfm2.cpp): gated short-conv layers and a few attention layers,
    told apart by the per-layer ``attention.head_count_kv`` array (0 = conv layer); conv state
    R = n_embd × (l_cache - 1) per conv layer (llama-hparams.cpp n_embd_r), no S. The final norm is named
    ``token_embd_norm`` as in LFM2's real files. Keywords: see ``LFM2`` (``attn_layers``: 0-based indices)."""
    o = options(LFM2, kw)
    path = Path(path)
    w = GgufWriter(path, "lfm2", o["seed"], o["tokenizer_from"])
    d, n_layer = o["n_embd"], o["n_layer"]
    attn = set(o["attn_layers"])
    write_common(w, o)
    w.u32("feed_forward_length", o["n_ff"])
    w.u32("attention.head_count", o["n_head"])
    w.arr("attention.head_count_kv", [o["n_head_kv"] if i in attn else 0 for i in range(n_layer)])
    w.u32("shortconv.l_cache", o["l_cache"])
    w.embeddings(d)
    w.ones("token_embd_norm.weight", d)
    hd = d // o["n_head"]
    for i in range(n_layer):
        b = f"blk.{i}"
        w.ones(f"{b}.ffn_norm.weight", d)
        w.rand(f"{b}.ffn_gate.weight", d, o["n_ff"])
        w.rand(f"{b}.ffn_up.weight", d, o["n_ff"])
        w.rand(f"{b}.ffn_down.weight", o["n_ff"], d)
        w.ones(f"{b}.attn_norm.weight", d)
        if i in attn:
            w.ones(f"{b}.attn_q_norm.weight", hd)
            w.ones(f"{b}.attn_k_norm.weight", hd)
            w.rand(f"{b}.attn_q.weight", d, d)
            w.rand(f"{b}.attn_k.weight", d, hd * o["n_head_kv"])
            w.rand(f"{b}.attn_v.weight", d, hd * o["n_head_kv"])
            w.rand(f"{b}.attn_output.weight", d, d)
        else:
            w.rand(f"{b}.shortconv.conv.weight", o["l_cache"], d, scale=0.3)
            w.rand(f"{b}.shortconv.in_proj.weight", d, 3 * d)
            w.rand(f"{b}.shortconv.out_proj.weight", d, d)
    return w.close()


# ---------------------------------------------------------------------------- mamba-2 hybrids (nemotron_h, granite)
def _mamba2(w: GgufWriter, b: str, o: dict) -> None:
    """One Mamba-2 mixer as nemotron-h.cpp / granite-hybrid.cpp create it (d_in_proj = 2 d_inner +
    2 n_group d_state + n_head)."""
    d, di, ds, ng, nh, dc = o["n_embd"], o["ssm_d_inner"], o["ssm_d_state"], o["ssm_n_group"], o["ssm_dt_rank"], \
        o["ssm_d_conv"]
    w.rand(f"{b}.ssm_in.weight", d, 2 * di + 2 * ng * ds + nh)
    w.rand(f"{b}.ssm_conv1d.weight", dc, di + 2 * ng * ds, scale=0.3)
    w.rand(f"{b}.ssm_conv1d.bias", di + 2 * ng * ds)
    w.const(f"{b}.ssm_dt.bias", 0.5, nh)
    w.const(f"{b}.ssm_a", -1.0, 1, nh)
    w.ones(f"{b}.ssm_d", 1, nh)
    w.ones(f"{b}.ssm_norm.weight", di // ng, ng)
    w.rand(f"{b}.ssm_out.weight", di, d)


def _ssm_keys(w: GgufWriter, o: dict) -> None:
    w.u32("ssm.conv_kernel", o["ssm_d_conv"])
    w.u32("ssm.inner_size", o["ssm_d_inner"])
    w.u32("ssm.state_size", o["ssm_d_state"])
    w.u32("ssm.time_step_rank", o["ssm_dt_rank"])
    w.u32("ssm.group_count", o["ssm_n_group"])


def _attn(w: GgufWriter, b: str, d: int, n_head: int, n_head_kv: int, hd: int) -> None:
    w.rand(f"{b}.attn_q.weight", d, hd * n_head)
    w.rand(f"{b}.attn_k.weight", d, hd * n_head_kv)
    w.rand(f"{b}.attn_v.weight", d, hd * n_head_kv)
    w.rand(f"{b}.attn_output.weight", hd * n_head, d)


NEMOTRON_H = dict(n_embd=128, pattern="M-M*M-M*", n_ff=256, n_head=4, n_head_kv=2, ssm_d_conv=4, ssm_d_inner=256,
                  ssm_d_state=16, ssm_n_group=2, ssm_dt_rank=8, n_ctx_train=4096, seed=0, tokenizer_from=None)


def write_nemotron_h(path: Path, **kw) -> Path:
    """A tiny Nemotron-H (arch ``nemotron_h``, src/models/nemotron-h.cpp): one mixer per block, ``pattern``
    as in NVIDIA's ``hybrid_override_pattern`` (M = Mamba-2, * = attention, - = squared-ReLU MLP). The kind
    is told by the per-layer arrays: ``head_count_kv`` > 0 → attention, ``feed_forward_length`` > 0 → MLP,
    both 0 → Mamba-2 (the only layers with R/S state). Keywords: see ``NEMOTRON_H``."""
    o = options(NEMOTRON_H, kw)
    path = Path(path)
    pat = o["pattern"]
    o["n_layer"] = len(pat)
    w = GgufWriter(path, "nemotron_h", o["seed"], o["tokenizer_from"])
    d, hd = o["n_embd"], o["n_embd"] // o["n_head"]
    write_common(w, o)
    w.f32("attention.layer_norm_epsilon", 1e-5)
    w.u32("attention.head_count", o["n_head"])
    w.arr("attention.head_count_kv", [o["n_head_kv"] if c == "*" else 0 for c in pat])
    w.arr("feed_forward_length", [o["n_ff"] if c == "-" else 0 for c in pat])
    w.u32("attention.key_length", hd)
    w.u32("attention.value_length", hd)
    _ssm_keys(w, o)
    w.embeddings(d)
    w.ones("output_norm.weight", d)
    for i, c in enumerate(pat):
        b = f"blk.{i}"
        w.ones(f"{b}.attn_norm.weight", d)
        if c == "M":
            _mamba2(w, b, o)
        elif c == "*":
            _attn(w, b, d, o["n_head"], o["n_head_kv"], hd)
        else:
            w.rand(f"{b}.ffn_up.weight", d, o["n_ff"])
            w.rand(f"{b}.ffn_down.weight", o["n_ff"], d)
    return w.close()


GRANITE_HYBRID = dict(n_embd=128, n_layer=8, attn_layers=(3, 7), n_ff=256, n_head=4, n_head_kv=2, ssm_d_conv=4,
                      ssm_d_state=16, ssm_n_group=1, ssm_dt_rank=8, n_expert=0, n_expert_used=0, n_ff_shexp=0,
                      n_ctx_train=4096, seed=0, tokenizer_from=None)


def write_granitehybrid(path: Path, **kw) -> Path:
    """A tiny Granite 4.0-H (arch ``granitehybrid``, src/models/granite-hybrid.cpp): Mamba-2 layers
    (``head_count_kv`` 0, d_inner = 2 n_embd as llama.cpp asserts) and a few attention layers, each with a
    SwiGLU FFN (``n_expert`` > 0: routed experts, plus a shared expert when ``n_ff_shexp`` > 0, as H-Tiny and
    H-Small). Keywords: see ``GRANITE_HYBRID``."""
    o = options(GRANITE_HYBRID, kw)
    o["ssm_d_inner"] = 2 * o["n_embd"]
    path = Path(path)
    w = GgufWriter(path, "granitehybrid", o["seed"], o["tokenizer_from"])
    d, hd, n_layer = o["n_embd"], o["n_embd"] // o["n_head"], o["n_layer"]
    attn = set(o["attn_layers"])
    write_common(w, o)
    w.u32("feed_forward_length", o["n_ff"])
    w.u32("attention.head_count", o["n_head"])
    w.arr("attention.head_count_kv", [o["n_head_kv"] if i in attn else 0 for i in range(n_layer)])
    w.f32("logit_scale", 4.0)
    w.f32("residual_scale", 0.22)
    w.f32("embedding_scale", 12.0)
    w.f32("attention.scale", 1.0 / hd)
    w.boolean("rope.scaling.finetuned", False)  # Granite 4.0-H uses no RoPE (NoPE): llama.cpp reads this switch
    _ssm_keys(w, o)
    moe = o["n_expert"] > 0
    if moe:
        w.u32("expert_count", o["n_expert"])
        w.u32("expert_used_count", o["n_expert_used"])
        if o["n_ff_shexp"]:
            w.u32("expert_shared_feed_forward_length", o["n_ff_shexp"])
    w.embeddings(d)
    w.ones("output_norm.weight", d)
    ff = o["n_ff"]
    for i in range(n_layer):
        b = f"blk.{i}"
        w.ones(f"{b}.attn_norm.weight", d)
        if i in attn:
            _attn(w, b, d, o["n_head"], o["n_head_kv"], hd)
        else:
            _mamba2(w, b, o)
        w.ones(f"{b}.ffn_norm.weight", d)
        if moe:
            n_e = o["n_expert"]
            w.rand(f"{b}.ffn_gate_inp.weight", d, n_e)
            w.rand(f"{b}.ffn_gate_exps.weight", d, ff, n_e)
            w.rand(f"{b}.ffn_down_exps.weight", ff, d, n_e)
            w.rand(f"{b}.ffn_up_exps.weight", d, ff, n_e)
            if o["n_ff_shexp"]:
                w.rand(f"{b}.ffn_gate_shexp.weight", d, o["n_ff_shexp"])
                w.rand(f"{b}.ffn_up_shexp.weight", d, o["n_ff_shexp"])
                w.rand(f"{b}.ffn_down_shexp.weight", o["n_ff_shexp"], d)
        else:
            w.rand(f"{b}.ffn_gate.weight", d, ff)
            w.rand(f"{b}.ffn_up.weight", d, ff)
            w.rand(f"{b}.ffn_down.weight", ff, d)
    return w.close()


# ------------------------------------------------------------------------------------------------- gemma4
GEMMA4 = dict(n_embd=128, n_layer=8, swa_period=4, shared_kv_layers=4, n_ff=256, n_head=4, n_head_kv_swa=4,
              n_head_kv_full=1, head_dim=64, head_dim_swa=32, sliding_window=128, n_embd_per_layer=16,
              n_expert=0, n_expert_used=0, n_ff_exp=64, n_ctx_train=4096, seed=0, tokenizer_from=None)


def write_gemma4(path: Path, **kw) -> Path:
    """A tiny Gemma 4 (arch ``gemma4``, src/models/gemma4.cpp): ``swa_period - 1`` sliding-window layers then
    one global layer (an explicit ``attention.sliding_window_pattern`` bool array), the sliding layers with
    their own head size (``key_length_swa``/``value_length_swa``) and KV-head count (per-layer
    ``head_count_kv``), the last ``shared_kv_layers`` layers reusing the KV of the last non-shared layer of
    their kind (no KV of their own, no K/V projections), per-layer embeddings (``n_embd_per_layer`` > 0, as
    E2B/E4B; 0 as 26B/31B), Q/K norms, one shared ``rope_freqs``. ``n_expert`` > 0 adds the 26B-A4B MoE
    block beside the dense FFN. llama.cpp needs the last non-shared layer global and the one before it
    sliding. Keywords: see ``GEMMA4``."""
    o = options(GEMMA4, kw)
    path = Path(path)
    w = GgufWriter(path, "gemma4", o["seed"], o["tokenizer_from"])
    d, n_layer, per = o["n_embd"], o["n_layer"], o["n_embd_per_layer"]
    swa = [(i + 1) % o["swa_period"] != 0 for i in range(n_layer)]
    n_kv_layers = n_layer - o["shared_kv_layers"]
    kv_heads = [o["n_head_kv_swa"] if s else o["n_head_kv_full"] for s in swa]
    write_common(w, o)
    w.u32("feed_forward_length", o["n_ff"])
    w.u32("attention.head_count", o["n_head"])
    w.arr("attention.head_count_kv", kv_heads)
    w.u32("attention.key_length", o["head_dim"])
    w.u32("attention.value_length", o["head_dim"])
    w.u32("attention.key_length_swa", o["head_dim_swa"])
    w.u32("attention.value_length_swa", o["head_dim_swa"])
    w.u32("rope.dimension_count", o["head_dim"])
    w.u32("rope.dimension_count_swa", o["head_dim_swa"])
    w.f32("rope.freq_base_swa", 10000.0)
    w.u32("attention.sliding_window", o["sliding_window"])
    w.arr("attention.sliding_window_pattern", swa, w.gguf.GGUFValueType.BOOL)
    w.u32("attention.shared_kv_layers", o["shared_kv_layers"])
    w.u32("embedding_length_per_layer_input", per)
    w.f32("final_logit_softcapping", 30.0)
    moe = o["n_expert"] > 0
    if moe:
        w.u32("expert_count", o["n_expert"])
        w.u32("expert_used_count", o["n_expert_used"])
        w.u32("expert_feed_forward_length", o["n_ff_exp"])
    w.embeddings(d)
    if per:
        emb = w.rng.standard_normal((w.n_vocab, per * n_layer)) * 0.5
        w.w.add_tensor("per_layer_token_embd.weight", emb.astype(np.float16))
        w.rand("per_layer_model_proj.weight", d, per * n_layer)
        w.ones("per_layer_proj_norm.weight", per)
    w.ones("output_norm.weight", d)
    w.ones("rope_freqs.weight", o["head_dim"] // 2)
    for i in range(n_layer):
        b = f"blk.{i}"
        hd = o["head_dim_swa"] if swa[i] else o["head_dim"]
        w.ones(f"{b}.attn_norm.weight", d)
        w.rand(f"{b}.attn_q.weight", d, hd * o["n_head"])
        if i < n_kv_layers:
            w.rand(f"{b}.attn_k.weight", d, hd * kv_heads[i])
            w.rand(f"{b}.attn_v.weight", d, hd * kv_heads[i])
            w.ones(f"{b}.attn_k_norm.weight", hd)
        w.rand(f"{b}.attn_output.weight", hd * o["n_head"], d)
        w.ones(f"{b}.attn_q_norm.weight", hd)
        w.ones(f"{b}.post_attention_norm.weight", d)
        w.const(f"{b}.layer_output_scale.weight", 1.0, 1)
        w.ones(f"{b}.ffn_norm.weight", d)
        w.rand(f"{b}.ffn_gate.weight", d, o["n_ff"])
        w.rand(f"{b}.ffn_up.weight", d, o["n_ff"])
        w.rand(f"{b}.ffn_down.weight", o["n_ff"], d)
        w.ones(f"{b}.post_ffw_norm.weight", d)
        if moe:
            n_e, ff_e = o["n_expert"], o["n_ff_exp"]
            w.rand(f"{b}.ffn_gate_inp.weight", d, n_e)
            w.ones(f"{b}.ffn_gate_inp.scale", d)
            w.ones(f"{b}.pre_ffw_norm_2.weight", d)
            w.ones(f"{b}.post_ffw_norm_1.weight", d)
            w.ones(f"{b}.post_ffw_norm_2.weight", d)
            w.rand(f"{b}.ffn_gate_exps.weight", d, ff_e, n_e)
            w.rand(f"{b}.ffn_up_exps.weight", d, ff_e, n_e)
            w.rand(f"{b}.ffn_down_exps.weight", ff_e, d, n_e)
        if per:
            w.rand(f"{b}.inp_gate.weight", d, per)
            w.rand(f"{b}.proj.weight", per, d)
            w.ones(f"{b}.post_norm.weight", d)
    return w.close()


# ------------------------------------------------------------------------------------------------- cache
WRITERS = {"qwen35": write_qwen35, "qwen35moe": write_qwen35moe, "lfm2": write_lfm2, "nemotron_h": write_nemotron_h,
           "granitehybrid": write_granitehybrid, "gemma4": write_gemma4}
_CACHE: dict[tuple, Path] = {}


def cached_layout(tmp_path_factory, arch: str, **kw) -> Path:
    """The tiny ``arch`` GGUF with keywords ``kw``, written once per test session under ``tmp_path_factory``."""
    key = (arch, tuple(sorted(kw.items())))
    if key not in _CACHE:
        name = arch + "".join(f"-{k}{v}" for k, v in sorted(kw.items())).replace(" ", "")
        out = tmp_path_factory.mktemp("tiny_layouts") / f"{name}.gguf"
        _CACHE[key] = WRITERS[arch](out, **kw)
    return _CACHE[key]
