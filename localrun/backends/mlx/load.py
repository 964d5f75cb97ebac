"""Model loading for ``MlxEngine`` (``mlx.py``): an MLX model folder through ``mlx_lm.load`` (``load_folder``) or
a GGUF file converted in memory by ``mlx.gguf`` (``load_gguf``), each → a ``Loaded`` (the mlx-lm model, its
config, the transformers tokenizer, and what tokenizing and stopping need from them); and the model's
end-of-generation token ids (``end_of_generation_ids``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from localrun.errors import BackendError

# end-of-generation tokens by text, as llama.cpp's vocabulary marks them (src/llama-vocab.cpp, special_eog_ids)
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
             "<|end_of_text|>", "<｜end▁of▁sentence｜>", "<|return|>", "<|call|>")


@dataclass
class Loaded:
    """A loaded model: ``model`` (mlx-lm), ``config`` (config.json dict), ``tokenizer`` (transformers),
    ``eos_ids`` (the model's own EOS ids), ``template_src`` (its chat template, or None), ``manual_bos``
    (the engine adds BOS itself, as ``add_bos`` says: a GGUF's tokenizer is rebuilt without that rule) and
    ``note`` (how the weights got there)."""

    model: Any
    config: dict
    tokenizer: Any
    eos_ids: set[int]
    template_src: str | None
    manual_bos: bool
    add_bos: bool | None
    note: str


def load_folder(path: str) -> Loaded:
    """An MLX model folder (config.json + safetensors + tokenizer) through ``mlx_lm.load``. Raises BackendError."""
    import mlx_lm

    try:
        model, wrapper, config = mlx_lm.load(path, return_config=True)
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise BackendError(f"mlx-lm could not load the MLX folder {path}: {e}",
                           hint="an MLX folder holds config.json, *.safetensors and tokenizer files "
                           "(mlx-community on Hugging Face); for a .gguf give the file") from None
    tokenizer = wrapper._tokenizer
    return Loaded(model=model, config=config, tokenizer=tokenizer, eos_ids=set(wrapper.eos_token_ids or ()),
                  template_src=tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None,
                  manual_bos=False, add_bos=None, note="MLX folder")


def load_gguf(path: str, spec, dtype: str | None) -> Loaded:
    """A GGUF file (``spec``: its ``read_gguf``) converted by ``mlx.gguf.load_gguf`` (``dtype``: its float
    type). Raises BackendError, and what ``mlx.gguf`` raises (UnsupportedArchitectureError, ModelFormatError)."""
    from localrun.backends.mlx import gguf as mlx_gguf

    try:
        model, conv = mlx_gguf.load_gguf(path, spec, dtype=dtype)
    except (ValueError, KeyError) as e:
        raise BackendError(f"MLX could not build {os.path.basename(path)}: {e}",
                           hint="use --backend llamacpp for this file") from None
    return Loaded(model=model, config=conv.config, tokenizer=conv.tokenizer,
                  eos_ids={conv.config["eos_token_id"]} if "eos_token_id" in conv.config else set(),
                  template_src=conv.chat_template, manual_bos=True, add_bos=conv.add_bos, note=conv.note)


def end_of_generation_ids(tokenizer, eos_ids: set[int]) -> set[int]:
    """The ids that end a generation: ``eos_ids``, the tokenizer's EOS, and the vocabulary's ``EOG_TEXTS``."""
    ids = set(eos_ids)
    vocab = tokenizer.get_vocab()
    # gpt-oss (harmony): <|end|> closes a message, <|return|>/<|call|> end the turn (llama-vocab.cpp does the same)
    harmony = "<|return|>" in vocab and "<|call|>" in vocab
    eog_texts = [t for t in EOG_TEXTS if not (t == "<|end|>" and harmony)]
    ids.update(vocab[t] for t in eog_texts if t in vocab)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


_DEQUANTIZE_PAYS: dict[tuple, bool] = {}


def dequantize_pays(model) -> bool:
    """Whether this CPU runs the model's matmuls faster on float32 weights than on mlx's quantized kernels,
    measured through the model's largest quantized matrix (a ``QuantizedLinear``, or tied embeddings as the
    output layer; its first 2,048 rows), quantized (``mx.quantized_matmul``) and with its weight expanded
    (``mx.dequantize``), best of 3 each after a warm-up, on the two shapes a generation runs: one token's row
    (decode, a GEMV) and a 32-token prefill chunk (a GEMM). Float32 pays when one of each takes less time
    in total. The answer differs by CPU and by the BLAS mlx[cpu] finds (float32 goes through BLAS; the
    wheel's own is the reference BLAS): on an AMD EPYC float32 was ≈ 5× faster than a 4-bit kernel; on an
    Intel Xeon with AVX-512 the 4-bit GEMV was 1.8× faster (2048×8192: 11.6 ms against 21.0 ms), while with
    OpenBLAS interposed a float32 prefill ran 15× faster (SmolLM2: 125 against 8 tokens/s, decode 5.8 against
    5.3 tokens/s). So it is measured once per process and layer shape (≈ 0.2 s). False for a model with no
    quantized layer."""
    import time

    import mlx.core as mx
    import mlx.nn as nn

    layers = [m for _, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    if not layers:
        return False
    q = max(layers, key=lambda m: m.weight.size)
    key = (tuple(q.weight.shape), q.bits, q.group_size)
    if key not in _DEQUANTIZE_PAYS:
        # its first 2,048 output rows: the time per row is the same, and a 262,144-token vocabulary's tied
        # embeddings (Gemma 3) would take seconds per quantized prefill chunk at mlx[cpu]'s speed
        rows = slice(0, min(2048, q.weight.shape[0]))
        biases = q.biases[rows] if getattr(q, "biases", None) is not None else None  # None: mxfp4-style modes
        wq, scales, kw = q.weight[rows], q.scales[rows], {"group_size": q.group_size, "bits": q.bits}
        if hasattr(q, "mode"):
            kw["mode"] = q.mode
        w = mx.dequantize(wq, scales, biases, **kw)
        x1, x32 = mx.random.normal((1, w.shape[1])), mx.random.normal((32, w.shape[1]))
        mx.eval(w, wq, scales, x1, x32)

        def quantized(x):
            return mx.quantized_matmul(x, wq, scales, biases, transpose=True, **kw)

        def best(f) -> float:
            mx.eval(f())
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                mx.eval(f())
                times.append(time.perf_counter() - t0)
            return min(times)

        float32 = best(lambda: x1 @ w.T) + best(lambda: x32 @ w.T)
        _DEQUANTIZE_PAYS[key] = float32 < best(lambda: quantized(x1)) + best(lambda: quantized(x32))
    return _DEQUANTIZE_PAYS[key]
