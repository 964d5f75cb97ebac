"""Continuous batching: ONE thread owns the engine and runs every request through it.

Requests (``Job``) wait in a bounded queue. ``submit`` counts the engine's free slots as room, so with
``n_parallel`` slots and ``max_queue`` waiting places exactly ``n_parallel + max_queue`` requests are
accepted at once (``QueueFullError`` → 503 past that), however far the loop lags behind. Each loop
iteration the scheduler

1. frees the slots of cancelled requests at once (``release(keep_kv=False)``: a client that went away),
2. runs queued engine calls (embeddings) between decode steps,
3. admits waiting requests into free slots — ``engine.acquire_slot`` picks the free slot whose cached
   tokens share the longest prefix with the prompt (prefix caching) and ``engine.start`` reuses it,
4. calls ``engine.step(running)``: one ``llama_decode`` that decodes a token for every running sequence and
   prefills chunks of new prompts (llama.cpp tools/server ``update_slots`` does the same),
5. hands each chunk to its request's asyncio queue (``loop.call_soon_threadsafe``) and releases finished
   sequences with ``keep_kv=True`` so their KV stays as prefix cache.

Gauges (active sequences, queue depth) are set BEFORE the event that ends a request is handed over, so a
client that reads ``/metrics`` right after its answer sees its own sequence gone.

``shutdown()`` (SIGINT/SIGTERM) ends every queued and running request at once with ``ShuttingDownError``
and stops the thread between two ``llama_decode`` calls; ``stop()`` also waits for it.

Events on a job's queue: ``("admitted", cached_tokens)``, ``("chunk", Chunk)`` (the last has
``finish_reason``), ``("error", LocalrunError)``, ``("result", value)`` for engine calls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from localrun.backends.base import BatchEngine, Chunk, Generation, SamplingParams
from localrun.errors import BackendError, LocalrunError
from localrun.server.errors import QueueFullError, ShuttingDownError

log = logging.getLogger("localrun.server")


@dataclass(eq=False)
class Job:
    """One request for the engine: a generation (``tokens``, ``params``) or a call (``fn(engine)``)."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    tokens: list[int] = field(default_factory=list)
    params: SamplingParams | None = None
    fn: Callable[[Any], Any] | None = None
    t_arrival: float = field(default_factory=time.perf_counter)
    t_last: float = 0.0
    token_count: int = 0  # tokens delivered
    cancelled: bool = False
    finished: bool = False
    gen: Generation | None = None  # the engine's Generation once admitted

    def push(self, kind: str, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed (server shutting down)
            pass


class Scheduler:
    """Owns ``engine`` (a ``BatchEngine``, not thread-safe) on one thread; ``submit``/``cancel``/``shutdown``
    may be called from any thread (``shutdown`` from a signal handler too: the lock is re-entrant).

    ``metrics`` is a ``server.metrics.ServerMetrics`` (gauges, counters and histograms it updates)."""

    def __init__(self, engine: BatchEngine, metrics, *, max_queue: int = 64) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self.n_slots = int(engine.n_parallel)
        self._cond = threading.Condition(threading.RLock())
        self._pending: deque[Job] = deque()
        self._calls: deque[Job] = deque()
        self._running: list[Job] = []
        self._n_taken = 0  # slots held by admitted generations (changed under the lock)
        self._in_step = False  # inside engine.step (set under the lock, so shutdown interrupts only a real step)
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public API (any thread)
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="localrun-scheduler", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        """End every request now (``ShuttingDownError`` on its queue) and make the thread stop after the
        ``llama_decode`` in progress. Idempotent; returns at once."""
        with self._cond:
            self._stop = True
            jobs = list(self._pending) + list(self._calls) + list(self._running)
            self._pending.clear()
            self._calls.clear()
            self.metrics.queue_depth.set(0)
            self._cond.notify_all()
            if self._in_step:  # a prefill llama_decode returns between graph nodes (llama_set_abort_callback)
                self.engine.interrupt()
        for job in jobs:
            if not job.finished:
                job.cancelled = True
                job.push("error", ShuttingDownError())

    def stop(self, timeout_s: float = 10.0) -> bool:
        """``shutdown()``, then wait up to ``timeout_s`` for the thread. → True when it has ended (the
        engine is free to close); False while it is still inside a ``llama_decode``."""
        self.shutdown()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True

    def submit(self, job: Job) -> None:
        """Queue ``job``. Raises QueueFullError when, after filling the free slots, ``max_queue`` requests
        would be waiting; ShuttingDownError after ``shutdown()``."""
        with self._cond:
            if self._stop:
                raise ShuttingDownError()
            free = self.n_slots - self._n_taken
            if max(0, len(self._pending) - free) + len(self._calls) >= self.max_queue:
                raise QueueFullError(self.max_queue)
            (self._calls if job.fn is not None else self._pending).append(job)
            self._set_queue_depth()
            self._cond.notify_all()

    def cancel(self, job: Job) -> None:
        """The client went away: drop ``job`` from the queue, or free its sequence on the next iteration."""
        if job.finished:
            return
        job.cancelled = True
        with self._cond:
            try:
                self._pending.remove(job)
            except ValueError:
                pass
            self._set_queue_depth()
            self._cond.notify_all()

    @property
    def idle(self) -> bool:
        """Whether no thread drives the engine (never started, or stopped): the engine may be closed."""
        return self._thread is None or not self._thread.is_alive()

    @property
    def n_running(self) -> int:
        return len(self._running)

    @property
    def n_waiting(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ the loop (scheduler thread)
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._pending and not self._calls and not self._running:
                    self._cond.wait()
                if self._stop:
                    break
            try:
                self._iteration()
            except KeyboardInterrupt:  # engine.interrupt() from shutdown() cut a prefill short
                if self._stop:
                    break
            except Exception as e:  # never let the thread die: fail what is running, keep serving
                log.exception("scheduler iteration failed")
                err = e if isinstance(e, LocalrunError) else BackendError(f"internal error: {e}")
                for job in list(self._running):
                    self._fail(job, err)
        for job in list(self._running):
            self._fail(job, ShuttingDownError())

    def _iteration(self) -> None:
        eng, m = self.engine, self.metrics
        for job in [j for j in self._running if j.cancelled]:
            self._release(job, keep_kv=False)
            m.generations.labels("cancelled").inc()
        self._run_calls()
        self._admit()
        if self._running:
            self._step()
        m.kv_cells_used.set(eng.kv_cells_used())

    def _step(self) -> None:
        """One ``engine.step`` for the running jobs, its chunks delivered; nothing after ``shutdown()``."""
        with self._cond:
            if self._stop:  # a shutdown stops between two decodes
                return
            self._in_step = True
        try:
            gens = {id(j.gen): j for j in self._running}
            events = self.engine.step([j.gen for j in self._running])
        finally:
            with self._cond:
                self._in_step = False
        now = time.perf_counter()
        for gen, chunk in events:
            self._deliver(gens[id(gen)], chunk, now)

    def _release(self, job: Job, *, keep_kv: bool) -> None:
        """Free ``job``'s sequence and update the gauges (before anything is handed to the client)."""
        self.engine.release(job.gen, keep_kv=keep_kv)
        with self._cond:
            if job in self._running:
                self._running.remove(job)
                self._n_taken -= 1
            job.finished = True
            self.metrics.active.set(len(self._running))
            self._set_queue_depth()

    def _set_queue_depth(self) -> None:
        with self._cond:
            self.metrics.queue_depth.set(len(self._pending))

    def _run_calls(self) -> None:
        while True:
            with self._cond:
                if not self._calls or self._stop:
                    return
                job = self._calls.popleft()
            try:
                job.push("result", job.fn(self.engine))
            except LocalrunError as e:
                job.push("error", e)
            except Exception as e:
                log.exception("engine call failed")
                job.push("error", BackendError(f"internal error: {e}"))
            job.finished = True

    def _admit(self) -> None:
        eng = self.engine
        while True:
            with self._cond:
                if not self._pending or self._stop:
                    break
                slot = eng.acquire_slot(self._pending[0].tokens)
                if slot is None:
                    break
                job = self._pending.popleft()
                if job.cancelled:
                    continue
                self._n_taken += 1
            try:
                job.gen = eng.start(job.tokens, job.params, slot)
            except Exception as e:  # a bad request must not take the loop (or other requests) down
                if not isinstance(e, LocalrunError):
                    log.exception("engine.start failed")
                    e = BackendError(f"internal error starting the generation: {type(e).__name__}: {e}")
                with self._cond:
                    self._n_taken -= 1
                    self._set_queue_depth()
                job.finished = True
                job.push("error", e)
                continue
            with self._cond:
                self._running.append(job)
                self.metrics.active.set(len(self._running))
                self._set_queue_depth()
            self.metrics.on_admitted(len(job.gen.prompt), job.gen.cached_tokens)
            job.push("admitted", job.gen.cached_tokens)

    def _deliver(self, job: Job, chunk: Chunk, now: float) -> None:
        m = self.metrics
        if job.token_count == 0:
            m.ttft.observe(now - job.t_arrival)
        else:
            m.itl.observe(now - job.t_last)
        job.t_last = now
        job.token_count += 1
        m.generated_tokens.inc()
        if chunk.finish_reason is not None:
            self._release(job, keep_kv=True)
            m.generations.labels(chunk.finish_reason).inc()
            m.kv_cells_used.set(self.engine.kv_cells_used())
        if not job.cancelled:
            job.push("chunk", chunk)

    def _fail(self, job: Job, err: LocalrunError) -> None:
        try:
            self._release(job, keep_kv=False)
        except Exception:  # pragma: no cover - best effort
            job.finished = True
        job.push("error", err)
