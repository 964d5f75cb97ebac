"""Catalog entry → header keys and tensor shapes for the hybrid and Gemma-4 layouts (no file needed).

The keys are the ones llama.cpp reads for these archs (so ``localrun.model.layers.layer_memory`` treats a
synthetic spec exactly like a real GGUF), the shapes those its ``src/models/<arch>.cpp`` ``load_arch_tensors``
creates (the vendored llama.cpp of llama-cpp-python 0.3.36): ``qwen35``/``qwen35moe`` (gated delta-net +
gated attention, dense or routed + shared expert), ``lfm2`` (short conv), ``nemotron_h`` and ``granitehybrid``
(Mamba-2), ``gemma4`` (sliding layers with their own heads, shared-KV layers, per-layer embeddings).
Shapes in GGUF order (ne0 first).
"""

from __future__ import annotations

HYBRID_ARCHS = frozenset({"qwen35", "qwen35moe", "lfm2", "nemotron_h", "granitehybrid", "gemma4"})


def layer_kinds(e) -> str:
    """One letter per layer: A attention, R recurrent, F FFN only (``layer_pattern``, else every
    ``full_attention_interval``-th layer attention, else all attention)."""
    if e.layer_pattern:
        if len(e.layer_pattern) != e.n_layer:
            raise ValueError(f"{e.name}: layer_pattern has {len(e.layer_pattern)} letters for {e.n_layer} layers")
        return e.layer_pattern
    if e.full_attention_interval:
        return "".join("A" if (i + 1) % e.full_attention_interval == 0 else "R" for i in range(e.n_layer))
    return "A" * e.n_layer


def _swa(e) -> list[bool]:
    p = e.swa_pattern
    return [bool(p) and (il % p) < (p - 1) for il in range(e.n_layer)]


def hybrid_meta(e) -> dict:
    """The arch-specific header keys of entry ``e`` (``{arch}.`` prefixed), as its GGUF would hold them."""
    a, kinds = e.arch, layer_kinds(e)
    m: dict = {}
    if e.ssm_state_size or e.ssm_inner_size:
        m.update({f"{a}.ssm.conv_kernel": e.ssm_conv_kernel, f"{a}.ssm.inner_size": e.ssm_inner_size,
                  f"{a}.ssm.state_size": e.ssm_state_size, f"{a}.ssm.group_count": e.ssm_group_count,
                  f"{a}.ssm.time_step_rank": e.ssm_time_step_rank})
    if a in ("qwen35", "qwen35moe"):
        m[f"{a}.full_attention_interval"] = e.full_attention_interval or 4
    elif a in ("lfm2", "granitehybrid", "nemotron_h"):
        m[f"{a}.attention.head_count_kv"] = [e.n_head_kv if k == "A" else 0 for k in kinds]
    if a == "lfm2":
        m[f"{a}.shortconv.l_cache"] = e.shortconv_l_cache
    if a == "nemotron_h":
        m[f"{a}.feed_forward_length"] = [e.n_ff if k == "F" else 0 for k in kinds]
    if e.n_ff_exp:
        m[f"{a}.expert_feed_forward_length"] = e.n_ff_exp
    if e.n_ff_shexp:
        m[f"{a}.expert_shared_feed_forward_length"] = e.n_ff_shexp
    if a == "gemma4":
        swa = _swa(e)
        m[f"{a}.attention.sliding_window_pattern"] = swa
        m[f"{a}.attention.head_count_kv"] = [(e.n_head_kv_swa or e.n_head_kv) if s else e.n_head_kv for s in swa]
        m[f"{a}.attention.key_length_swa"] = m[f"{a}.attention.value_length_swa"] = e.head_dim_swa or e.head_dim
        m[f"{a}.attention.shared_kv_layers"] = e.shared_kv_layers
        m[f"{a}.embedding_length_per_layer_input"] = e.n_embd_per_layer
    return m


def hybrid_shapes(e) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of entry ``e``'s layout (``e.arch`` in HYBRID_ARCHS)."""
    d, V = e.n_embd, e.vocab_size
    rows: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (d, V))]
    kinds = layer_kinds(e)
    if e.arch == "gemma4":
        return _gemma4(e, rows)
    for il, kind in enumerate(kinds):
        p = f"blk.{il}."
        rows.append((p + "attn_norm.weight", (d,)))
        if kind == "A":
            rows += _attention(e, p)
        elif kind == "R":
            rows += _recurrent(e, p)
        rows += _ffn(e, p, kind)
    rows.append(("token_embd_norm.weight" if e.arch == "lfm2" else "output_norm.weight", (d,)))
    if not e.tie_embeddings:
        rows.append(("output.weight", (d, V)))
    return rows


def _attention(e, p: str) -> list:
    d, hd, nh, nkv = e.n_embd, e.head_dim, e.n_head, e.n_head_kv
    q = 2 * nh * hd if e.arch in ("qwen35", "qwen35moe") else nh * hd  # Qwen3.5's gated query
    rows = [(p + "attn_q.weight", (d, q)), (p + "attn_k.weight", (d, nkv * hd)),
            (p + "attn_v.weight", (d, nkv * hd)), (p + "attn_output.weight", (nh * hd, d))]
    if e.arch in ("qwen35", "qwen35moe", "lfm2"):
        rows += [(p + "attn_q_norm.weight", (hd,)), (p + "attn_k_norm.weight", (hd,))]
    return rows


def _recurrent(e, p: str) -> list:
    d, dc, di, ds, ng, nh = (e.n_embd, e.ssm_conv_kernel, e.ssm_inner_size, e.ssm_state_size, e.ssm_group_count,
                             e.ssm_time_step_rank)
    if e.arch == "lfm2":  # src/models/lfm2.cpp
        return [(p + "shortconv.conv.weight", (e.shortconv_l_cache, d)),
                (p + "shortconv.in_proj.weight", (d, 3 * d)), (p + "shortconv.out_proj.weight", (d, d))]
    if e.arch in ("qwen35", "qwen35moe"):  # gated delta-net: key_dim = ds × ng, value_dim = di
        conv = 2 * ds * ng + di
        return [(p + "attn_qkv.weight", (d, conv)), (p + "attn_gate.weight", (d, di)),
                (p + "ssm_conv1d.weight", (dc, conv)), (p + "ssm_dt.bias", (nh,)), (p + "ssm_a", (nh,)),
                (p + "ssm_beta.weight", (d, nh)), (p + "ssm_alpha.weight", (d, nh)), (p + "ssm_norm.weight", (ds,)),
                (p + "ssm_out.weight", (di, d))]
    conv = di + 2 * ng * ds  # Mamba-2 (nemotron-h.cpp, granite-hybrid.cpp)
    return [(p + "ssm_in.weight", (d, 2 * di + 2 * ng * ds + nh)), (p + "ssm_conv1d.weight", (dc, conv)),
            (p + "ssm_conv1d.bias", (conv,)), (p + "ssm_dt.bias", (nh,)), (p + "ssm_a", (1, nh)),
            (p + "ssm_d", (1, nh)), (p + "ssm_norm.weight", (di // max(1, ng), ng)), (p + "ssm_out.weight", (di, d))]


def _ffn(e, p: str, kind: str) -> list:
    d = e.n_embd
    if e.arch == "nemotron_h":  # one mixer per block: only "F" layers have an (up/down, squared-ReLU) MLP
        return [(p + "ffn_up.weight", (d, e.n_ff)), (p + "ffn_down.weight", (e.n_ff, d))] if kind == "F" else []
    rows = []
    if e.arch in ("qwen35", "qwen35moe"):
        rows.append((p + "post_attention_norm.weight", (d,)))
    else:
        rows.append((p + "ffn_norm.weight", (d,)))
    if e.n_expert:
        ff, n = e.n_ff_exp or e.n_ff, e.n_expert
        rows += [(p + "ffn_gate_inp.weight", (d, n)), (p + "ffn_gate_exps.weight", (d, ff, n)),
                 (p + "ffn_up_exps.weight", (d, ff, n)), (p + "ffn_down_exps.weight", (ff, d, n))]
        if e.n_ff_shexp:
            s = e.n_ff_shexp
            if e.arch == "qwen35moe":
                rows.append((p + "ffn_gate_inp_shexp.weight", (d,)))
            rows += [(p + "ffn_gate_shexp.weight", (d, s)), (p + "ffn_up_shexp.weight", (d, s)),
                     (p + "ffn_down_shexp.weight", (s, d))]
        return rows
    return rows + [(p + "ffn_gate.weight", (d, e.n_ff)), (p + "ffn_up.weight", (d, e.n_ff)),
                   (p + "ffn_down.weight", (e.n_ff, d))]


def _gemma4(e, rows: list) -> list:
    """src/models/gemma4.cpp: per-layer heads (sliding vs global), no K/V on the shared-KV layers."""
    d, V, per, L = e.n_embd, e.vocab_size, e.n_embd_per_layer, e.n_layer
    swa = _swa(e)
    if per:
        rows += [("per_layer_token_embd.weight", (per * L, V)), ("per_layer_model_proj.weight", (d, per * L)),
                 ("per_layer_proj_norm.weight", (per,))]
    rows += [("output_norm.weight", (d,)), ("rope_freqs.weight", (e.head_dim // 2,))]
    n_kv_layers = L - e.shared_kv_layers
    for il in range(L):
        p = f"blk.{il}."
        hd = (e.head_dim_swa or e.head_dim) if swa[il] else e.head_dim
        nkv = (e.n_head_kv_swa or e.n_head_kv) if swa[il] else e.n_head_kv
        rows += [(p + "attn_norm.weight", (d,)), (p + "attn_q.weight", (d, hd * e.n_head)),
                 (p + "attn_output.weight", (hd * e.n_head, d)), (p + "attn_q_norm.weight", (hd,)),
                 (p + "post_attention_norm.weight", (d,)), (p + "layer_output_scale.weight", (1,)),
                 (p + "ffn_norm.weight", (d,)), (p + "ffn_gate.weight", (d, e.n_ff)),
                 (p + "ffn_up.weight", (d, e.n_ff)), (p + "ffn_down.weight", (e.n_ff, d)),
                 (p + "post_ffw_norm.weight", (d,))]
        if il < n_kv_layers:
            rows += [(p + "attn_k.weight", (d, hd * nkv)), (p + "attn_v.weight", (d, hd * nkv)),
                     (p + "attn_k_norm.weight", (hd,))]
        if e.n_expert:
            ff, n = e.n_ff_exp, e.n_expert
            rows += [(p + "ffn_gate_inp.weight", (d, n)), (p + "ffn_gate_inp.scale", (d,)),
                     (p + "pre_ffw_norm_2.weight", (d,)), (p + "post_ffw_norm_1.weight", (d,)),
                     (p + "post_ffw_norm_2.weight", (d,)), (p + "ffn_gate_exps.weight", (d, ff, n)),
                     (p + "ffn_up_exps.weight", (d, ff, n)), (p + "ffn_down_exps.weight", (ff, d, n))]
        if per:
            rows += [(p + "inp_gate.weight", (d, per)), (p + "proj.weight", (per, d)), (p + "post_norm.weight", (d,))]
    if not e.tie_embeddings:
        rows.append(("output.weight", (d, V)))
    return rows
