"""Per-layer memory facts of a model, read from its GGUF header as llama.cpp reads them: which layers keep
an attention KV cache (and with how many heads of which size), which keep a recurrent state (and how many
floats of it), which attend through a sliding window.

Sources (the llama.cpp vendored by llama-cpp-python 0.3.36): ``src/llama-model.cpp`` ``load_hparams`` and
``create_memory`` (the hybrid caches' layer filters), each arch's ``load_arch_hparams`` in
``src/models/<arch>.cpp`` (which layers are recurrent), ``src/llama-hparams.cpp`` (``n_embd_r``,
``n_embd_s``, ``has_kv``, ``n_embd_head_k(il)``), ``src/llama-kv-cache.cpp`` (the ``has_kv`` and filter
checks per layer). Pure: no llama.cpp import. ``spec`` arguments are ``localrun.model.spec.ModelSpec``s
(not imported: spec.py imports this module).
"""

from __future__ import annotations

from dataclasses import dataclass

# llama-arch.cpp llm_arch_is_recurrent: every layer holds a recurrent state, none a KV cache
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# llm_arch_is_hybrid, by the rule their load_arch_hparams uses to mark the recurrent layers
INTERVAL_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})  # attention.recurrent_layers / interval
NO_KV_HEAD_ARCHS = frozenset({"lfm2", "lfm2moe", "granitehybrid", "jamba", "plamo2"})  # head_count_kv(il) == 0
MIXER_ARCHS = frozenset({"nemotron_h", "nemotron_h_moe"})  # head_count_kv(il) == 0 and feed_forward_length(il) == 0
BOTH_ARCHS = frozenset({"falcon-h1"})  # attention and Mamba-2 side by side in every layer
HYBRID_ARCHS = INTERVAL_ARCHS | NO_KV_HEAD_ARCHS | MIXER_ARCHS | BOTH_ARCHS
KV_SHARING_ARCHS = frozenset({"gemma4"})  # attention.shared_kv_layers: the last N layers reuse earlier KV


@dataclass(frozen=True)
class LayerMemory:
    """One entry per trunk layer (``block_count`` minus the ``nextn_predict_layers`` MTP blocks, which the main
    context neither caches nor runs).

    ``kv[il]``: the layer allocates its own K/V cells (``has_kv`` and the hybrid ``filter_attn``; a layer with
    0 KV heads allocates nothing). ``n_head_kv``/``head_dim_k``/``head_dim_v``: its heads (sliding-window
    layers take ``attention.key_length_swa``/``value_length_swa``). ``recurrent[il]``: the layer keeps
    ``r_floats`` + ``s_floats`` F32 values per sequence (llama-hparams.cpp ``n_embd_r``/``n_embd_s``:
    Mamba/Mamba-2/gated delta-net conv R = (d_conv - 1) × (d_inner + 2 n_group d_state) and SSM
    S = d_state × d_inner; LFM2 short conv R = n_embd × (l_cache - 1), S = 0; RWKV R = token_shift_count ×
    n_embd, S = n_embd × head_size).
    """

    kv: tuple[bool, ...]
    swa: tuple[bool, ...]
    n_head_kv: tuple[int, ...]
    head_dim_k: tuple[int, ...]
    head_dim_v: tuple[int, ...]
    recurrent: tuple[bool, ...]
    r_floats: int
    s_floats: int

    @property
    def n_layer(self) -> int:
        return len(self.kv)

    @property
    def kv_layers(self) -> list[int]:
        return [il for il, k in enumerate(self.kv) if k]

    @property
    def recurrent_layers(self) -> list[int]:
        return [il for il, r in enumerate(self.recurrent) if r]

    def recurrent_row_bytes(self) -> tuple[int, int]:
        """(R, S) bytes of one sequence's state in one recurrent layer (F32)."""
        return self.r_floats * 4, self.s_floats * 4


def _per_layer(spec, key: str, n: int, default: int = 0) -> list[int]:
    """llama_model_loader get_key_or_arr: an array per layer, or one scalar for all."""
    v = spec.meta(key)
    if v is None:
        return [default] * n
    if isinstance(v, list):
        return [int(x) for x in v[:n]] + [0] * max(0, n - len(v))
    return [int(v)] * n


def _recurrent_flags(spec, n_all: int, n_trunk: int, hkv: list[int], n_ff: list[int]) -> list[bool]:
    arch = spec.arch
    if arch in RECURRENT_ARCHS:
        return [il < n_trunk for il in range(n_all)]
    if arch in INTERVAL_ARCHS:
        explicit = spec.meta(".attention.recurrent_layers")
        if isinstance(explicit, list):
            return [bool(x) for x in explicit[:n_all]] + [False] * max(0, n_all - len(explicit))
        interval = int(spec.meta(".full_attention_interval", 4) or 4)
        return [il < n_trunk and (il + 1) % interval != 0 for il in range(n_all)]
    if arch in MIXER_ARCHS:
        return [il < n_trunk and hkv[il] == 0 and n_ff[il] == 0 for il in range(n_all)]
    if arch in NO_KV_HEAD_ARCHS:
        return [il < n_trunk and hkv[il] == 0 for il in range(n_all)]
    if arch in BOTH_ARCHS:
        return [True] * n_all
    return [False] * n_all


def _state_floats(spec) -> tuple[int, int]:
    """(n_embd_r, n_embd_s) per llama-hparams.cpp."""
    n_embd = spec.n_embd
    if spec.arch.startswith("rwkv") or spec.arch == "arwkv7":
        head = int(spec.meta(".wkv.head_size", 64) or 64)
        shift = int(spec.meta(".token_shift_count", 2) or 2)
        return shift * n_embd, n_embd * head
    d_inner = int(spec.meta(".ssm.inner_size", 0) or 0)
    d_state = int(spec.meta(".ssm.state_size", 0) or 0)
    l_cache = int(spec.meta(".shortconv.l_cache", 0) or 0)
    if l_cache:
        return n_embd * (l_cache - 1), d_state * d_inner
    d_conv = int(spec.meta(".ssm.conv_kernel", 0) or 0)
    n_group = int(spec.meta(".ssm.group_count", 0) or 0)
    return (max(d_conv - 1, 0)) * (d_inner + 2 * n_group * d_state), d_state * d_inner


def layer_memory(spec) -> LayerMemory:
    """The per-layer facts of ``spec`` (see ``LayerMemory``)."""
    n_all = spec.n_layer
    n_trunk = n_all - int(spec.meta(".nextn_predict_layers", 0) or 0)
    heads = _per_layer(spec, ".attention.head_count", n_all)
    hkv = _per_layer(spec, ".attention.head_count_kv", n_all, default=-1)
    hkv = [heads[il] if h < 0 else h for il, h in enumerate(hkv)]  # n_head_kv defaults to n_head
    n_ff = _per_layer(spec, ".feed_forward_length", n_all)
    recurrent = _recurrent_flags(spec, n_all, n_trunk, hkv, n_ff)

    # head sizes: n_embd / n_head() (the first layer's count) unless the header says (llama-model.cpp)
    n_head0 = heads[0] if heads else 0
    dflt = spec.n_embd // n_head0 if n_head0 else 0
    dk = int(spec.meta(".attention.key_length", dflt) or 0) if n_head0 else 0
    dv = int(spec.meta(".attention.value_length", dflt) or 0) if n_head0 else 0
    dk_swa = int(spec.meta(".attention.key_length_swa", dk) or 0)
    dv_swa = int(spec.meta(".attention.value_length_swa", dv) or 0)
    swa = list(spec.swa_layers)
    if spec.arch in ("lfm2", "lfm2moe"):  # lfm2.cpp: with a window, every attention layer is SWA
        swa = [bool(spec.sliding_window) and not r for r in recurrent]

    # which layers own K/V cells: has_kv (gemma3n/gemma4 shared-KV layers) and the hybrid filter_attn
    n_kv_from_start = n_all - int(spec.meta(".attention.shared_kv_layers", 0) or 0) \
        if spec.arch in KV_SHARING_ARCHS else n_all
    kv = []
    for il in range(n_trunk):
        own = il < n_kv_from_start and hkv[il] > 0 and spec.arch not in RECURRENT_ARCHS
        if spec.arch in MIXER_ARCHS:
            own = own and not recurrent[il] and n_ff[il] == 0
        elif spec.arch in HYBRID_ARCHS - BOTH_ARCHS:
            own = own and not recurrent[il]
        kv.append(own)
    r, s = _state_floats(spec) if any(recurrent[:n_trunk]) else (0, 0)
    return LayerMemory(
        kv=tuple(kv), swa=tuple(swa[:n_trunk]), n_head_kv=tuple(hkv[:n_trunk]),
        head_dim_k=tuple(dk_swa if swa[il] else dk for il in range(n_trunk)),
        head_dim_v=tuple(dv_swa if swa[il] else dv for il in range(n_trunk)),
        recurrent=tuple(recurrent[:n_trunk]), r_floats=r, s_floats=s)
