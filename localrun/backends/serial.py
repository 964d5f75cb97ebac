"""``SerialEngine``: the server's multi-sequence engine API on top of a single-stream engine, with ONE slot.

The server's scheduler (``localrun/server/scheduler.py``) drives ``acquire_slot`` / ``start`` / ``step`` /
``release``, the API of ``LlamaCppEngine``'s multi-sequence context. A backend that only has the
``Engine`` protocol's single-stream ``generate`` generator (MLX: ``MlxEngine``) is wrapped here:

* ``n_parallel = 1``: ``acquire_slot`` returns the one slot while it is free, ``None`` while a request runs,
  so the scheduler keeps later requests in its queue and **requests are served one at a time**, in arrival
  order (no continuous batching: two requests never share a forward pass);
* ``start(tokens, params, slot)`` opens the engine's generator for the prompt tokens (nothing runs yet);
* ``step([gen])`` advances it by one chunk: the first call prefills the prompt and samples the first token,
  every later call decodes one token;
* ``release(gen, keep_kv)`` closes the generator (decoding stops at once; the engine stays usable).
  ``keep_kv=False`` (a cancelled or failed request) also drops the engine's cached KV.

Prefix caching is the wrapped engine's own: ``MlxEngine`` keeps the KV of the last sequence and reuses
the longest common prefix with the next prompt (``_reuse_prefix``), so ``Generation.cached_tokens`` and the
final ``Stats.cached_tokens`` report the reused tokens, as with llama.cpp's slots.

Every other attribute (``n_ctx``, ``backend``, ``model_path``, ``spec``, ``has_chat_template``,
``apply_chat_template``, ``detokenize``, ``chat``, ``generate``, ``close``, …) is the wrapped engine's.
``tokenize`` is serialized by a lock: the server tokenizes in worker threads, and ``MlxEngine.tokenize``
toggles a flag on its shared Hugging Face tokenizer around each call. Not thread-safe otherwise: like the
engines, one thread (the scheduler's) drives ``start``/``step``/``release``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from localrun.backends.base import Chunk, SamplingParams, Stats
from localrun.errors import BackendError

SERIAL_NOTE = "requests served one at a time"


def serving_mode(engine) -> str:
    """How the server runs ``engine``'s requests, for ``serve``'s start-up line and ``/api/ps``:
    ``"llamacpp, 4 parallel sequences"`` or ``"mlx, requests served one at a time"``."""
    if getattr(engine, "serial", False):
        return f"{engine.backend}, {SERIAL_NOTE}"
    n = getattr(engine, "n_parallel", 1)
    return f"{engine.backend}, {n} parallel sequence{'s' if n != 1 else ''}"


@dataclass(eq=False)
class SerialSlot:
    """The one sequence slot. ``busy`` while a generation holds it."""

    seq_id: int = 0
    busy: bool = False


@dataclass(eq=False)
class SerialGeneration:
    """A running request: the prompt, its params, the engine's open generator and what it produced."""

    slot: SerialSlot
    prompt: list[int]
    params: SamplingParams
    cached_tokens: int  # prompt tokens whose KV the engine reuses (its prefix cache)
    stream: Iterator[Chunk] | None
    t_start: float = field(default_factory=time.perf_counter)
    n_chunks: int = 0
    finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class SerialEngine:
    """Wrap a single-stream ``engine`` (``generate(tokens, params)`` → Chunk generator) for the server.

    ``n_parallel`` is 1; ``n_vocab`` is the model's vocabulary size (``config["vocab_size"]`` for MLX,
    tokens), ``kv_cells_used()`` the number of tokens in the engine's KV cache.
    """

    n_parallel = 1
    serial = True  # the server says "requests served one at a time"

    def __init__(self, engine) -> None:
        self.engine = engine
        self.slot = SerialSlot()
        self._tok_lock = threading.Lock()
        cfg = getattr(engine, "config", None) or {}
        n_vocab = getattr(engine, "n_vocab", None) or cfg.get("vocab_size")
        if not n_vocab:
            tok = getattr(engine, "tokenizer", None)
            n_vocab = len(tok) if tok is not None else 0
        self.n_vocab = int(n_vocab)

    def __getattr__(self, name: str):
        # only called for attributes not found on the adapter: the wrapped engine's facts and methods
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    # ------------------------------------------------------------------ thread-safe helpers
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        with self._tok_lock:
            return self.engine.tokenize(text, add_special=add_special, parse_special=parse_special)

    def tokenize_chat(self, messages, **kw) -> tuple[str, list[int]]:
        with self._tok_lock:
            return self.engine.tokenize_chat(messages, **kw)

    def kv_cells_used(self) -> int:
        """Tokens whose KV the wrapped engine holds (its one cache)."""
        cached = getattr(self.engine, "_cache_tokens", None)
        return len(cached) if cached is not None else 0

    # ------------------------------------------------------------------ the scheduler's API
    def acquire_slot(self, prompt: Sequence[int]) -> SerialSlot | None:
        """The slot when it is free, else None (the scheduler keeps the request queued)."""
        return None if self.slot.busy else self.slot

    def start(self, prompt: Sequence[int], params: SamplingParams, slot: SerialSlot | None = None) -> SerialGeneration:
        """Open the engine's generator for ``prompt`` on the slot (no model work yet; ``step`` runs it).

        Raises what the engine's ``generate`` raises eagerly (ContextOverflowError, BackendUnavailableError
        for a grammar on MLX), BackendError when the slot is taken."""
        slot = slot or self.acquire_slot(prompt)
        if slot is None or slot.busy:
            raise BackendError("no free sequence slot", hint="wait for the running request to finish")
        prompt = list(prompt)
        stream = self.engine.generate(prompt, params)
        cached = 0
        reuse = getattr(self.engine, "_reuse_prefix", None)
        if prompt and reuse is not None:
            # trims the engine's cache to the shared prefix now; the generator's own call is then a no-op
            cached = int(reuse(prompt))
        slot.busy = True
        return SerialGeneration(slot=slot, prompt=prompt, params=params, cached_tokens=cached, stream=stream)

    def step(self, gens: Sequence[SerialGeneration]) -> list[tuple[SerialGeneration, Chunk]]:
        """Advance each running generation by one chunk (there is at most one). Engine errors propagate
        (the scheduler fails the request and releases it)."""
        out = []
        for g in gens:
            if g.done or g.stream is None:
                continue
            try:
                chunk = next(g.stream)
            except StopIteration:  # the generator ended without a final chunk: report a clean stop
                chunk = Chunk(text="", finish_reason="stop",
                              stats=Stats(prompt_tokens=len(g.prompt), cached_tokens=g.cached_tokens,
                                          completion_tokens=g.n_chunks, n_ctx=self.engine.n_ctx))
            g.n_chunks += 1
            if chunk.finish_reason is not None:
                g.finish_reason = chunk.finish_reason
                if chunk.stats is not None:
                    g.cached_tokens = chunk.stats.cached_tokens
            out.append((g, chunk))
        return out

    def release(self, gen: SerialGeneration, *, keep_kv: bool = True) -> None:
        """Close ``gen``'s generator and free the slot. ``keep_kv=False`` also drops the engine's KV cache
        (a cancelled or failed request); otherwise it stays as the prefix cache for the next request."""
        if gen is None:
            return
        stream, gen.stream = gen.stream, None
        if stream is not None:
            try:
                stream.close()  # MlxEngine's finally block leaves its cache consistent
            finally:
                if not keep_kv:
                    reset = getattr(self.engine, "reset_cache", None)
                    if reset is not None:
                        reset()
        if gen.slot is self.slot:
            self.slot.busy = False

    def close(self) -> None:
        self.engine.close()
