"""A scripted engine with no model, for testing the server's scheduler in milliseconds.

``ScriptedEngine`` is a ``BatchEngine`` (localrun/backends/base.py): the multi-sequence API the scheduler
drives (``acquire_slot`` / ``start`` / ``step`` / ``release``, ``kv_cells_used``, ``interrupt``) and the
``Engine`` half the server reads, so ``create_app`` serves it as it is. Everything is deterministic:

* a token is a byte: ``tokenize(text)`` = ``list(text.encode())``, ``n_vocab`` = 256;
* a generation replies with ``reply(prompt_tokens)`` (default: the prompt's text, echoed), one byte per
  ``step``; it ends with ``stop`` after the reply, or ``length`` at ``max_tokens``; ``reply`` returning
  ``None`` means "never stops by itself": it yields ``x`` tokens until ``max_tokens`` or a cancel ends it;
* a slot keeps the tokens of its last sequence (``release(keep_kv=True)``) and ``acquire_slot`` picks the
  free slot sharing the longest prefix with the prompt, as llama.cpp's slots do; ``cached_tokens`` is it.

Test controls: ``gate()`` makes every ``step`` wait for a permit (``allow(n)``, ``open()``), so a test can hold
generations mid-stream; ``fail_start`` (a predicate on the prompt text, or an exception to raise) and
``fail_next_step(exc)`` inject faults; ``log`` records ``("start", text)``, ``("step", [texts])``,
``("release", text, keep_kv)`` in order, under a lock (read it with ``events(kind)``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from localrun.backends.base import Chunk, Message, SamplingParams, Stats
from localrun.errors import BackendError

GATE_TIMEOUT_S = 30.0  # a gated step waits at most this long, then fails (a test forgot to allow it)


@dataclass(eq=False)
class FakeSlot:
    seq_id: int
    busy: bool = False
    tokens: list[int] = field(default_factory=list)  # the KV this slot holds (its last sequence)


@dataclass(eq=False)
class FakeGeneration:
    """One running sequence: ``prompt`` tokens, the scripted ``reply`` tokens (None = endless), progress."""

    slot: FakeSlot
    prompt: list[int]
    params: SamplingParams
    cached_tokens: int
    reply: list[int] | None
    t_start: float = field(default_factory=time.perf_counter)
    n_generated: int = 0
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return bytes(self.prompt).decode(errors="replace")

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class ScriptedEngine:
    """A deterministic stand-in for ``LlamaCppEngine``'s multi-sequence API (see the module docstring).

    ``n_parallel`` slots of ``n_ctx`` tokens each; ``reply(prompt_tokens) -> str | None`` scripts the answer;
    ``fail_start`` is ``None``, a predicate on the prompt text (true → ``RuntimeError``), or an exception
    instance raised for every start (``ContextOverflowError`` …)."""

    backend = "fake"
    model_path = "/nonexistent/scripted-fake.gguf"
    spec = None
    add_bos = False
    kv_cache = None  # no KV tiers
    speculation = None  # no speculative decoding
    has_chat_template = False
    supports_tools = False
    template_source = None
    n_vocab = 256
    serial = False

    def __init__(self, n_parallel: int = 1, *, n_ctx: int = 256,
                 reply: Callable[[list[int]], str | None] | None = None,
                 fail_start: Callable[[str], bool] | BaseException | None = None) -> None:
        self.n_parallel = n_parallel
        self.n_ctx = n_ctx
        self.slots = [FakeSlot(i) for i in range(n_parallel)]
        self.reply = reply or (lambda prompt: bytes(prompt).decode(errors="replace"))
        self.fail_start = fail_start
        self.log: list[tuple] = []
        self._log_lock = threading.Lock()
        self._gate = threading.Condition()
        self._permits: int | None = None  # None = ungated
        self._interrupted = False
        self._step_error: BaseException | None = None
        self.closed = False

    # ------------------------------------------------------------------ test controls (any thread)
    def gate(self) -> None:
        """From now on every ``step`` waits for a permit from ``allow``/``open``."""
        with self._gate:
            self._permits = 0

    def allow(self, n_steps: int = 1) -> None:
        with self._gate:
            self._permits = (self._permits or 0) + n_steps
            self._gate.notify_all()

    def open(self) -> None:
        """Let every step run (ungated again)."""
        with self._gate:
            self._permits = None
            self._gate.notify_all()

    def fail_next_step(self, exc: BaseException) -> None:
        """The next ``step`` raises ``exc`` (as a ``llama_decode`` failure would)."""
        self._step_error = exc

    def events(self, kind: str) -> list[tuple]:
        with self._log_lock:
            return [e[1:] for e in self.log if e[0] == kind]

    def _record(self, *event) -> None:
        with self._log_lock:
            self.log.append(event)

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return list(text.encode())

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(tokens).decode(errors="replace")

    def is_eog(self, token: int) -> bool:
        return False  # a reply ends by its script, never by a token

    def apply_chat_template(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        return "".join(f"{m.role}: {m.content}\n" for m in messages) + ("assistant: " if add_generation_prompt else "")

    def tokenize_chat(self, messages: Sequence[Message], *, tools: list[dict] | None = None,
                      add_generation_prompt: bool = True, parse_special_in_content: bool = False
                      ) -> tuple[str, list[int]]:
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        return text, self.tokenize(text)

    # ------------------------------------------------------------------ one stream (the Engine half)
    def generate(self, prompt: str | Sequence[int], params: SamplingParams, *,
                 parse_special: bool = True) -> Iterator[Chunk]:
        """The scripted reply as one stream, through the same slots (``acquire_slot``/``start``/``step``)."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        gen = self.start(tokens, params)
        try:
            while not gen.done:
                for _, chunk in self.step([gen]):
                    yield chunk
        finally:
            self.release(gen, keep_kv=gen.done)

    def chat(self, messages: Sequence[Message], params: SamplingParams,
             tools: list[dict] | None = None) -> Iterator[Chunk]:
        return self.generate(self.tokenize_chat(messages)[1], params)

    # ------------------------------------------------------------------ the scheduler's API
    def kv_cells_used(self) -> int:
        return sum(len(s.tokens) for s in self.slots)

    def acquire_slot(self, prompt: Sequence[int]) -> FakeSlot | None:
        """The free slot whose cached tokens share the longest prefix with ``prompt``; None when all are busy."""
        free = [s for s in self.slots if not s.busy]
        return max(free, key=lambda s: _common_prefix(s.tokens, prompt), default=None)

    def start(self, prompt: Sequence[int], params: SamplingParams, slot: FakeSlot | None = None) -> FakeGeneration:
        prompt = list(prompt)
        text = bytes(prompt).decode(errors="replace")
        if isinstance(self.fail_start, BaseException):
            raise self.fail_start
        if self.fail_start is not None and self.fail_start(text):
            raise RuntimeError(f"scripted start failure for {text!r}")
        slot = slot or self.acquire_slot(prompt)
        if slot is None or slot.busy:
            raise BackendError("no free sequence slot", hint="wait for a running request to finish")
        cached = min(_common_prefix(slot.tokens, prompt), len(prompt) - 1) if prompt else 0
        slot.busy, slot.tokens = True, list(prompt)
        reply = self.reply(prompt)
        self._record("start", text)
        return FakeGeneration(slot=slot, prompt=prompt, params=params or SamplingParams(), cached_tokens=cached,
                              reply=None if reply is None else list(reply.encode()))

    def step(self, gens: Sequence[FakeGeneration]) -> list[tuple[FakeGeneration, Chunk]]:
        """One token for every running generation (the reply's next byte), after the gate lets it pass."""
        self._wait_for_permit()
        if self._step_error is not None:
            exc, self._step_error = self._step_error, None
            raise exc
        self._record("step", [g.text for g in gens])
        return [(g, self._next_chunk(g)) for g in gens if not g.done]

    def release(self, gen: FakeGeneration, *, keep_kv: bool = True) -> None:
        if gen is None:
            return
        self._record("release", gen.text, keep_kv)
        gen.slot.busy = False
        if not keep_kv:
            gen.slot.tokens = []

    def interrupt(self) -> None:
        """Ends a gated ``step`` at once with KeyboardInterrupt (as llama.cpp's abort callback ends a decode)."""
        with self._gate:
            self._interrupted = True
            self._gate.notify_all()

    def close(self) -> None:
        self.closed = True

    # ------------------------------------------------------------------ internals
    def _wait_for_permit(self) -> None:
        with self._gate:
            ok = self._gate.wait_for(lambda: self._interrupted or self._permits is None or self._permits > 0,
                                     timeout=GATE_TIMEOUT_S)
            if self._interrupted:
                self._interrupted = False
                raise KeyboardInterrupt
            if not ok:
                raise TimeoutError(f"a gated step waited {GATE_TIMEOUT_S} s for allow()")
            if self._permits is not None:
                self._permits -= 1

    def _next_chunk(self, g: FakeGeneration) -> Chunk:
        i = g.n_generated
        token = g.reply[i] if g.reply is not None and i < len(g.reply) else ord("x")
        g.n_generated += 1
        g.slot.tokens.append(token)
        max_tokens = g.params.max_tokens
        if max_tokens is not None and g.n_generated >= max_tokens:
            g.finish_reason = "length"
        elif g.reply is not None and g.n_generated >= len(g.reply):
            g.finish_reason = "stop"
        stats = None
        if g.finish_reason is not None:
            stats = Stats(prompt_tokens=len(g.prompt), cached_tokens=g.cached_tokens,
                          completion_tokens=g.n_generated, n_ctx_used=len(g.slot.tokens), n_ctx=self.n_ctx)
        return Chunk(text=chr(token), token_id=token, finish_reason=g.finish_reason, stats=stats)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ------------------------------------------------------------------ the server's loader on catalog models
def catalog_plan_load(name_and_quant: Callable):
    """A ``loading.plan_load`` for files that stand for catalog models (no 30 GB file here): the real planner
    on the synthetic spec of ``name_and_quant(path)`` = (catalog name, quantization)."""
    from pathlib import Path

    from localrun.loading import Prepared
    from localrun.model.catalog import get_entry
    from localrun.model.synthetic import spec_from_entry
    from localrun.offload.search import plan_for_run

    def plan_load(path, *, hardware, n_ctx=None, n_parallel=1, kv_type=None, **_):
        name, quant = name_and_quant(Path(path))
        spec = spec_from_entry(get_entry(name), quant)
        plan = plan_for_run(spec, hardware, n_ctx=n_ctx or 8192, n_parallel=n_parallel, kv_type=kv_type)
        return Prepared(Path(path), spec, plan, hardware, "llamacpp")

    return plan_load


def scripted_loader(*args, **kw):
    """The server's ``PlannerLoader`` with the planner as it is; only the engine is scripted
    (``ScriptedEngine``, one slot, replying "ok")."""
    from localrun.server.loader import PlannerLoader

    class ScriptedLoader(PlannerLoader):
        def load(self, planned):
            eng = ScriptedEngine(1, reply=lambda p: "ok")
            eng.model_path = str(planned.path)
            return eng

    return ScriptedLoader(*args, **kw)
