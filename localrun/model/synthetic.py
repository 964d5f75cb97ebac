"""A model with no file: catalog entry (or another quantization of a GGUF) → a synthetic ``ModelSpec``.

The tensor table is rebuilt from the architecture (llama.cpp's tensor shapes for llama/qwen2/gemma-style
blocks, MoE experts, MLA projections) and each tensor gets the type llama.cpp's quantizer would give it
(src/llama-quant.cpp ``llama_tensor_get_type``): e.g. Q4_K_M keeps ``output.weight`` in Q6_K and bumps
``attn_v``/``ffn_down`` to Q6_K on the ``use_more_bits`` layers; rows whose length is not a multiple of
256 fall back to a 32-block type (Q4_K→Q5_0, Q6_K→Q8_0). The real DeepSeek-7B Q4_K_M header and the
Gemma-3 file are reproduced to within 1% (tests/test_fit_synthetic.py).
"""

from __future__ import annotations

from functools import lru_cache

from localrun.model.spec import FILE_TYPES, GGML_TYPES, ModelSpec, TensorInfo, ggml_type_id

# ftype → (base type, output type, attn_v rule, ffn_down rule). Rules: "more" = Q6_K on use_more_bits
# layers; "q3km" = Q3_K_M's schedule; None = base type.
_MIX: dict[str, tuple[str, str, str | None, str | None]] = {
    "F32": ("F32", "F32", None, None), "F16": ("F16", "F16", None, None), "BF16": ("BF16", "BF16", None, None),
    "Q8_0": ("Q8_0", "Q8_0", None, None), "Q6_K": ("Q6_K", "Q6_K", None, None),
    "Q5_K_M": ("Q5_K", "Q6_K", "more", "more"), "Q5_K_S": ("Q5_K", "Q6_K", None, None),
    "Q5_0": ("Q5_0", "Q6_K", None, None), "Q5_1": ("Q5_1", "Q6_K", None, None),
    "Q4_K_M": ("Q4_K", "Q6_K", "more", "more"), "Q4_K_S": ("Q4_K", "Q6_K", None, "first8"),
    "Q4_0": ("Q4_0", "Q6_K", None, None), "Q4_1": ("Q4_1", "Q6_K", None, None),
    "IQ4_XS": ("IQ4_XS", "Q6_K", None, None), "IQ4_NL": ("IQ4_NL", "Q6_K", None, None),
    "Q3_K_L": ("Q3_K", "Q6_K", "q5", "q5"), "Q3_K_M": ("Q3_K", "Q6_K", "q3km", "q3km"),
    "Q3_K_S": ("Q3_K", "Q6_K", None, None), "Q2_K": ("Q2_K", "Q6_K", "q3", "q3"),
}
# ne0 not a multiple of 256 → llama-quant.cpp's fallback types
_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
             "IQ4_XS": "IQ4_NL"}


def supported_quants() -> list[str]:
    return list(_MIX)


def _use_more_bits(i: int, n: int) -> bool:
    """src/llama-quant.cpp: the first and last eighth of the layers, and every third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, shape: tuple[int, ...], ftype: str, n_layer: int, *, tied: bool = False) -> str:
    """The ggml type llama.cpp's quantizer gives tensor ``name`` for file type ``ftype``."""
    base, out, v_rule, down_rule = _MIX[ftype.upper()]
    if len(shape) < 2 or name.endswith(".bias") or "norm" in name or "ffn_gate_inp" in name:
        return "F32"
    il = int(name.split(".")[1]) if name.startswith("blk.") else -1
    t = base
    if name.startswith("output."):
        t = out
    elif name.startswith("token_embd"):
        t = out if tied else base
    elif ".attn_v." in name or ".attn_kv_b" in name:
        t = {"more": "Q6_K" if _use_more_bits(il, n_layer) else base, "q3km": "Q5_K" if il < 2 else "Q4_K",
             "q5": "Q5_K", "q3": "Q3_K"}.get(v_rule or "", base)
    elif ".ffn_down" in name:
        t = {"more": "Q6_K" if _use_more_bits(il, n_layer) else base,
             "first8": "Q5_K" if il < n_layer // 8 else base,
             "q3km": "Q5_K" if il < n_layer // 16 else ("Q4_K" if _use_more_bits(il, n_layer) else "Q3_K"),
             "q5": "Q5_K", "q3": "Q3_K"}.get(down_rule or "", base)
    elif ".attn_output" in name and ftype.upper() in ("Q3_K_M", "Q3_K_L", "Q2_K"):
        t = "Q4_K" if ftype.upper() != "Q2_K" else "Q3_K"
    block = _block(t)
    if shape[0] % block:
        t = _FALLBACK.get(t, "F16")
        if shape[0] % _block(t):
            t = "F16"
    return t


def _block(type_name: str) -> int:
    for n, b, _ in GGML_TYPES.values():
        if n == type_name:
            return b
    return 1


def _tensor(name: str, shape: tuple[int, ...], type_name: str, offset: int) -> TensorInfo:
    tid = ggml_type_id(type_name)
    _, block, nbytes = GGML_TYPES[tid]
    n = 1
    for d in shape:
        n *= d
    return TensorInfo(name, shape, tid, type_name, offset, n // block * nbytes)


def build_tensors(shapes: list[tuple[str, tuple[int, ...]]], ftype: str, n_layer: int) -> list[TensorInfo]:
    """Assign types and 32-byte-aligned offsets to (name, shape) rows."""
    return list(_build_tensors(tuple(shapes), ftype.upper(), n_layer))


@lru_cache(maxsize=256)
def _build_tensors(shapes: tuple[tuple[str, tuple[int, ...]], ...], ftype: str, n_layer: int) -> tuple[TensorInfo, ...]:
    # cached: `fit` plans each catalog model at several quantizations, and `ls`/`show` plan them again
    tied = not any(n == "output.weight" for n, _ in shapes)
    out, off = [], 0
    for name, shape in shapes:
        t = _tensor(name, shape, tensor_type(name, shape, ftype, n_layer, tied=tied), off)
        out.append(t)
        off += (t.n_bytes + 31) // 32 * 32
    return tuple(out)


def entry_shapes(e) -> list[tuple[str, tuple[int, ...]]]:
    """llama.cpp tensor shapes (GGUF order, ne0 first) for a catalog entry's architecture (the hybrid and
    Gemma-4 layouts: ``localrun.model.synthetic_hybrid``)."""
    from localrun.model.synthetic_hybrid import HYBRID_ARCHS, hybrid_shapes

    if e.arch in HYBRID_ARCHS:
        return hybrid_shapes(e)
    hd_k, hd_v = e.head_dim, e.head_dim_v or e.head_dim
    q, kdim, vdim = e.n_head * hd_k, e.n_head_kv * hd_k, e.n_head_kv * hd_v
    rows: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (e.n_embd, e.vocab_size))]
    for il in range(e.n_layer):
        p = f"blk.{il}."
        rows.append((p + "attn_norm.weight", (e.n_embd,)))
        if e.kv_lora_rank:  # MLA (DeepSeek-V2/V3): latent KV projection + up-projections
            rope = 64
            rows += [(p + "attn_q.weight", (e.n_embd, e.n_head * (hd_k + rope))),
                     (p + "attn_kv_a_mqa.weight", (e.n_embd, e.kv_lora_rank + rope)),
                     (p + "attn_kv_a_norm.weight", (e.kv_lora_rank,)),
                     (p + "attn_kv_b.weight", (e.kv_lora_rank, e.n_head * (hd_k + hd_v)))]
            rows.append((p + "attn_output.weight", (e.n_head * hd_v, e.n_embd)))
        else:
            rows += [(p + "attn_q.weight", (e.n_embd, q)), (p + "attn_k.weight", (e.n_embd, kdim)),
                     (p + "attn_v.weight", (e.n_embd, vdim)), (p + "attn_output.weight", (q, e.n_embd))]
        rows.append((p + "ffn_norm.weight", (e.n_embd,)))
        if e.n_expert:
            ff = e.n_ff_exp or e.n_ff
            rows += [(p + "ffn_gate_inp.weight", (e.n_embd, e.n_expert)),
                     (p + "ffn_gate_exps.weight", (e.n_embd, ff, e.n_expert)),
                     (p + "ffn_up_exps.weight", (e.n_embd, ff, e.n_expert)),
                     (p + "ffn_down_exps.weight", (ff, e.n_embd, e.n_expert))]
        else:
            rows += [(p + "ffn_gate.weight", (e.n_embd, e.n_ff)), (p + "ffn_up.weight", (e.n_embd, e.n_ff)),
                     (p + "ffn_down.weight", (e.n_ff, e.n_embd))]
    rows.append(("output_norm.weight", (e.n_embd,)))
    n = sum(_prod(s) for _, s in rows)
    if n + e.n_embd * e.vocab_size <= e.params_total * 1.01 or e.params_total <= 0:
        rows.append(("output.weight", (e.n_embd, e.vocab_size)))  # untied output fits the parameter count
    return rows


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _ftype_id(ftype: str) -> int | None:
    for k, v in FILE_TYPES.items():
        if v == ftype.upper():
            return k
    return None


def spec_from_entry(e, quant: str) -> ModelSpec:
    """A header-only ``ModelSpec`` for catalog entry ``e`` quantized as ``quant`` (e.g. "Q4_K_M").

    Raises KeyError for a quantization this module has no mix for (see ``supported_quants``)."""
    if quant.upper() not in _MIX:
        raise KeyError(quant)
    a = e.arch
    meta = {"general.architecture": a, "general.name": e.name, f"{a}.block_count": e.n_layer,
            f"{a}.context_length": e.n_ctx_train, f"{a}.embedding_length": e.n_embd,
            f"{a}.feed_forward_length": e.n_ff, f"{a}.attention.head_count": e.n_head,
            f"{a}.attention.head_count_kv": e.n_head_kv, f"{a}.attention.key_length": e.head_dim,
            f"{a}.attention.value_length": e.head_dim_v or e.head_dim, f"{a}.vocab_size": e.vocab_size}
    if e.sliding_window:
        meta[f"{a}.attention.sliding_window"] = e.sliding_window
        if e.swa_pattern:
            meta[f"{a}.attention.sliding_window_pattern"] = [
                (il % e.swa_pattern) < (e.swa_pattern - 1) for il in range(e.n_layer)]
    if e.n_expert:
        meta[f"{a}.expert_count"] = e.n_expert
        meta[f"{a}.expert_used_count"] = e.n_expert_used
    if e.kv_lora_rank:  # modern MLA GGUFs: one latent "head" of kv_lora_rank + rope dims, K only
        meta[f"{a}.attention.kv_lora_rank"] = e.kv_lora_rank
        meta[f"{a}.attention.head_count_kv"] = 1
        meta[f"{a}.attention.key_length"] = e.kv_lora_rank + 64
        meta[f"{a}.attention.value_length"] = e.kv_lora_rank
        meta[f"{a}.attention.key_length_mla"] = e.head_dim + 64
        meta[f"{a}.attention.value_length_mla"] = e.head_dim_v or e.head_dim
    from localrun.model.synthetic_hybrid import HYBRID_ARCHS, hybrid_meta

    if a in HYBRID_ARCHS:
        meta.update(hybrid_meta(e))
    fid = _ftype_id(quant)
    if fid is not None:
        meta["general.file_type"] = fid
    tensors = build_tensors(entry_shapes(e), quant, e.n_layer)
    return ModelSpec(path=f"catalog:{e.name}:{quant.upper()}", file_bytes=0, gguf_version=3, arch=a,
                     name=e.name, metadata=meta, tensors=tensors, data_offset=0)


def requantize(spec: ModelSpec, quant: str) -> ModelSpec:
    """The same model as ``spec`` (same tensor shapes and metadata) quantized as ``quant`` instead."""
    if quant.upper() not in _MIX:
        raise KeyError(quant)
    tensors = build_tensors([(t.name, t.shape) for t in spec.tensors], quant, spec.n_layer)
    meta = dict(spec.metadata)
    fid = _ftype_id(quant)
    if fid is not None:
        meta["general.file_type"] = fid
    return ModelSpec(path=f"{spec.path}:{quant.upper()}", file_bytes=0, gguf_version=spec.gguf_version,
                     arch=spec.arch, name=spec.name, metadata=meta, tensors=tensors, data_offset=0,
                     array_lengths=dict(spec.array_lengths))
