"""GGUF → MLX: turn a llama.cpp model file into an mlx-lm model (in memory, or as an MLX model folder).

Two paths, chosen per file:

* **native** — every tensor is F32, F16, Q4_0, Q4_1 or Q8_0. ``mx.load`` reads these straight from the
  GGUF into MLX's own affine quantization (Q4_0/Q4_1 → 4-bit, Q8_0 → 8-bit, group size 32: the blocks
  map one-to-one, ``w = scale·q + bias``; mlx ``mlx/io/gguf_quants.cpp``), so no weight changes.
* **requantized** — any other type (the K-quants Q2_K…Q6_K, Q5_0/Q5_1, IQ*, BF16). Each tensor is
  dequantized to float32 with the ``gguf`` package (``gguf.quants.dequantize``, a port of
  ``ggml-quants.c``) and re-quantized with ``mx.quantize`` to affine, group size 32, at the same bit
  width (Q4_K → 4, Q5_K/Q5_0 → 5, Q6_K → 6, Q8_0 → 8, Q2_K → 2, Q3_K → 3; IQ* by their nominal bits).
  *Quality note*: this is a second rounding on top of llama.cpp's, so the result is slightly worse than
  the GGUF itself (K-quants keep 6-bit sub-block scales over 16–32 weights that MLX cannot express; MLX
  refits one fp16 scale and bias per 32 weights). Greedy outputs usually agree with llama.cpp's for most
  tokens, but not bit for bit; for the best quality on Apple Silicon use an mlx-community MLX folder, or
  the llama.cpp backend, which runs K-quants natively.

Names are mapped from llama.cpp's (``blk.N.attn_q``) to Hugging Face's (``model.layers.N.self_attn.q_proj``)
as ``convert_hf_to_gguf.py`` wrote them, undoing its changes: the Q/K row permutation of the ``llama``
architecture (``LlamaModel.permute``, for llama.cpp's interleaved RoPE) and the ``+1`` on Gemma's RMSNorm
weights. The tokenizer is rebuilt from ``tokenizer.ggml.*`` (transformers' GGUF tokenizer converters) when
the model has no tokenizer file.

Supported architectures: ``SUPPORTED_ARCHS`` (mlx-lm model modules). ``write_mlx_folder`` writes
config.json + model.safetensors + tokenizer files that ``mlx_lm.load`` reloads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localrun.errors import ModelFormatError, UnsupportedArchitectureError

# GGUF architecture → mlx-lm model module (mlx_lm/models/<name>.py)
SUPPORTED_ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                   "gemma3": "gemma3_text"}
# tensor types mx.load reads from a GGUF without changing the weights (mlx/io/gguf.cpp)
NATIVE_TYPES = {"F32", "F16", "Q4_0", "Q4_1", "Q8_0"}
# bits of MLX affine quantization per ggml type, and the group size: the planner's table (offload/memory.py)
from localrun.offload.memory import MLX_BITS as REQUANT_BITS  # noqa: E402
from localrun.offload.memory import MLX_GROUP_SIZE as GROUP_SIZE  # noqa: E402
from localrun.offload.memory import mlx_weight_bytes  # noqa: E402,F401  (re-exported)

_ROWS_PER_CHUNK = 16384  # rows dequantized at once (bounds the float32 copy: 16384 × n_embd × 4 bytes)

_LAYER_MAP = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


@dataclass
class Converted:
    """A GGUF as mlx-lm parts: ``config`` (config.json dict), ``weights`` (HF name → mx.array; quantized
    linears as ``.weight``/``.scales``/``.biases``), the tokenizer (a transformers fast tokenizer), and
    how the weights got there (``path`` = "native" | "requantized"; ``requantized`` = ggml type → MLX bits)."""

    config: dict
    weights: dict
    tokenizer: Any
    path: str
    requantized: dict[str, int] = field(default_factory=dict)
    add_bos: bool = False
    chat_template: str | None = None

    @property
    def note(self) -> str:
        if self.path == "native":
            return "GGUF loaded natively by MLX (weights unchanged)"
        kinds = ", ".join(f"{k}→{v}-bit" for k, v in sorted(self.requantized.items()))
        return (f"GGUF dequantized and re-quantized to MLX affine {GROUP_SIZE}-group ({kinds}); a second "
                "rounding, so quality is slightly below the GGUF's (llama.cpp runs these types natively)")


def mlx_model_type(arch: str) -> str:
    """mlx-lm module for a GGUF architecture; raises UnsupportedArchitectureError."""
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedArchitectureError(
            arch, "mlx", hint=f"the MLX backend converts {', '.join(sorted(SUPPORTED_ARCHS))} GGUFs; "
            "use --backend llamacpp, or an MLX folder from mlx-community")
    return SUPPORTED_ARCHS[arch]


def loads_natively(spec) -> bool:
    """True when MLX reads every tensor of this GGUF as is (``NATIVE_TYPES``) and converts the arch."""
    return spec.arch in SUPPORTED_ARCHS and all(t.type_name in NATIVE_TYPES for t in spec.tensors)


# ------------------------------------------------------------------------------------------ metadata
def read_metadata(path: str) -> dict[str, Any]:
    """All GGUF key/values, the vocabulary arrays included (the tokenizer needs them): ``gguf_info``'s
    parser with ``all_arrays`` (string arrays as lists of str, numeric arrays as lists). Raises
    ModelFormatError on a corrupt header."""
    from localrun.model.gguf_info import read_gguf

    return read_gguf(path, all_arrays=True).metadata


# ------------------------------------------------------------------------------------------ config
def build_config(spec) -> dict:
    """config.json for mlx-lm from the GGUF hyperparameters (names as in Hugging Face configs)."""
    arch = spec.arch
    mt = mlx_model_type(arch)
    m = lambda k, d=None: spec.meta("." + k, d)  # noqa: E731  (arch-prefixed key)
    n_head = int(m("attention.head_count"))
    n_kv = spec.n_head_kv or n_head
    head_dim = int(m("attention.key_length") or spec.n_embd // n_head)
    cfg: dict[str, Any] = {
        "model_type": mt, "hidden_size": spec.n_embd, "num_hidden_layers": spec.n_layer,
        "intermediate_size": spec.n_ff, "num_attention_heads": n_head, "num_key_value_heads": int(n_kv),
        "head_dim": head_dim, "rms_norm_eps": float(m("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": int(spec.vocab_size), "max_position_embeddings": int(spec.n_ctx_train or 4096),
        "rope_theta": float(m("rope.freq_base", 10000.0)),
        "tie_word_embeddings": spec.tensor("output.weight") is None,
    }
    if arch == "gemma3":
        # llama.cpp src/llama-model.cpp (LLM_ARCH_GEMMA3): SWA pattern 6, local RoPE base 10000, and
        # attention scale 1/sqrt(head_dim) except the 27B (1/sqrt(n_embd/n_head))
        cfg.update(sliding_window=int(m("attention.sliding_window", 512)), sliding_window_pattern=6,
                   rope_local_base_freq=10000.0,
                   query_pre_attn_scalar=spec.n_embd // n_head if spec.n_layer == 62 else head_dim)
    if arch == "qwen2":
        cfg["attention_bias"] = True
    factor = m("rope.scaling.factor")
    kind = m("rope.scaling.type")
    if factor and kind in ("linear", "yarn"):
        cfg["rope_scaling"] = {"type": kind, "rope_type": kind, "factor": float(factor)}
    if spec.eos_token_id is not None:
        cfg["eos_token_id"] = int(spec.eos_token_id)
    if spec.bos_token_id is not None:
        cfg["bos_token_id"] = int(spec.bos_token_id)
    return cfg


def hf_name(gguf_name: str, arch: str) -> str | None:
    """Hugging Face parameter prefix for a GGUF tensor name (without .weight/.bias), or None to skip."""
    base, _, kind = gguf_name.rpartition(".")
    if base == "token_embd":
        return "model.embed_tokens." + kind
    if base == "output_norm":
        return "model.norm." + kind
    if base == "output":
        return "lm_head." + kind
    if base.startswith("blk."):
        _, n, part = base.split(".", 2)
        if part == "ffn_norm":
            mapped = "pre_feedforward_layernorm" if arch == "gemma3" else "post_attention_layernorm"
        else:
            mapped = _LAYER_MAP.get(part)
        if mapped:
            return f"model.layers.{n}.{mapped}.{kind}"
    if base.startswith("rope_freqs"):
        return None
    return None


def _unpermute_index(n_rows: int, n_head: int):
    """Row order that undoes convert_hf_to_gguf.py ``LlamaModel.permute`` (HF NeoX → GGUF interleaved)."""
    import numpy as np

    hd = n_rows // n_head
    return np.arange(n_rows).reshape(n_head, hd // 2, 2).swapaxes(1, 2).reshape(-1)


# ------------------------------------------------------------------------------------------ weights
def convert_gguf(path: str, spec=None, *, dtype: str | None = None) -> Converted:
    """Read a GGUF into mlx-lm's layout (see the module docstring for the two paths).

    ``dtype`` is the float type of norms, scales and biases (``float32`` on CPU, where it is faster
    and closest to llama.cpp; ``float16``, or ``bfloat16`` for Gemma, on Metal). Raises
    UnsupportedArchitectureError, ModelFormatError, TruncatedModelError."""
    import mlx.core as mx

    from localrun.model.gguf_info import read_gguf

    spec = spec or read_gguf(path)
    spec.check_complete()
    config = build_config(spec)
    arch = spec.arch
    if dtype is None:
        dtype = "float32" if not mx.metal.is_available() else ("bfloat16" if arch.startswith("gemma") else "float16")
    fdt = getattr(mx, dtype)
    native = loads_natively(spec)
    requantized: dict[str, int] = {}
    if native:
        try:
            raw = mx.load(path)
        except Exception as e:  # mlx's GGUF reader: corrupt file
            raise ModelFormatError(path, f"MLX could not read it ({e})") from None
    else:
        raw = _requantize_all(path, spec, requantized)

    n_head = config["num_attention_heads"]
    n_kv = config["num_key_value_heads"]
    weights: dict[str, Any] = {}
    for name, arr in raw.items():
        tname, _, suffix = name.rpartition(".")  # suffix: weight | scales | biases | bias
        gname = tname + (".bias" if suffix == "bias" else ".weight")
        target = hf_name(gname, arch)
        if target is None:
            continue
        target = target.rpartition(".")[0] + "." + suffix
        if arch in ("llama", "mistral") and tname.endswith((".attn_q", ".attn_k")) and suffix != "bias":
            heads = n_head if tname.endswith(".attn_q") else n_kv
            arr = arr[mx.array(_unpermute_index(arr.shape[0], heads))]
        if arr.dtype in (mx.float16, mx.float32, mx.bfloat16):
            if arch == "gemma3" and tname.endswith("norm") and suffix == "weight":
                arr = arr.astype(mx.float32) - 1.0  # convert_hf_to_gguf Gemma3Model: norm weight + 1
            arr = arr.astype(fdt)
        weights[target] = arr
    md = read_metadata(path)
    tok = cached_tokenizer(path, md)
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", md.get("tokenizer.ggml.model") == "llama"))
    tmpl = md.get("tokenizer.chat_template")
    return Converted(config=config, weights=weights, tokenizer=tok, path="native" if native else "requantized",
                     requantized=requantized, add_bos=add_bos,
                     chat_template=tmpl if isinstance(tmpl, str) and tmpl.strip() else None)


def _requantize_all(path: str, spec, requantized: dict[str, int]) -> dict:
    """Every tensor of ``spec`` as MLX arrays: floats as float32, quantized ones dequantized with
    ``gguf.quants`` and re-quantized with ``mx.quantize`` (affine, GROUP_SIZE, REQUANT_BITS)."""
    import mlx.core as mx
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from localrun.model.spec import ggml_type_info

    out: dict[str, Any] = {}
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    for t in spec.tensors:
        start = spec.data_offset + t.offset
        blob = mm[start:start + t.n_bytes]
        shape = tuple(reversed(t.shape))  # numpy order: rows first
        name = t.name.rpartition(".")[0]
        suffix = "bias" if t.name.endswith(".bias") else "weight"
        if t.type_name in ("F32", "F16", "BF16"):
            if t.type_name == "BF16":
                a = (blob.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                a = blob.view(np.float32 if t.type_name == "F32" else np.float16)
            out[f"{name}.{suffix}"] = mx.array(np.array(a, dtype=np.float32).reshape(shape))
            continue
        qtype = GGMLQuantizationType(t.ggml_type)
        if len(shape) != 2:
            out[f"{name}.{suffix}"] = mx.array(dequantize(np.array(blob), qtype).reshape(shape))
            continue
        _, block, type_bytes = ggml_type_info(t.ggml_type)
        rows, cols = shape
        row_bytes = cols // block * type_bytes
        blob = blob.reshape(rows, row_bytes)
        bits = REQUANT_BITS.get(t.type_name, 8)
        requantized[t.type_name] = bits
        parts_w, parts_s, parts_b = [], [], []
        for r0 in range(0, rows, _ROWS_PER_CHUNK):
            w = mx.array(dequantize(np.array(blob[r0:r0 + _ROWS_PER_CHUNK]), qtype))
            wq, s, b = mx.quantize(w, group_size=GROUP_SIZE, bits=bits)
            mx.eval(wq, s, b)
            parts_w.append(wq)
            parts_s.append(s)
            parts_b.append(b)
        cat = lambda xs: xs[0] if len(xs) == 1 else mx.concatenate(xs, axis=0)  # noqa: E731
        out[f"{name}.weight"], out[f"{name}.scales"], out[f"{name}.biases"] = cat(parts_w), cat(parts_s), cat(parts_b)
    return out


# ------------------------------------------------------------------------------------------ tokenizer
def build_tokenizer(md: dict):
    """A transformers fast tokenizer from ``tokenizer.ggml.*`` (transformers' GGUF converters, which
    need no torch when handed the metadata). Raises ModelFormatError when the vocabulary is missing."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    if "tokenizer.ggml.tokens" not in md:
        raise ModelFormatError(str(md.get("general.name", "model")), "no tokenizer in the GGUF metadata")
    d: dict[str, Any] = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        v = md.get("tokenizer." + key)
        if v is not None:
            d[name] = v.tolist() if hasattr(v, "tolist") else v
    arch = md.get("general.architecture", "llama")
    backend, _ = convert_gguf_tokenizer(arch, d)
    toks = d["tokens"]
    special = {}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unk_token_id"), ("pad_token", "pad_token_id")):
        if d.get(key) is not None and 0 <= int(d[key]) < len(toks):
            special[name] = toks[int(d[key])]
    tmpl = md.get("tokenizer.chat_template")
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=tmpl, **special)


def cached_tokenizer(path: str, md: dict):
    """``build_tokenizer``, cached as tokenizer.json under LOCALRUN_HOME/cache/mlx-tokenizers/ (keyed by
    the file's path, size and mtime): rebuilding Gemma's 262k-token vocabulary's merges takes ~15 s."""
    import hashlib

    from transformers import PreTrainedTokenizerFast

    from localrun.config import get_settings

    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    d = get_settings().home / "cache" / "mlx-tokenizers" / key
    if (d / "tokenizer.json").is_file():
        try:
            return PreTrainedTokenizerFast.from_pretrained(str(d))
        except Exception:  # a damaged cache entry: rebuild it
            shutil.rmtree(d, ignore_errors=True)
    tok = build_tokenizer(md)
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=d.parent))
        tok.save_pretrained(str(tmp))
        os.replace(tmp, d)
    except OSError:
        pass  # a read-only home: the cache is only an optimization
    return tok


# ------------------------------------------------------------------------------------------ model
def build_model(config: dict, weights: dict):
    """An mlx-lm ``nn.Module`` from a config dict and weights, as ``mlx_lm.utils.load_model`` builds it
    (per-layer bits and group size inferred from the packed shapes)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.utils import _get_classes, infer_quant_config

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = model.sanitize(dict(weights)) if hasattr(model, "sanitize") else weights

    def predicate(p, m):
        if not hasattr(m, "to_quantized") or f"{p}.scales" not in weights:
            return False
        return infer_quant_config(p, m, weights)

    nn.quantize(model, group_size=GROUP_SIZE, bits=4, class_predicate=predicate)
    model.eval()
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return model


def load_gguf(path: str, spec=None, *, dtype: str | None = None):
    """(mlx-lm model, ``Converted``) for a GGUF file."""
    conv = convert_gguf(path, spec, dtype=dtype)
    model = build_model(conv.config, conv.weights)
    return model, conv


def write_mlx_folder(path: str, out_dir: str | os.PathLike, spec=None, *, dtype: str | None = None) -> Path:
    """Write an MLX model folder (config.json, model.safetensors, tokenizer.json/tokenizer_config.json)
    converted from the GGUF ``path``, that ``mlx_lm.load(out_dir)`` reloads. Written into a temporary
    sibling folder and renamed, so a failure never leaves a half-written model. Returns ``out_dir``."""
    import mlx.core as mx

    conv = convert_gguf(path, spec, dtype=dtype)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=out.parent))
    try:
        cfg = dict(conv.config)
        cfg["quantization"] = {"group_size": GROUP_SIZE, "bits": 4}
        cfg["quantization_config"] = cfg["quantization"]
        cfg["localrun"] = {"source": os.path.abspath(path), "conversion": conv.note}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        mx.save_safetensors(str(tmp / "model.safetensors"), conv.weights, metadata={"format": "mlx"})
        conv.tokenizer.save_pretrained(str(tmp))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
