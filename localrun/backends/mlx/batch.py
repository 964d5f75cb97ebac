"""``MlxBatchEngine``: continuous batching on MLX (docs/architecture.md §1, "MLX batching").

An ``MlxEngine`` (one model, its tokenizer, sampler pieces and KV tiers) as a ``BatchEngine`` with
``n_parallel`` slots, driven by the server's scheduler like llama.cpp's engine
(``acquire_slot`` → ``start`` → ``step`` … → ``release``). The forward passes are written here on mlx-lm's
own batched caches (``mlx_lm/models/cache.py``: ``BatchKVCache``, ``BatchRotatingKVCache``), not through
``mlx_lm.generate.BatchGenerator``, whose step samples every row before the caller can force a token or
mask a row (token control, ``backends/control.py``) and keeps one history for its processors.

* **Slots.** A slot holds the tokens whose KV it keeps, in mlx-lm's single-sequence caches while it is
  out of the batch (free, or prefilling). ``acquire_slot`` takes the free slot sharing the longest prefix
  with the prompt; ``start`` trims it to that common prefix (``MlxEngine.reuse_prefix``, which also runs
  the KV tiers' ``admit``: the slot's tokens are saved before the prompt cuts them, and a snapshot that
  covers more of the prompt is restored), so a new request reuses the longest prefix cached in any free
  row.
* **Prefill** runs on the slot's own cache, ONE prompt per step, in the same ``n_batch`` chunks as
  ``MlxEngine.feed`` (so a prompt's arithmetic is the one of a solo run), up to its last token.
* **Decode.** A prompt whose prefix is in its cache joins the batch: its caches become one row of the
  batched caches (``merge`` → ``extend``, rows right-aligned with left padding; the attention mask hides
  the padding and each row's RoPE offset is its own). One decode step is ONE forward pass of ``[B, 1]``
  tokens: each row's pending token (for a newly joined row, its prompt's last token, whose logits give
  its first token). Then each row's token is chosen from its logits row as ``MlxEngine`` does: its own
  logits processors on its own history (bias, penalties, DRY), its token control (forced tokens, mask),
  its own sampler and seeded key, logprobs, its own ``TextStream`` (stop strings, ``max_tokens``).
* Prefill and decode steps alternate while both wait (as on llama.cpp), so a long prompt is prefilled in
  chunks and running streams keep flowing.
* **Leaving.** A row that finishes (or is released: a cancelled request) leaves the batch at once
  (``filter``), its KV extracted back into its slot's cache as prefix cache (``keep_kv``) or dropped.

Exactness: greedy output of a row equals its solo output on SmolLM2 (tests/test_mlx_batch.py). Not
batched (``backends.as_batch_engine`` keeps ``SerialEngine``): an engine planned for one sequence,
models whose caches have no ``merge``
(mlx-lm's ``QuantizedKVCache``, ``ConcatenateKVCache``, ``ChunkedKVCache``), and an engine with
speculative decoding (prompt lookup or a draft model verify several tokens per row, which mlx-lm's
batched caches cannot cut back per row: ``BatchKVCache.trim`` trims every row alike).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Sequence

from localrun.backends.base import Chunk, SamplingParams, Stats
from localrun.backends.control import build_control
from localrun.backends.serial import EngineFront
from localrun.backends.text import TextStream, common_prefix
from localrun.errors import BackendError, BackendUnavailableError, ContextOverflowError, LocalrunError


def can_batch(engine) -> bool:
    """Whether ``engine`` (an ``MlxEngine``) can run in ``MlxBatchEngine``: every cache layer of its model
    merges into a batched cache (mlx-lm server's own test), and no speculative decoding is set."""
    from mlx_lm.models.cache import make_prompt_cache

    if getattr(engine, "speculation", None) is not None:
        return False
    return all(hasattr(c, "merge") for c in make_prompt_cache(engine.model))


@dataclass(eq=False)
class MlxSlot:
    """One sequence slot. ``tokens``: exactly the tokens whose KV it holds (in ``cache`` while out of the
    batch; in its batch row while its generation decodes). ``cache``: mlx-lm per-layer caches, or None."""

    index: int
    tokens: list[int] = field(default_factory=list)
    cache: list | None = None
    busy: bool = False
    last_used: float = 0.0


@dataclass(eq=False)
class MlxGeneration:
    """A request on a slot: prompt, sampling state (sampler, processors, key, token control), text stream,
    output and timings. ``pending``: the token fed in the next decode step (the prompt's last token at
    first); ``in_batch``: it holds a row of the batched caches."""

    slot: MlxSlot
    prompt: list[int]
    params: SamplingParams
    cached_tokens: int
    t_start: float
    stream: TextStream
    sampler: object
    procs: list
    key: object  # mx.random key, split once per sampled token
    control: object | None = None
    pending: int | None = None
    in_batch: bool = False
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    t_first: float = 0.0
    t_prefill_done: float = 0.0
    last_prefill: int = -1

    def __repr__(self) -> str:  # never the mx arrays: printing one evaluates it, on the caller's thread
        return (f"MlxGeneration(slot={self.slot.index}, prompt={len(self.prompt)} tokens, "
                f"generated={len(self.generated)}, finish_reason={self.finish_reason!r})")

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        """The prompt's tokens before the last are not all in the slot's cache yet."""
        return len(self.slot.tokens) < len(self.prompt) - 1

    def stats(self, n_ctx: int) -> Stats:
        now = time.perf_counter()
        return Stats(prompt_tokens=len(self.prompt), cached_tokens=self.cached_tokens,
                     completion_tokens=len(self.generated), ttft_s=(self.t_first or now) - self.t_start,
                     prefill_s=(self.t_prefill_done or now) - self.t_start,
                     decode_s=max(0.0, now - (self.t_first or now)), n_ctx_used=len(self.slot.tokens), n_ctx=n_ctx)


class MlxBatchEngine(EngineFront):
    """``engine`` (an ``MlxEngine``) as a ``BatchEngine`` with ``n_parallel`` slots (the module docstring).
    ``kv_cells_used()``: tokens held over all slots. Raises what ``MlxEngine`` raises."""

    serial = False

    def __init__(self, engine, n_parallel: int | None = None) -> None:
        super().__init__(engine)
        self.mx = engine.mx
        n = n_parallel or int(getattr(engine.plan, "n_parallel", 1) or 1)
        self.n_parallel = max(1, int(n))
        self.slots = [MlxSlot(i) for i in range(self.n_parallel)]
        self.rows: list[MlxGeneration] = []  # generations in the batched caches, in row order
        self.batch_cache: list | None = None  # mlx-lm batched per-layer caches, None while no row decodes
        self._prefill_turn = False
        self._steps = 0
        self._interrupted = False

    # ------------------------------------------------------------------ slots
    def kv_cells_used(self) -> int:
        return sum(len(s.tokens) for s in self.slots)

    def interrupt(self) -> None:
        """From any thread: the prefill step in progress raises KeyboardInterrupt once its chunk is in the
        cache (a chunk is the smallest piece of work MLX can stop at; decode steps are not cut)."""
        self._interrupted = True

    def acquire_slot(self, prompt: Sequence[int]) -> MlxSlot | None:
        """The free slot whose tokens share the longest prefix with ``prompt`` (then the least recently
        used), or None when every slot is busy."""
        free = [s for s in self.slots if not s.busy]
        if not free:
            return None
        prompt = list(prompt)
        return max(free, key=lambda s: (common_prefix(s.tokens, prompt), -s.last_used))

    def start(self, prompt: Sequence[int], params: SamplingParams, slot: MlxSlot | None = None) -> MlxGeneration:
        """Take ``slot`` for ``prompt``: trim its cache to the common prefix (KV tiers: ``admit``); no model
        work yet. Raises ContextOverflowError, LocalrunError (a token id outside the vocabulary),
        BackendUnavailableError (a GBNF grammar: llama.cpp only), BackendError (no free slot)."""
        eng, mx = self.engine, self.mx
        tokens = list(prompt) or ([eng.bos_id] if eng.bos_id is not None else eng.tokenize(" ", add_special=False))
        if len(tokens) >= eng.n_ctx:
            raise ContextOverflowError(len(tokens), eng.n_ctx)
        if any(not 0 <= t < eng.n_vocab for t in tokens):
            raise LocalrunError(f"a prompt token id is outside the vocabulary (0..{eng.n_vocab - 1})")
        if params.grammar:
            raise BackendUnavailableError("GBNF grammars are supported by the llama.cpp backend only",
                                          hint="use --backend llamacpp for grammar-constrained output")
        ctl = build_control(eng, params)
        slot = slot or self.acquire_slot(tokens)
        if slot is None or slot.busy:
            raise BackendError("no free sequence slot", hint="wait for a running request to finish")
        eng.set_prompt_cache(slot.cache, slot.tokens)  # the engine's one cache is this slot's, for a moment
        try:
            n_keep = eng.reuse_prefix(tokens)  # trims (or rebuilds) it; KV tiers save/restore
            slot.cache, slot.tokens = eng.prompt_cache, eng.cached_tokens
        finally:
            eng.set_prompt_cache(None, [])
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little")
        slot.busy = True
        return MlxGeneration(slot=slot, prompt=tokens, params=params, cached_tokens=n_keep, t_start=time.perf_counter(),
                             stream=TextStream(params, eng.n_ctx), sampler=eng.make_sampler(params),
                             procs=eng.make_processors(params), key=mx.random.key(int(seed) & 0xFFFFFFFF),
                             control=ctl, pending=tokens[-1])

    def release(self, gen: MlxGeneration, *, keep_kv: bool = True) -> None:
        """Free ``gen``'s slot; a row still in the batch leaves it now. ``keep_kv=False`` drops its KV."""
        if gen is None:
            return
        if gen.in_batch:
            self._leave(gen, keep_kv=keep_kv)
        slot = gen.slot
        if not keep_kv:
            slot.cache, slot.tokens = None, []
        slot.busy, slot.last_used = False, time.perf_counter()

    # ------------------------------------------------------------------ the batch
    def _join(self, gen: MlxGeneration) -> None:
        """``gen``'s slot caches become the last row of the batched caches."""
        from mlx_lm.models.cache import make_prompt_cache

        slot = gen.slot
        single = slot.cache if slot.cache is not None else make_prompt_cache(self.engine.model)
        rows = [type(c).merge([c]) for c in single]
        if self.batch_cache is None:
            self.batch_cache = rows
        else:
            for bc, rc in zip(self.batch_cache, rows):
                bc.extend(rc)
        slot.cache = None
        gen.in_batch = True
        self.rows.append(gen)

    def _leave(self, gen: MlxGeneration, *, keep_kv: bool) -> None:
        """Take ``gen``'s row out of the batch (its KV back into its slot's cache when ``keep_kv``)."""
        i = self.rows.index(gen)
        if keep_kv and gen.slot.tokens:
            gen.slot.cache = [c.extract(i) for c in self.batch_cache]
        else:
            gen.slot.cache, gen.slot.tokens = None, []
        keep = [j for j in range(len(self.rows)) if j != i]
        del self.rows[i]
        gen.in_batch = False
        if not keep:
            self.batch_cache = None
        else:
            for c in self.batch_cache:
                c.filter(keep)

    # ------------------------------------------------------------------ step
    def step(self, gens: Sequence[MlxGeneration]) -> list[tuple[MlxGeneration, Chunk]]:
        """One forward pass: the next ``n_batch`` chunk of ONE prompt still prefilling (round-robin, no
        chunks out), or one decode token for every row of the batch (one chunk each; a finished row leaves
        the batch). They alternate while both wait. Raises BackendError (an MLX failure: the rows are
        dropped), KeyboardInterrupt (``interrupt()`` during a prefill step; the slot stays consistent)."""
        self._interrupted = False  # interrupt() cuts the step in progress only
        for g in gens:
            if not g.done and not g.in_batch and not g.prefilling:
                self._join(g)
        waiting = [g for g in gens if not g.done and not g.in_batch and g.prefilling]
        try:
            if waiting and (not self.rows or self._prefill_turn):
                self._prefill_turn = False
                self._prefill(min(waiting, key=lambda w: (w.last_prefill, w.t_start)))
                return []
            self._prefill_turn = True
            return self._decode() if self.rows else []
        except (RuntimeError, ValueError) as e:  # MLX errors (out of memory, shape) come as these
            for g in list(self.rows):
                self._leave(g, keep_kv=False)
            raise BackendError(f"MLX generation failed: {e}", hint="lower --parallel or --ctx") from None

    def _prefill(self, g: MlxGeneration) -> None:
        """Feed the next chunk of ``g``'s prompt (before its last token) into its slot's cache, in
        ``MlxEngine.feed``'s chunks; join the batch once only the last token is left."""
        from mlx_lm.models.cache import make_prompt_cache

        mx, eng, slot = self.mx, self.engine, g.slot
        self._steps += 1
        g.last_prefill = self._steps
        if slot.cache is None:
            slot.cache, slot.tokens = make_prompt_cache(eng.model), []
        n0 = len(slot.tokens)
        chunk = g.prompt[n0:min(n0 + eng.n_batch, len(g.prompt) - 1)]
        eng.model(mx.array(chunk)[None], cache=slot.cache)
        mx.eval([c.state for c in slot.cache])
        slot.tokens.extend(chunk)
        if self._interrupted:
            self._interrupted = False
            raise KeyboardInterrupt
        if not g.prefilling:
            self._join(g)

    def _decode(self) -> list[tuple[MlxGeneration, Chunk]]:
        mx, eng = self.mx, self.engine
        rows = list(self.rows)
        inputs = mx.array([[g.pending] for g in rows])
        logits = eng.model(inputs, cache=self.batch_cache)[:, -1, :]
        mx.async_eval(logits)  # the forward pass runs while token controls work out their masks
        for g in rows:
            g.slot.tokens.append(g.pending)
        picks = [self._pick(g, logits[i:i + 1]) for i, g in enumerate(rows)]
        mx.eval([y for y, _ in picks])
        now = time.perf_counter()
        events, finished = [], []
        for g, (y, lp) in zip(rows, picks):
            chunk = self._emit(g, int(y.item()), lp, now)
            events.append((g, chunk))
            if g.done:
                finished.append(g)
        for g in finished:  # the last token is never fed: the slot holds prompt + output[:-1]
            self._leave(g, keep_kv=True)
        return events

    def _pick(self, g: MlxGeneration, logits):
        """Sample ``g``'s token from its logits row [1, vocab] → (token [1], the model's logprobs [1, vocab]),
        as ``MlxEngine``'s ``pick``: processors on the row's history, forced token, mask, sampler, key."""
        mx = self.mx
        logprobs = raw = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if g.procs:
            hist = mx.array(g.slot.tokens)
            for proc in g.procs:
                logits = proc(hist, logits)
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        ctl = g.control
        if ctl is not None:
            forced = ctl.forced()
            if forced is not None:
                return mx.array([forced]), raw
            allowed = ctl.mask()
            if allowed is not None:
                logprobs = mx.where(mx.array(allowed[: logprobs.shape[-1]])[None], logprobs, mx.array(float("-inf")))
        g.key, sub = mx.random.split(g.key)
        return g.sampler(logprobs, sub), raw

    def _emit(self, g: MlxGeneration, tok: int, lp, now: float) -> Chunk:
        """``tok`` through ``g``'s text stream and token control → its chunk (``finish_reason`` on the last)."""
        eng, p = self.engine, g.params
        if not g.generated:
            g.t_first = g.t_prefill_done = now
        g.generated.append(tok)
        eog = eng.is_eog(tok)
        tlp = eng.token_logprob(tok, lp, p.logprobs) if p.logprobs is not None and not eog else None
        out, finish = g.stream.push(tok, b"" if eog else eng.token_bytes(tok, p.render_special), eog=eog,
                                    n_ctx_used=len(g.slot.tokens))
        if g.control is not None:
            g.control.accept(tok)
            if finish is None and g.control.complete():
                rest, finish = g.stream.finish("stop")
                out += rest
        g.pending = tok
        if finish is not None:
            g.finish_reason = finish
            return Chunk(text=out, token_id=tok, finish_reason=finish, stats=g.stats(eng.n_ctx),
                         logprobs=[tlp] if tlp else None)
        return Chunk(text=out, token_id=tok, logprobs=[tlp] if tlp else None)

    def close(self) -> None:
        """Save every slot's KV to the KV tiers (when attached), then close the engine."""
        eng = self.engine
        for g in list(self.rows):
            self._leave(g, keep_kv=True)
        if eng.kv_cache is not None:
            for s in self.slots:
                if s.cache is not None and s.tokens:
                    eng.set_prompt_cache(s.cache, s.tokens)
                    eng.kv_cache.save(eng, None)
            eng.set_prompt_cache(None, [])
        for s in self.slots:
            s.cache, s.tokens = None, []
        self.batch_cache = None
        eng.close()
