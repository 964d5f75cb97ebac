"""``SerialEngine``: a single-stream engine as a ``BatchEngine`` with ONE slot (``base.py``).

The server's scheduler (``localrun/server/scheduler.py``) and bench drive ``acquire_slot`` / ``start`` /
``step`` / ``release``, the ``BatchEngine`` API that ``LlamaCppEngine`` implements. A backend that has
only the ``Engine`` protocol's single-stream ``generate`` generator and one prefix cache
(``SingleStreamEngine``: MLX's ``MlxEngine``) is wrapped here, by ``backends.as_batch_engine`` alone:

* ``n_parallel = 1``: ``acquire_slot`` returns the one slot while it is free, ``None`` while a request runs,
  so the scheduler keeps later requests in its queue and **requests are served one at a time**, in arrival
  order (no continuous batching: two requests never share a forward pass);
* ``start(tokens, params, slot)`` opens the engine's generator for the prompt tokens (nothing runs yet);
* ``step([gen])`` advances it by one chunk: the first call prefills the prompt and samples the first token,
  every later call decodes one token;
* ``release(gen, keep_kv)`` closes the generator (decoding stops at once; the engine stays usable).
  ``keep_kv=False`` (a cancelled or failed request) also drops the engine's cached KV.

Prefix caching is the wrapped engine's own: it keeps the KV of the last sequence and reuses the longest
common prefix with the next prompt (``reuse_prefix``), so ``Generation.cached_tokens`` and the final
``Stats.cached_tokens`` report the reused tokens, as with llama.cpp's slots.

The ``Engine`` half (``n_ctx``, ``backend``, ``model_path``, ``spec``, the template, ``detokenize``,
``generate``, ``close``, …) is the wrapped engine's, each forwarded by name (``EngineFront``, which MLX's
``mlx.batch.MlxBatchEngine`` shares). Which engines ``as_batch_engine`` wraps here: an MLX engine whose caches
cannot batch or that speculates (``mlx.batch.can_batch``), and any other ``SingleStreamEngine``. ``tokenize`` and
``tokenize_chat`` are serialized by a lock: the server tokenizes in worker threads, and
``MlxEngine.tokenize`` toggles a flag on its shared Hugging Face tokenizer around each call. Not
thread-safe otherwise: like the engines, one thread (the scheduler's) drives ``start``/``step``/``release``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

from localrun.backends.base import BatchEngine, Chunk, Message, SamplingParams, SingleStreamEngine, Stats
from localrun.errors import BackendError

if TYPE_CHECKING:
    from localrun.model.gguf_info import ModelSpec

SERIAL_NOTE = "requests served one at a time"


def serving_mode(engine: BatchEngine) -> str:
    """How the server runs ``engine``'s requests, for ``serve``'s start-up line and ``/api/ps``:
    ``"llamacpp, 4 parallel sequences"`` or ``"mlx, requests served one at a time"``."""
    if engine.serial:
        return f"{engine.backend}, {SERIAL_NOTE}"
    n = engine.n_parallel
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


class EngineFront:
    """The ``Engine`` half of an engine that wraps a single-stream ``engine`` (``SerialEngine``, MLX's
    ``mlx.batch.MlxBatchEngine``): ``n_ctx``, ``backend``, ``model_path``, ``spec``, the template,
    ``detokenize``, ``generate``, ``close``, … are the wrapped engine's, each forwarded by name.
    ``tokenize`` and ``tokenize_chat`` are serialized by a lock (the server tokenizes in worker threads, and
    ``MlxEngine.tokenize`` toggles a flag on its shared Hugging Face tokenizer around each call)."""

    def __init__(self, engine: SingleStreamEngine) -> None:
        self.engine = engine
        self._tok_lock = threading.Lock()

    @property
    def backend(self) -> str:
        return self.engine.backend

    @property
    def model_path(self) -> str:
        return self.engine.model_path

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.engine.n_vocab

    @property
    def spec(self) -> ModelSpec | None:
        return self.engine.spec

    @property
    def add_bos(self) -> bool | None:
        return self.engine.add_bos

    @property
    def has_chat_template(self) -> bool:
        return self.engine.has_chat_template

    @property
    def template_source(self) -> str | None:
        return self.engine.template_source

    @property
    def supports_tools(self) -> bool:
        return self.engine.supports_tools

    @property
    def kv_cache(self):
        """The wrapped engine's KV tiers (``mlx.cache.MlxKVCache``), None when off: /metrics reads them."""
        return self.engine.kv_cache

    @property
    def speculation(self):
        """The wrapped engine's speculative decoding (``mlx.spec``), None when off: /metrics reads its totals."""
        return self.engine.speculation

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        with self._tok_lock:
            return self.engine.tokenize(text, add_special=add_special, parse_special=parse_special)

    def tokenize_chat(self, messages: Sequence[Message], **kw) -> tuple[str, list[int]]:
        with self._tok_lock:
            return self.engine.tokenize_chat(messages, **kw)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.engine.detokenize(tokens)

    def is_eog(self, token: int) -> bool:
        return self.engine.is_eog(token)

    def apply_chat_template(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, template_kwargs: dict | None = None) -> str:
        return self.engine.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                               template_kwargs=template_kwargs)

    def generate(self, prompt: str | Sequence[int], params: SamplingParams, *,
                 parse_special: bool = True) -> Iterator[Chunk]:
        return self.engine.generate(prompt, params, parse_special=parse_special)

    def chat(self, messages: Sequence[Message], params: SamplingParams,
             tools: list[dict] | None = None) -> Iterator[Chunk]:
        return self.engine.chat(messages, params, tools)


class SerialEngine(EngineFront):
    """``engine`` (a ``SingleStreamEngine``) as a ``BatchEngine`` with one slot, for the server and bench.

    ``n_parallel`` is 1; ``n_vocab`` is the model's vocabulary size (tokens), ``kv_cells_used()`` the
    number of tokens in the engine's KV cache.
    """

    n_parallel = 1
    serial = True  # the server says "requests served one at a time"

    def __init__(self, engine: SingleStreamEngine) -> None:
        super().__init__(engine)
        self.slot = SerialSlot()

    def kv_cells_used(self) -> int:
        """Tokens whose KV the wrapped engine holds (its one cache)."""
        return self.engine.kv_cells_used()

    def interrupt(self) -> None:
        """Nothing to cut short: a step is one token, or one prompt's prefill, and ends on its own."""

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
        if prompt:
            # trims the engine's cache to the shared prefix now; the generator's own call is then a no-op
            cached = int(self.engine.reuse_prefix(prompt))
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
                    self.engine.reset_cache()
        if gen.slot is self.slot:
            self.slot.busy = False

    def close(self) -> None:
        self.engine.close()
