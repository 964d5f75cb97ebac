"""What localrun knows about a model: ``ModelSpec`` (the GGUF header's facts: architecture, metadata,
the tensor table) and the ggml type tables. ``localrun.model.gguf_info.read_gguf`` builds one from a file,
``localrun.model.synthetic`` from a catalog entry. Sizes in bytes, lengths in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

from localrun.errors import TruncatedModelError

# ggml type id → (name, elements per block, bytes per block): ggml/src/ggml.c type_traits, as the
# ``gguf`` package's GGML_QUANT_SIZES has them (tests/test_gguf_info.py checks the two agree). Kept here
# because importing ``gguf`` costs ~0.35 s (numpy), too slow for `localrun fit`; unknown ids fall back to it.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}


def ggml_type_info(type_id: int) -> tuple[str, int, int]:
    """(name, block size, bytes per block) of a ggml type; raises KeyError/ValueError when unknown."""
    if type_id in GGML_TYPES:
        return GGML_TYPES[type_id]
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    qt = GGMLQuantizationType(type_id)
    block, nbytes = GGML_QUANT_SIZES[qt]
    return qt.name, block, nbytes


def ggml_type_id(name: str) -> int:
    """ggml type id for a name such as ``q8_0`` or ``F16``; raises KeyError when unknown."""
    for tid, (tname, _, _) in GGML_TYPES.items():
        if tname == name.upper():
            return tid
    raise KeyError(name)


# llama.cpp's LLAMA_FTYPE (src/llama-model-loader.cpp: llama_model_ftype_name) for general.file_type
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}


@dataclass(frozen=True)
class TensorInfo:
    """One row of the tensor table. ``shape`` is in GGUF order (ne0 first); ``n_bytes`` is the stored size."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    type_name: str
    offset: int  # bytes from the start of the data section
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def layer(self) -> int | None:
        """Block index for ``blk.N.*`` tensors, else None."""
        if self.name.startswith("blk."):
            return int(self.name.split(".", 2)[1])
        return None


@dataclass
class TensorGroup:
    """Tensors of one role in one block (``layer`` None outside the blocks), summed. Bytes, elements."""

    layer: int | None
    role: str
    n_bytes: int = 0
    n_elements: int = 0
    rows: int = 1  # token_embd only: vocabulary rows (one is read per token)


@dataclass
class ModelSpec:
    """Architecture facts of one GGUF model. Sizes in bytes, lengths in tokens.

    ``n_head_kv`` may differ per layer (some models vary it); ``n_head_kv_per_layer`` has one entry
    per layer. ``swa_layers[i]`` is True for a sliding-window layer (llama.cpp's ``hparams.is_swa``).
    """

    path: str
    file_bytes: int
    gguf_version: int
    arch: str
    name: str
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    array_lengths: dict[str, int] = field(default_factory=dict)
    array_offsets: dict[str, int] = field(default_factory=dict)  # file offset of skipped string arrays
    # (file offset, index) → that item of a skipped string array; the reader that built the spec sets it
    string_reader: Callable[[int, int], str] | None = field(default=None, repr=False, compare=False)

    # -- metadata accessors -------------------------------------------------------------------
    def meta(self, key: str, default: Any = None) -> Any:
        """``{arch}.key`` when ``key`` starts with '.', else the literal key."""
        if key.startswith("."):
            key = self.arch + key
        return self.metadata.get(key, default)

    @property
    def n_layer(self) -> int:
        return int(self.meta(".block_count", 0))

    @property
    def n_ctx_train(self) -> int:
        return int(self.meta(".context_length", 0))

    @property
    def n_embd(self) -> int:
        return int(self.meta(".embedding_length", 0))

    @property
    def n_ff(self) -> int:
        v = self.meta(".feed_forward_length", 0)
        return int(max(v) if isinstance(v, list) else v)

    @property
    def n_head(self) -> int:
        v = self.meta(".attention.head_count", 0)
        return int(max(v) if isinstance(v, list) else v)

    @property
    def n_head_kv_per_layer(self) -> list[int]:
        v = self.meta(".attention.head_count_kv", None)
        if v is None:
            v = self.n_head
        if isinstance(v, list):
            return [int(x) for x in v]
        return [int(v)] * self.n_layer

    @property
    def n_head_kv(self) -> int:
        per = self.n_head_kv_per_layer
        return max(per) if per else 0

    @property
    def head_dim_k(self) -> int:
        """d_k per head (``{arch}.attention.key_length``, default n_embd / n_head; llama-model.cpp)."""
        v = self.meta(".attention.key_length")
        if v is not None:
            return int(v)
        return self.n_embd // self.n_head if self.n_head else 0

    @property
    def head_dim_v(self) -> int:
        v = self.meta(".attention.value_length")
        if v is not None:
            return int(v)
        return self.n_embd // self.n_head if self.n_head else 0

    @property
    def sliding_window(self) -> int:
        """Sliding-window size in tokens, 0 when the model has no SWA layers."""
        return int(self.meta(".attention.sliding_window", 0) or 0)

    @property
    def swa_layers(self) -> list[bool]:
        """Per layer: does it use the sliding window? Mirrors llama-model.cpp ``set_swa_pattern``.

        gemma2: every other layer (pattern 2); gemma3: 5 local then 1 global (pattern 6);
        gemma3n/cohere2/llama4 similar; a GGUF may also carry an explicit
        ``{arch}.attention.sliding_window_pattern`` array of bools.
        """
        n = self.n_layer
        if not self.sliding_window:
            return [False] * n
        explicit = self.meta(".attention.sliding_window_pattern")
        if isinstance(explicit, list) and len(explicit) == n:
            return [bool(x) for x in explicit]
        pattern = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "llama4": 4, "gpt-oss": 2,
                   "exaone4": 4}.get(self.arch)
        if isinstance(explicit, int) and explicit > 0:
            pattern = explicit
        if pattern is None:  # e.g. mistral's all-layer SWA
            return [True] * n
        # hparams.set_swa_pattern(n_pattern): layer il is SWA iff il % n_pattern < n_pattern - 1
        return [(il % pattern) < (pattern - 1) for il in range(n)]

    @property
    def n_expert(self) -> int:
        return int(self.meta(".expert_count", 0) or 0)

    @property
    def n_expert_used(self) -> int:
        return int(self.meta(".expert_used_count", 0) or 0)

    @property
    def kv_lora_rank(self) -> int:
        """MLA latent rank (DeepSeek-V2/V3), 0 when the model uses ordinary attention."""
        return int(self.meta(".attention.kv_lora_rank", 0) or 0)

    @cached_property
    def layers(self):
        """Per-layer memory facts (``localrun.model.layers.LayerMemory``): which layers hold KV, with which
        heads, which a recurrent state, and its size."""
        from localrun.model.layers import layer_memory

        return layer_memory(self)

    @property
    def is_recurrent(self) -> bool:
        """Some layer keeps a recurrent state (Mamba, RWKV, or a hybrid's delta-net / SSM / short-conv layers)."""
        return bool(self.layers.recurrent_layers)

    @property
    def is_hybrid(self) -> bool:
        """Recurrent layers and attention layers both (Qwen3.5/3.6, Nemotron-H, Granite 4.0-H, LFM2, …)."""
        return bool(self.layers.recurrent_layers) and bool(self.layers.kv_layers)

    @property
    def vocab_size(self) -> int:
        return self.array_lengths.get("tokenizer.ggml.tokens", 0) or int(self.meta(".vocab_size", 0) or 0)

    @property
    def chat_template(self) -> str | None:
        t = self.metadata.get("tokenizer.chat_template")
        return t if isinstance(t, str) and t.strip() else None

    @property
    def bos_token_id(self) -> int | None:
        v = self.metadata.get("tokenizer.ggml.bos_token_id")
        return None if v is None else int(v)

    @property
    def eos_token_id(self) -> int | None:
        v = self.metadata.get("tokenizer.ggml.eos_token_id")
        return None if v is None else int(v)

    def token_text(self, token_id: int | None) -> str | None:
        """Text of one vocabulary entry, read from the file on demand (the vocab is not kept in memory)."""
        off = self.array_offsets.get("tokenizer.ggml.tokens")
        if token_id is None or off is None or self.string_reader is None or not 0 <= token_id < self.vocab_size:
            return None
        return self.string_reader(off, token_id)

    @property
    def file_type(self) -> str:
        """The GGUF's nominal quantization (``general.file_type``), e.g. ``Q4_K_M``; else the dominant type."""
        ft = self.metadata.get("general.file_type")
        if ft is not None and int(ft) in FILE_TYPES:
            return FILE_TYPES[int(ft)]
        by = self.bytes_by_type
        return max(by, key=by.get) if by else "unknown"

    # -- tensor table -------------------------------------------------------------------------
    @cached_property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @cached_property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @cached_property
    def bytes_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.type_name] = out.get(t.type_name, 0) + t.n_bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    @cached_property
    def layer_bytes(self) -> list[int]:
        """Stored weight bytes of each repeating block ``blk.N``; index = layer."""
        out = [0] * self.n_layer
        for t in self.tensors:
            il = t.layer
            if il is not None and il < len(out):
                out[il] += t.n_bytes
        return out

    @cached_property
    def tensor_groups(self) -> list[TensorGroup]:
        """The tensor table summed by (layer, role): what placement and bytes-per-token need, in one pass.

        A planner evaluates hundreds of placements per model; summing ~3 groups per layer instead of every
        tensor each time keeps ``localrun fit`` fast on 1000-tensor MoE models. Roles: ``dense``,
        ``exps`` (routed expert tensors, ``*_exps``), ``chexps`` (``*_chexps``) in ``blk.N``;
        ``output`` (``output*``), ``token_embd`` (``token_embd.weight``), ``token_embd_other`` and
        ``other`` outside them. Bytes and parameter counts are totals of the group."""
        acc: dict[tuple[int | None, str], TensorGroup] = {}
        for t in self.tensors:
            il = t.layer
            if il is not None:
                role = "exps" if "_exps" in t.name else "chexps" if "_chexps" in t.name else "dense"
            elif t.name.startswith("output"):
                role = "output"
            elif t.name == "token_embd.weight":
                role = "token_embd"
            elif t.name.startswith("token_embd"):
                role = "token_embd_other"
            else:
                role = "other"
            g = acc.get((il, role))
            if g is None:
                g = acc[(il, role)] = TensorGroup(il, role)
            g.n_bytes += t.n_bytes
            g.n_elements += t.n_elements
            if role == "token_embd":
                g.rows = t.shape[-1] if len(t.shape) > 1 else 1
        return list(acc.values())

    @cached_property
    def has_output_weight(self) -> bool:
        """False when the output layer is tied to the token embeddings (no ``output.weight``)."""
        return any(t.name == "output.weight" for t in self.tensors)

    def tensor(self, name: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    @property
    def expected_file_bytes(self) -> int:
        """File size the tensor table implies: data offset + end of the last tensor."""
        if not self.tensors:
            return self.data_offset
        return self.data_offset + max(t.offset + t.n_bytes for t in self.tensors)

    @property
    def truncated(self) -> bool:
        return self.file_bytes < self.expected_file_bytes

    def check_complete(self) -> None:
        """Raise ``TruncatedModelError`` when the tensor data is cut short."""
        if self.truncated:
            raise TruncatedModelError(self.path, self.file_bytes, self.expected_file_bytes)

    def summary(self) -> dict[str, Any]:
        """A JSON-ready description (what ``localrun inspect --json`` prints)."""
        return {
            "path": self.path,
            "file_bytes": self.file_bytes,
            "expected_file_bytes": self.expected_file_bytes,
            "weights_complete": not self.truncated,
            "gguf_version": self.gguf_version,
            "architecture": self.arch,
            "name": self.name,
            "file_type": self.file_type,
            "n_params": self.n_params,
            "n_layer": self.n_layer,
            "n_embd": self.n_embd,
            "n_ff": self.n_ff,
            "n_head": self.n_head,
            "n_head_kv": self.n_head_kv,
            "head_dim_k": self.head_dim_k,
            "head_dim_v": self.head_dim_v,
            "sliding_window": self.sliding_window,
            "n_swa_layers": sum(self.swa_layers),
            "n_kv_layers": len(self.layers.kv_layers),
            "n_recurrent_layers": len(self.layers.recurrent_layers),
            "n_expert": self.n_expert,
            "n_expert_used": self.n_expert_used,
            "kv_lora_rank": self.kv_lora_rank,
            "n_ctx_train": self.n_ctx_train,
            "vocab_size": self.vocab_size,
            "n_tensors": len(self.tensors),
            "tensor_types": {k: {"bytes": v, "n_tensors": sum(1 for t in self.tensors if t.type_name == k)}
                             for k, v in self.bytes_by_type.items()},
            "has_chat_template": self.chat_template is not None,
            "bos_token": {"id": self.bos_token_id, "text": self.token_text(self.bos_token_id)},
            "eos_token": {"id": self.eos_token_id, "text": self.token_text(self.eos_token_id)},
        }
