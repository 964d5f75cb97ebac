"""Sentence embeddings from a loaded llama.cpp model: a second context on the same weights.

The context is created with ``embeddings = true`` and ``pooling_type = MEAN`` (llama.cpp
``examples/embedding/embedding.cpp`` does the same): every input is decoded as one sequence in one
ubatch (pooled embeddings need the whole sequence in one ubatch), llama.cpp averages the last hidden
states over the sequence's tokens (``llama_get_embeddings_seq``), and the vector is L2-normalized as
OpenAI's embeddings are. The weights are shared with the generation context (no second load); the
extra memory is this context's KV cache and compute buffer for ``n_ctx`` tokens.

Not thread-safe; the server calls it from its scheduler thread, between decode steps.
"""

from __future__ import annotations

import ctypes
import math
from typing import Sequence

from localrun.backends.llamacpp.params import embedding_context_params, new_context
from localrun.errors import BackendError, ContextOverflowError


class LlamaCppEmbedder:
    """Embeddings of token sequences with ``engine``'s model. ``n_ctx`` = longest input, tokens."""

    def __init__(self, engine, n_ctx: int | None = None) -> None:
        C = self.C = engine.C
        self.engine = engine
        self.n_ctx = int(min(n_ctx or engine.n_ctx, engine.n_ctx))
        self.ctx = new_context(C, engine.model, embedding_context_params(C, engine.plan, self.n_ctx))
        if not self.ctx:
            raise BackendError("llama.cpp could not create the embedding context",
                               hint="lower --ctx or run with LOCALRUN_DEBUG=1 to see llama.cpp's log")
        self.n_embd = int(C.llama_model_n_embd(engine.model))
        self.mem = C.llama_get_memory(self.ctx)
        self._batch = C.llama_batch_init(self.n_ctx, 0, 1)
        self._encoder = bool(C.llama_model_has_encoder(engine.model))

    def embed(self, tokens: Sequence[int]) -> list[float]:
        """Mean-pooled, L2-normalized embedding (``n_embd`` floats). Raises ContextOverflowError."""
        C, b = self.C, self._batch
        tokens = list(tokens) or [C.llama_vocab_bos(self.engine.vocab)]
        if len(tokens) > self.n_ctx:
            raise ContextOverflowError(len(tokens), self.n_ctx)
        C.llama_memory_clear(self.mem, True)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, i, 1
            b.seq_id[i][0], b.logits[i] = 0, 1
        b.n_tokens = len(tokens)
        rc = (C.llama_encode if self._encoder else C.llama_decode)(self.ctx, b)
        if rc != 0:
            raise BackendError(f"llama.cpp embedding decode failed (code {rc})")
        ptr = C.llama_get_embeddings_seq(self.ctx, 0)
        if not ptr:
            raise BackendError("llama.cpp returned no pooled embedding")
        vec = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))[: self.n_embd]
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        return [v / norm for v in vec]

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self.C.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ctx", None):
            self.C.llama_free(self.ctx)
            self.ctx = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
