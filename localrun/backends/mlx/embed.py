"""Sentence embeddings from a loaded MLX model: the same vector the llama.cpp embedder gives
(``llamacpp/embed.py``): the last hidden state (after the final norm, before the output projection: what
llama.cpp's ``t_embd`` is, ``src/llama-graph.cpp``), mean-pooled over the input's tokens and L2-normalized.

mlx-lm models keep the transformer stack in an inner module (``Model.model`` for Llama, Qwen, Gemma, …) whose
call returns exactly that hidden state; the outer ``Model.__call__`` only adds the output projection. The
input runs without a KV cache (``cache=None``), so the engine's prompt cache is not touched. Not thread-safe:
the server calls it on its scheduler thread, between requests (MLX serves one request at a time).
"""

from __future__ import annotations

import math
from typing import Sequence

from localrun.errors import BackendError, ContextOverflowError

# where mlx-lm models keep the stack that returns the final-normed hidden state, by attribute path
_BODIES = (("model",), ("language_model", "model"), ("transformer",), ("backbone",))


def hidden_stack(model):
    """The inner module of an mlx-lm ``model`` whose call returns the last hidden state, shape (1, n, n_embd).
    Raises BackendError when the architecture keeps it elsewhere."""
    for path in _BODIES:
        obj = model
        for name in path:
            obj = getattr(obj, name, None)
            if obj is None:
                break
        if obj is not None and callable(obj):
            return obj
    raise BackendError(f"embeddings are not supported for this MLX model ({type(model).__module__})",
                       hint="serve it with --backend llamacpp for /v1/embeddings")


class MlxEmbedder:
    """Embeddings of token sequences with an ``MlxEngine``'s model (``engine``: the engine, or the serial
    wrapper the server holds). ``n_ctx`` = longest input, tokens (None: the engine's)."""

    def __init__(self, engine, n_ctx: int | None = None) -> None:
        eng = getattr(engine, "engine", engine)  # serial.SerialEngine wraps the MlxEngine
        self.engine = eng
        self.n_ctx = int(min(n_ctx or eng.n_ctx, eng.n_ctx))
        self._stack = hidden_stack(eng.model)

    def embed(self, tokens: Sequence[int]) -> list[float]:
        """Mean-pooled, L2-normalized embedding (``n_embd`` floats). Raises ContextOverflowError."""
        import mlx.core as mx

        tokens = list(tokens)
        if not tokens:
            bos = getattr(self.engine, "bos_id", None)
            tokens = [bos if bos is not None else 0]
        if len(tokens) > self.n_ctx:
            raise ContextOverflowError(len(tokens), self.n_ctx)
        h = self._stack(mx.array(tokens)[None], cache=None)
        vec = mx.mean(h[0].astype(mx.float32), axis=0)
        mx.eval(vec)
        out = vec.tolist()
        norm = math.sqrt(sum(v * v for v in out)) or 1.0
        return [v / norm for v in out]

    def close(self) -> None:
        self._stack = None
