"""Bytes per tier for one model + load parameters: weights, KV cache, compute and output buffers.

Pure functions over a ``ModelSpec`` (a real GGUF header, or a synthetic one built from a catalog entry by
``localrun.model.synthetic``). Every formula names the llama.cpp source it mirrors (the vendored copy in
llama-cpp-python 0.3.36); the tests in tests/test_memory*.py compare them with llama.cpp's own log.

Conventions: sizes are bytes, lengths tokens. ``n_gpu_layers`` has llama.cpp's meaning
(src/llama-model.cpp ``load_tensors``: ``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)``): 1 puts
only the output layer on the GPU, ``n_layer + 1`` (or -1) puts everything but the token embeddings there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localrun.model.spec import GGML_TYPES, ModelSpec

MiB = 1 << 20
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")

# Empirical host-memory constants, measured on this machine with llama-cpp-python 0.3.36 (see
# benches/fit_accuracy.py): Python + the llama.cpp shared libraries after import, and what a loaded
# model keeps besides its weights (the vocabulary: token strings, maps, scores ≈ 123 B per token).
RUNTIME_BASE_BYTES = 46 * MiB
MODEL_HOST_BASE_BYTES = 11 * MiB
MODEL_HOST_BYTES_PER_TOKEN = 124
CONTEXT_HOST_BASE_BYTES = 2 * MiB  # context object, graph metadata, thread pool
CUDA_CONTEXT_VRAM_BYTES = 300 * MiB  # CUDA context + cuBLAS workspace per GPU (Ollama's ~ 0.3-0.5 GiB)
CUDA_CONTEXT_HOST_BYTES = 250 * MiB  # libcudart/cublas mapped into the process


def pad(x: int, n: int) -> int:
    """``GGML_PAD(x, n)``: round ``x`` up to a multiple of ``n`` (ggml/include/ggml.h)."""
    return (x + n - 1) // n * n


def type_row_bytes(type_name: str, n: int) -> int:
    """``ggml_row_size(type, n)``: bytes of ``n`` elements of a ggml type (n a multiple of the block).

    Raises ValueError for an unknown type or when ``n`` is not a multiple of its block size."""
    name = type_name.upper()
    for tname, block, nbytes in GGML_TYPES.values():
        if tname == name:
            if n % block:
                raise ValueError(f"{n} elements are not a multiple of {tname}'s block of {block}")
            return n // block * nbytes
    raise ValueError(f"unknown ggml type {type_name!r}")


# ------------------------------------------------------------------------------------------------
# KV cache
# ------------------------------------------------------------------------------------------------

@dataclass
class KvPart:
    """One llama_kv_cache (a model with SWA layers has two: llama_kv_cache_iswa's base and SWA caches)."""

    name: str  # "kv", "kv_base", "kv_swa", "recurrent"
    cells: int  # per stream (sequence)
    n_stream: int
    layer_bytes: dict[int, int]  # layer index → K+V bytes of that layer (all streams)
    k_bytes: int
    v_bytes: int

    @property
    def n_layers(self) -> int:
        return len(self.layer_bytes)

    @property
    def bytes(self) -> int:
        return self.k_bytes + self.v_bytes


@dataclass
class KvCache:
    n_ctx_seq: int  # cells per sequence after llama.cpp's padding
    n_ctx_total: int  # context n_ctx as llama_context reports it
    parts: list[KvPart] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """Attention KV and recurrent state together: what the cache costs in memory."""
        return sum(p.bytes for p in self.parts)

    @property
    def attn_bytes(self) -> int:
        """The attention KV cache alone (llama.cpp's ``KV buffer size`` lines, summed)."""
        return sum(p.bytes for p in self.parts if p.name != "recurrent")

    @property
    def recurrent_bytes(self) -> int:
        """The recurrent state alone (llama.cpp's ``RS buffer size`` line): R + S, F32."""
        return sum(p.bytes for p in self.parts if p.name == "recurrent")

    def layer_bytes(self, il: int) -> int:
        return sum(p.layer_bytes.get(il, 0) for p in self.parts)


def context_cells(n_ctx: int, n_parallel: int = 1, *, kv_unified: bool = False) -> tuple[int, int]:
    """(n_ctx_total, n_ctx_seq) as llama_context computes them (src/llama-context.cpp, constructor).

    localrun asks for ``n_ctx × n_parallel`` cells; llama.cpp pads that to 256, then (non-unified) gives
    each of ``n_seq_max`` sequences ``GGML_PAD(n_ctx / n_seq_max, 256)`` cells.
    """
    n_par = max(1, n_parallel)
    total = pad(max(1, n_ctx) * n_par, 256)
    if kv_unified:
        return total, total
    seq = pad(total // n_par, 256)
    return seq * n_par, seq


def is_mla(spec: ModelSpec) -> bool:
    """MLA with the K-only latent cache: the GGUF has ``attention.key_length_mla`` (llama-hparams.cpp is_mla)."""
    return spec.meta(".attention.key_length_mla") is not None and spec.meta(".attention.value_length_mla") is not None


def kv_cache(spec: ModelSpec, n_ctx: int, *, n_parallel: int = 1, kv_type: str = "f16", n_ubatch: int = 512,
             swa_full: bool = False, kv_unified: bool = False, kv_type_v: str | None = None,
             flash_attn: bool | None = None, n_rs_seq: int = 0) -> KvCache:
    """KV-cache and recurrent-state bytes exactly as llama.cpp allocates them.

    Which layers hold what comes from ``localrun.model.layers.layer_memory`` (hybrids: only the attention
    layers hold KV; Gemma 4's shared-KV layers none; sliding layers their own head size).
    Per KV layer (src/llama-kv-cache.cpp, constructor): K = ``ggml_row_size(type_k, n_embd_head_k(il) ×
    n_head_kv(il)) × kv_size × n_stream``, V likewise with ``n_embd_head_v(il)`` (absent for MLA, whose V is a
    view of the latent K: ``has_v = !is_mla``; padded to the largest layer's V width when the V cache is
    transposed, i.e. ``flash_attn`` is False). ``n_stream`` = n_seq_max when the cache is not unified.
    kv_size = n_ctx_seq (src/llama-model.cpp create_memory). Sliding-window layers get their own cache
    (src/llama-kv-cache-iswa.cpp): ``GGML_PAD(min(size_base, n_swa × (unified ? n_seq_max : 1) + n_ubatch),
    256)`` cells, or the full size with ``swa_full``.
    Recurrent layers (Mamba, Mamba-2, gated delta-net, short conv, RWKV) keep a fixed F32 state instead, the
    part named "recurrent" (src/llama-memory-recurrent.cpp): R = n_embd_r and S = n_embd_s floats per layer
    and row, ``max(1, n_seq_max) × (1 + n_rs_seq)`` rows — per sequence, not per token of context.
    """
    from localrun.model.layers import layer_memory

    kv_type_v = kv_type_v or kv_type
    n_par = max(1, n_parallel)
    total, seq = context_cells(n_ctx, n_par, kv_unified=kv_unified)
    cache = KvCache(n_ctx_seq=seq, n_ctx_total=total)
    lm = layer_memory(spec)
    n_stream = 1 if kv_unified else n_par
    size_base = total if kv_unified else seq
    mla = is_mla(spec)
    kv_layers = lm.kv_layers
    groups = {"kv": kv_layers}
    sizes = {"kv": size_base}
    if any(lm.swa[il] for il in kv_layers):
        groups = {"kv_base": [il for il in kv_layers if not lm.swa[il]],
                  "kv_swa": [il for il in kv_layers if lm.swa[il]]}
        size_swa = size_base if swa_full else pad(
            min(size_base, spec.sliding_window * (n_par if kv_unified else 1) + n_ubatch), 256)
        sizes = {"kv_base": size_base, "kv_swa": size_swa}
    v_width_max = max((lm.head_dim_v[il] * lm.n_head_kv[il] for il in range(lm.n_layer)), default=0)
    for name, layers in groups.items():
        cells = sizes[name]
        kb = vb = 0
        per: dict[int, int] = {}
        for il in layers:
            hkv = lm.n_head_kv[il]
            k = type_row_bytes(kv_type, lm.head_dim_k[il] * hkv) * cells * n_stream
            v_width = v_width_max if flash_attn is False else lm.head_dim_v[il] * hkv
            v = 0 if mla else type_row_bytes(kv_type_v, v_width) * cells * n_stream
            per[il] = k + v
            kb += k
            vb += v
        if layers or not lm.recurrent_layers:
            cache.parts.append(KvPart(name, cells, n_stream, per, kb, vb))
    if lm.recurrent_layers:
        cache.parts.append(recurrent_state(spec, n_par, n_rs_seq=n_rs_seq))
    return cache


def recurrent_state(spec: ModelSpec, n_seq: int, *, n_rs_seq: int = 0) -> KvPart:
    """The recurrent layers' state (``llama_memory_recurrent``): per layer ``n_embd_r`` (R, the conv / token-
    shift history) and ``n_embd_s`` (S, the SSM / delta-net / WKV state) F32 values per row, ``max(1, n_seq)
    × (1 + n_rs_seq)`` rows (src/llama-memory-recurrent.cpp constructor; src/llama-hparams.cpp
    n_embd_r/n_embd_s; ``n_rs_seq``: llama.cpp's per-sequence rollback snapshots, 0 by default).
    ``k_bytes`` holds R, ``v_bytes`` S; ``cells`` is the rows per sequence."""
    from localrun.model.layers import layer_memory

    lm = layer_memory(spec)
    rows = max(1, n_seq) * (1 + max(0, n_rs_seq))
    r, s = lm.recurrent_row_bytes()
    per = {il: (r + s) * rows for il in lm.recurrent_layers}
    n = len(per)
    return KvPart("recurrent", 1 + max(0, n_rs_seq), max(1, n_seq), per, r * rows * n, s * rows * n)


# ------------------------------------------------------------------------------------------------
# weights placement
# ------------------------------------------------------------------------------------------------

def layers_on_gpu(n_layer: int, n_gpu_layers: int) -> tuple[int, bool]:
    """(first repeating layer on the GPU, output layer on the GPU) for llama.cpp's ``n_gpu_layers``.

    src/llama-model.cpp: ``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)``; the output layer counts
    as layer ``n_layer``, so it is the first to move (``n_gpu_layers >= 1``)."""
    ngl = n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n_layer + 1)
    return n_layer + 1 - ngl if ngl > 0 else n_layer + 1, ngl >= 1


@dataclass
class WeightSplit:
    gpu_bytes: int = 0
    cpu_bytes: int = 0  # everything on the CPU (mmapped: page cache)
    cpu_expert_bytes: int = 0  # of cpu_bytes: MoE expert tensors kept on the CPU
    gpu_layers: list[int] = field(default_factory=list)  # repeating layers on the GPU
    output_on_gpu: bool = False


def split_weights(spec: ModelSpec, n_gpu_layers: int, *, n_cpu_moe: int = 0) -> WeightSplit:
    """Weight bytes on the GPU and on the CPU (src/llama-model.cpp load_tensors).

    ``token_embd`` always stays on the CPU (dev_input). The output layer (``output.weight``,
    ``output_norm``) follows ``dev_output``; a model with tied embeddings duplicates ``token_embd`` as the
    output (TENSOR_DUPLICATED), so it costs GPU memory once more when the output is offloaded.
    ``n_cpu_moe`` keeps the expert tensors of the first N layers on the CPU (llama.cpp ``--n-cpu-moe``).
    """
    start, out_gpu = layers_on_gpu(spec.n_layer, n_gpu_layers)
    ws = WeightSplit(gpu_layers=[il for il in range(start, spec.n_layer)], output_on_gpu=out_gpu)
    has_output = spec.has_output_weight
    for g in spec.tensor_groups:  # the tensor table summed per (layer, role)
        expert = g.role in ("exps", "chexps")
        if g.layer is not None:
            on_gpu = g.layer >= start and not (expert and g.layer < n_cpu_moe)
        elif g.role in ("token_embd", "token_embd_other"):
            on_gpu = False
            if not has_output and g.role == "token_embd" and out_gpu:
                ws.gpu_bytes += g.n_bytes  # the duplicated tied output
        elif g.role == "output":
            on_gpu = out_gpu
        else:
            on_gpu = False
        if on_gpu:
            ws.gpu_bytes += g.n_bytes
        else:
            ws.cpu_bytes += g.n_bytes
            if g.layer is not None and expert:
                ws.cpu_expert_bytes += g.n_bytes
    return ws


def model_buffer_bytes(spec: ModelSpec) -> int:
    """CPU-only load: llama.cpp's ``CPU_Mapped model buffer size`` = the file span of all tensors
    (src/llama-model.cpp load_tensors maps [first tensor offset, last tensor end) as one buffer)."""
    if not spec.tensors:
        return 0
    return max(t.offset + t.n_bytes for t in spec.tensors) - min(t.offset for t in spec.tensors)


# ------------------------------------------------------------------------------------------------
# compute / output buffers and host overhead
# ------------------------------------------------------------------------------------------------

def output_buffer_bytes(spec: ModelSpec, n_parallel: int = 1) -> int:
    """Host logits buffer: n_vocab × 4 bytes × n_outputs_max (= n_seq_max) (src/llama-context.cpp
    output_reserve; measured: 0.19 MiB SmolLM2, 1.00 MiB Gemma-3, ×2 with 2 sequences)."""
    return spec.vocab_size * 4 * max(1, n_parallel)


def compute_buffer_bytes(spec: ModelSpec, n_kv_cells: int, *, n_ubatch: int = 512, flash_attn: bool = True) -> int:
    """The scheduler's worst-case graph (``sched_reserve: ... compute buffer size``), empirical.

    ``n_kv_cells``: the cells one stream's attention spans — ``n_ctx_seq`` (one KV stream per sequence,
    localrun's default) or all cells when the cache is unified. The number of sequences does not multiply
    it: llama.cpp reserves the graph for one ubatch of ``n_ubatch`` tokens, split across the streams
    (src/llama-kv-cache.cpp: KQ is ``[n_kv, n_tokens / n_stream, n_head, n_stream]``), measured: SmolLM2
    at 8192 tokens reserves 166.38 MiB with 1, 4 and 8 sequences (tests/test_memory.py).

    Flash attention: the peak is the last stage, logits + two hidden states:
    ``n_ubatch × (n_vocab + 2 n_embd) × 4`` — exact for SmolLM2 (98.25 MiB) and Gemma-3 (514.50 MiB).
    Without it the attention scores ``KQ`` (f32, n_kv × n_ubatch × n_head, plus the mask) can dominate:
    ``n_ubatch × 4 × (n_kv × (n_head + 1) + 6 n_embd)`` (SmolLM2 at 8192: 166.38 MiB measured, 166.75
    predicted). 2% margin on top.
    """
    logits = n_ubatch * (spec.vocab_size + 2 * spec.n_embd) * 4
    if flash_attn:
        peak = logits
    else:
        attn = n_ubatch * 4 * (max(1, n_kv_cells) * (spec.n_head + 1) + 6 * spec.n_embd)
        peak = max(logits, attn)
    return int(peak * 1.02)


def model_host_overhead_bytes(spec: ModelSpec) -> int:
    """Anonymous memory a loaded model keeps besides weights (vocab tables), empirical (see constants)."""
    return MODEL_HOST_BASE_BYTES + MODEL_HOST_BYTES_PER_TOKEN * spec.vocab_size



# ------------------------------------------------------------------------------------------------
# MLX (mlx-lm): weights as MLX stores them, its KV cache, a compute margin
# ------------------------------------------------------------------------------------------------

MLX_GROUP_SIZE = 32  # MLX affine quantization group (localrun's GGUF conversion, backends/mlx/gguf.py)
# bits of MLX affine quantization a ggml type becomes (natively for Q4_0/Q4_1/Q8_0, re-quantized otherwise)
MLX_BITS = {"Q2_K": 2, "Q3_K": 3, "Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5,
            "Q6_K": 6, "Q8_0": 8, "Q8_1": 8, "Q8_K": 8, "IQ2_XXS": 2, "IQ2_XS": 2, "IQ2_S": 2,
            "IQ3_XXS": 3, "IQ3_S": 3, "IQ4_NL": 4, "IQ4_XS": 4, "IQ1_S": 2, "IQ1_M": 2, "TQ1_0": 2,
            "TQ2_0": 2}
# compute buffers and activations on top of weights + KV (measured peaks of mlx-lm with small prompt
# chunks stay under ~5% of the weights; at least 256 MiB)
MLX_COMPUTE_FRAC = 0.05
MLX_COMPUTE_MIN_BYTES = 256 * MiB


def mlx_weight_bytes(spec: ModelSpec) -> int:
    """Bytes the weights of a GGUF take in MLX: floats and 1-D tensors as stored; quantized matrices at
    ``MLX_BITS`` bits + an fp16 scale and bias (4 bytes) per ``MLX_GROUP_SIZE`` weights
    (mlx ``mlx/io/gguf_quants.cpp`` for the native types; ``mx.quantize`` for the others)."""
    total = 0
    for t in spec.tensors:
        n = t.n_elements
        if t.type_name in ("F32", "F16", "BF16") or len(t.shape) < 2:
            total += t.n_bytes
        else:
            total += n * MLX_BITS.get(t.type_name, 8) // 8 + n // MLX_GROUP_SIZE * 4
    return total


def mlx_kv_bytes(config_or_spec, n_ctx: int, bytes_per_el: int = 2) -> int:
    """KV-cache bytes of mlx-lm's cache for one sequence of ``n_ctx`` tokens: per layer
    ``n_kv_heads × (d_k + d_v) × tokens × bytes`` (fp16/bf16), sliding-window layers holding at most
    ``window`` tokens (mlx_lm/models/cache.py: KVCache, RotatingKVCache). ``config_or_spec``: a
    ModelSpec, or an MLX folder's config.json dict."""
    s = config_or_spec
    if isinstance(s, dict):
        n_layer = int(s.get("num_hidden_layers", 0))
        n_head = int(s.get("num_attention_heads", 1))
        n_kv = int(s.get("num_key_value_heads") or n_head)
        hd = int(s.get("head_dim") or int(s.get("hidden_size", 0)) // max(1, n_head))
        window = int(s.get("sliding_window") or 0)
        pattern = int(s.get("sliding_window_pattern") or 0)
        swa = [bool(window and pattern and (i + 1) % pattern) for i in range(n_layer)]
        per_layer = [(n_kv, hd, hd)] * n_layer
    else:
        n_layer = s.n_layer
        window = s.sliding_window or 0
        swa = list(s.swa_layers) if window else [False] * n_layer
        kvs = s.n_head_kv_per_layer or [s.n_head_kv] * n_layer
        per_layer = [(kvs[i], s.head_dim_k, s.head_dim_v) for i in range(n_layer)]
    total = 0
    for i, (kv, dk, dv) in enumerate(per_layer):
        toks = min(n_ctx, window) if i < len(swa) and swa[i] else n_ctx
        total += kv * (dk + dv) * toks * bytes_per_el
    return total


def mlx_memory(weights_bytes: int, kv_bytes: int) -> dict[str, int]:
    """{weights_bytes, kv_bytes, compute_bytes, total_bytes} MLX needs (compute: the margin above)."""
    compute = max(MLX_COMPUTE_MIN_BYTES, int(weights_bytes * MLX_COMPUTE_FRAC))
    return {"weights_bytes": weights_bytes, "kv_bytes": kv_bytes, "compute_bytes": compute,
            "total_bytes": weights_bytes + kv_bytes + compute}
