"""The models one server holds: which are resident, loading on demand, residency by the planner's memory,
and Ollama's keep-alive.

``ModelRegistry`` maps a request's ``model`` field to the ``ServerState`` (engine + scheduler + metrics) of a
resident model, loading it first when needed:

* **Names** (``names.py``): anything ``localrun ls`` finds, a resident's id, its file name or ``id:latest``;
  no name (or ``default``) is the default model. A name that resolves to nothing is a 404
  (``ModelNotFoundError``), unless the server was started with a model: then it answers with that one.
* **One load per model.** Concurrent first requests for a model wait for the same load task.
* **Residency by memory** (``residency.py`` decides, the registry acts). A load is planned first
  (``Loader.plan``: the planner's VRAM and RAM bytes at the server's context and parallel slots). A model
  that cannot fit even alone is a 400 with the planner's reasons. Otherwise, if it does not fit next to the
  residents (or ``max_models`` is reached), idle residents are unloaded, least recently used first among
  those holding memory where it is short; a model that fits on any of several cards (any vendor) is planned
  onto the card of the least recently used one (``_plan_for_lru``). A GPU sharing the RAM (Apple, an APU,
  DGX Spark) is one pool with it (``Budget.shared``). A resident with a request in flight (from routing to
  the last byte of its response), or pinned, is never unloaded: the load waits until memory frees, at most
  ``load_wait_s`` (then 503 + Retry-After).
* **Keep-alive** (Ollama's semantics): after its last request a model stays ``keep_alive`` seconds (the
  request's ``keep_alive``, else the model's last one, else the server default); 0 unloads it when the
  request ends, a negative value keeps it forever. Pinned models stay until explicitly unloaded.

Every method runs on the event loop; planning, loading and closing engines run in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from localrun.errors import ModelNotFoundError
from localrun.server.body import BodyReader
from localrun.server.budget import Budget, Need, need_text
from localrun.server.errors import RequestError
from localrun.server.keepalive import DEFAULT_KEEP_ALIVE_S, FOREVER, fmt_keep_alive, request_keep_alive, request_n_ctx
from localrun.server.names import ModelNames, model_id_for
from localrun.server.residency import Lease, ModelsBusyError, Planned, Residency, Resident, path_key, plan_need
from localrun.server.runtime import ServeOptions, ServerState

log = logging.getLogger("localrun.server")

LEASES = "localrun.leases"  # the ASGI scope key holding a request's leases (set by app.py's gate)


class Loader(Protocol):
    """How the registry plans and loads (``PlannerLoader``; tests inject a fake). ``n_ctx``: the context a
    request asked for (tokens per sequence; None: the server's); ``held``: the VRAM the residents hold on
    each GPU (index → bytes), so a plan may place the model where it fits next to them."""

    def plan(self, path: str, n_ctx: int | None = None, held: dict[int, int] | None = None) -> Planned: ...

    def load(self, planned: Planned) -> Any: ...  # → an Engine


class ModelRegistry:
    """The resident models of one server (module docstring). ``loader`` None: only adopted models serve."""

    def __init__(self, settings, options: ServeOptions, metrics, *, loader: Loader | None = None,
                 budget: Budget | None = None, keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
                 keep_alive_by_model: dict[str, float] | None = None, pins: tuple[str, ...] = (),
                 load_wait_s: float = 120.0, embedder_factory=None) -> None:
        self.settings = settings
        self.options = options
        self.metrics = metrics
        self.loader = loader
        self.residency = Residency(budget or Budget())
        self.keep_alive_s = keep_alive_s
        self.keep_alive_by_model = dict(keep_alive_by_model or {})
        self.pins = set(pins)
        self.load_wait_s = load_wait_s
        self.embedder_factory = embedder_factory
        self.reader = BodyReader(options)
        self._loading: dict[str, asyncio.Future] = {}
        self._wanted: Counter[str] = Counter()  # requests waiting for a load of key to finish
        self.names = ModelNames(settings, self.residency.residents)
        self._changed: asyncio.Event | None = None
        self.close_wait_s = 10.0

    @property
    def residents(self) -> dict[str, Resident]:
        """The resident models: key (resolved path) → ``Resident`` (``residency.Residency``)."""
        return self.residency.residents

    # ------------------------------------------------------------------ start-up (before serving)
    def adopt(self, engine, *, plan=None, hardware: dict | None = None, model_id: str | None = None,
              owned: bool = False, pinned: bool = True, planned: Planned | None = None, load_s: float = 0.0,
              key: str | None = None) -> ServerState:
        """Serve an already loaded ``engine`` (``create_app(engine)``, or a start-up load). It becomes the
        default model when it is the first. Not ``owned``: the registry never closes it."""
        from localrun.backends import as_batch_engine

        engine = as_batch_engine(engine)
        opts = replace(self.options, model_id=model_id or self.options.model_id, plan=plan or self.options.plan,
                       hardware=hardware or self.options.hardware)
        key = key or path_key(engine.model_path)
        st = self._state(engine, opts)
        need = planned.need if planned is not None else plan_need(plan)
        r = Resident(key, st.model_id, st, need, planned, self._default_keep_alive(st.model_id, key),
                     pinned=pinned or self._pinned(st.model_id, key), owned=owned, load_s=load_s)
        self.residents[key] = r
        if self.names.default_key is None:
            self.names.default_key = key
        self._on_loaded(r)
        return st

    def preload(self, name: str | None, *, model_id: str | None = None, pinned: bool = False) -> ServerState:
        """Load ``name`` now, synchronously (``localrun serve MODEL``): planned, checked against the budget
        next to the models already loaded (nothing is evicted at start-up), loaded. Raises
        ModelNotFoundError, InsufficientMemoryError (it does not fit), load errors."""
        key = self.names.resolve_sync(name)
        if key in self.residents:
            return self.residents[key].state
        t0 = time.perf_counter()
        planned = self.loader.plan(key, None, self.residency.used().vram_by_gpu)
        planned.plan_s = time.perf_counter() - t0
        self.residency.check_alone(name or key, planned)
        self.residency.check_next_to(name, planned)
        engine = self.loader.load(planned)
        mid = model_id or model_id_for(name, engine.model_path)
        if model_id:  # serve --alias: the name keeps naming the model after an unload (/api/show, /api/chat)
            self.names.alias(model_id, key)
        return self.adopt(engine, plan=planned.plan, hardware=planned.hardware, model_id=mid, owned=True,
                          pinned=pinned, planned=planned, load_s=time.perf_counter() - t0, key=key)

    # ------------------------------------------------------------------ requests
    async def routed(self, request, schema, *, lenient_type: bool = False) -> tuple[ServerState, Any]:
        """The body validated as ``schema``, and the state of the model its ``model`` field names (loaded
        and leased for this request). A ``keep_alive`` field (Ollama's) or ``ttl`` (LM Studio's, seconds)
        applies when the request ends; ``options.num_ctx`` (Ollama's) asks for a context (``state_for``)."""
        req = await self.reader.parse(request, schema, lenient_type=lenient_type)
        keep = request_keep_alive(req)
        return await self.state_for(request, getattr(req, "model", None), keep_alive_s=keep,
                                    n_ctx=request_n_ctx(req)), req

    async def state_for(self, request, name: str | None, *, keep_alive_s: float | None = None,
                        n_ctx: int | None = None) -> ServerState:
        """The ``ServerState`` of the model ``name`` picks, loading it first when needed; the request holds
        it (never evicted) until its response ends (``release``). ``n_ctx`` (tokens per sequence: Ollama's
        ``num_ctx``): a resident loaded with another context is reloaded with this one, as Ollama does, once
        its requests end (this request waits, at most ``load_wait_s``; requests arriving meanwhile wait for
        the reload). Raises ModelNotFoundError, RequestError (it cannot fit even alone; a bad ``n_ctx``),
        ModelsBusyError, load errors."""
        if n_ctx is not None and n_ctx < 1:
            raise RequestError(f"'num_ctx' must be a positive number of tokens, got {n_ctx}", param="num_ctx")
        key = await self.names.resolve(name)
        self._wanted[key] += 1
        try:
            while True:
                r = self.residents.get(key)
                live = r is not None and not r.unloading
                fut = self._loading.get(key)
                if live and r.reloading and fut is not None:  # another request's reload: wait for it
                    try:
                        await asyncio.shield(fut)
                    except ModelsBusyError:
                        if self._reloadable(r, n_ctx):
                            raise  # the reload this request needs too did not happen
                    continue  # (any other context serves: the model as it was, if the reload gave up)
                if live and not self._reloadable(r, n_ctx):
                    r.refs += 1
                    r.last_used = time.monotonic()
                    r.expires_at = None
                    leases = request.scope.setdefault(LEASES, [])
                    leases.append(Lease(r, keep_alive_s))
                    return r.state
                if fut is None:
                    job = self._reload(r, name, n_ctx) if live else self._load(key, name, n_ctx)
                    fut = self._loading[key] = asyncio.ensure_future(job)
                    fut.add_done_callback(lambda f, k=key: self._loading.pop(k, None)
                                          if self._loading.get(k) is f else None)
                await asyncio.shield(fut)
        finally:
            self._wanted[key] -= 1
            if not self._wanted[key]:
                del self._wanted[key]

    def release(self, leases: list) -> None:
        """A request's response ended: its models' keep-alive clocks start (0: unload now)."""
        for lease in leases:
            r = lease.resident
            r.refs -= 1
            if lease.keep_alive_s is not None:
                r.keep_alive_s = lease.keep_alive_s
            r.last_used = time.monotonic()
            if r.refs == 0 and not r.pinned and not r.unloading:
                if r.keep_alive_s == 0:
                    asyncio.ensure_future(self._unload_when_idle(r, "keep_alive"))
                elif r.keep_alive_s != FOREVER:
                    r.expires_at = r.last_used + r.keep_alive_s
        if leases:
            self._notify()

    # ------------------------------------------------------------------ load / unload
    def _reloadable(self, r: Resident, n_ctx: int | None) -> bool:
        """A request asking ``n_ctx`` needs ``r`` reloaded: another context, and the registry can load it
        (a model handed to ``create_app`` is served as it is)."""
        return not r.serves_ctx(n_ctx) and r.owned and self.loader is not None

    async def _reload(self, r: Resident, name: str | None, n_ctx: int) -> Resident:
        """Unload ``r`` once its requests end (new ones wait for this reload), then load it with ``n_ctx``.
        Raises ModelsBusyError (still busy after ``load_wait_s``), load errors."""
        r.reloading = True
        try:
            deadline = time.monotonic() + self.load_wait_s
            while r.refs or r.state.scheduler.n_running or r.state.scheduler.n_waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ModelsBusyError(r.model_id, f"it is still serving requests at its context of "
                                          f"{r.state.engine.n_ctx} tokens (asked: {n_ctx})")
                await self._wait_change(left)
            log.info("reloading %s: a request asks n_ctx %d (it has %d)", r.model_id, n_ctx, r.state.engine.n_ctx)
            pinned, keep = r.pinned, r.keep_alive_s
            self.residency.begin_unload(r)
            await self._finish_unload(r, "reload")
        finally:
            r.reloading = False
        new = await self._load(r.key, name, n_ctx, model_id=r.model_id)  # the same name in /api/ps and metrics
        new.pinned, new.keep_alive_s = new.pinned or pinned, keep
        return new

    async def _load(self, key: str, name: str | None, n_ctx: int | None = None, *,
                    model_id: str | None = None) -> Resident:
        from starlette.concurrency import run_in_threadpool

        if self.loader is None:
            raise ModelNotFoundError(name or key, hint="this server serves only the models it was started with")
        t0 = time.perf_counter()
        planned = await run_in_threadpool(self.loader.plan, key, n_ctx, self.residency.used().vram_by_gpu)
        self.residency.check_alone(name or key, planned)
        planned = await self._plan_for_lru(key, n_ctx, planned)
        planned.plan_s = time.perf_counter() - t0
        await self._make_room(key, name or key, planned.need)
        try:
            engine = await run_in_threadpool(self.loader.load, planned)
        except BaseException:
            self.residency.reserved.pop(key, None)
            self._notify()
            raise
        load_s = time.perf_counter() - t0
        mid = model_id or model_id_for(name, engine.model_path)
        st = self.adopt(engine, plan=planned.plan, hardware=planned.hardware, model_id=mid, owned=True,
                        pinned=False, planned=planned, load_s=load_s, key=key)
        self.residency.reserved.pop(key, None)
        st.scheduler.start()
        self._notify()
        return self.residents[key]

    async def _plan_for_lru(self, key: str, n_ctx: int | None, planned: Planned) -> Planned:
        """``planned``, unless making room for it would unload a resident while a less recently used one
        stays (several cards: it would go to the card its plan alone picks): then the plan around the
        residents left once the k least recently used idle ones go (k = 1, 2, …), the first that unloads only
        those and gives as much (same context, GPU layers and KV type), so a model that fits on either card
        replaces the least recently used model, whatever its card or vendor."""
        from starlette.concurrency import run_in_threadpool

        victims = self.residency.victims(planned.need, self._idle)
        lru = self.residency.lru(self._idle)
        if not victims or victims == lru[:len(victims)]:
            return planned
        for k in range(1, len(lru)):
            gone = lru[:k]
            alt = await run_in_threadpool(self.loader.plan, key, n_ctx, self.residency.held_without(gone))
            v = self.residency.victims(alt.need, self._idle)
            if alt.fits and alt.given == planned.given and v is not None and set(v) <= set(gone):
                return alt
        return planned

    async def _make_room(self, key: str, name: str, need: Need) -> None:
        """Reserve ``need`` for ``key``, unloading idle residents (LRU first) as needed; wait (at most
        ``load_wait_s``) while busy ones hold the memory. Raises ModelsBusyError."""
        deadline = time.monotonic() + self.load_wait_s
        while True:
            victims = self.residency.victims(need, self._idle)
            if victims is not None:
                self.residency.reserved[key] = need
                for r in victims:
                    self.metrics.evictions.labels(r.model_id).inc()
                    log.info("evicting %s (idle since %.0f s) to load %s", r.model_id,
                             time.monotonic() - r.last_used, name)
                    self.residency.begin_unload(r)
                for r in victims:
                    await self._finish_unload(r, "evicted")
                return
            left = deadline - time.monotonic()
            if left <= 0:
                busy = [r.model_id for r in self.residents.values() if not self._idle(r)]
                raise ModelsBusyError(name, f"it needs {need_text(need)} and the models using the memory "
                                      f"are busy ({', '.join(busy) or 'loading'}) after {self.load_wait_s:g} s")
            await self._wait_change(left)

    def _idle(self, r: Resident) -> bool:
        sch = r.state.scheduler
        return (r.refs == 0 and not self._wanted.get(r.key) and not r.unloading and sch.n_running == 0
                and sch.n_waiting == 0)

    async def _finish_unload(self, r: Resident, reason: str) -> None:
        from starlette.concurrency import run_in_threadpool

        names = r.names()  # read before the engine closes (its model path)
        try:
            await run_in_threadpool(self._close_resident, r)
        finally:
            self.names.remember(names, r.key)
            self.residency.end_unload(r)
            self.metrics.unloads.labels(r.model_id, reason).inc()
            self.metrics.models_loaded.set(len(self.residents))
            r.state.metrics.drop_gauges()
            log.info("unloaded %s (%s)", r.model_id, reason.replace("_", "-"))
            self._notify()

    def _close_resident(self, r: Resident) -> None:
        r.state.close_wait_s = self.close_wait_s
        idle = r.state.close()
        if r.owned and idle:
            r.state.engine.close()
        elif r.owned:
            log.warning("%s: the scheduler is still inside llama_decode; its engine is left open", r.model_id)

    async def _unload_when_idle(self, r: Resident, reason: str) -> bool:
        if r.unloading or r.key not in self.residents or not self._idle(r):
            return False
        self.residency.begin_unload(r)
        await self._finish_unload(r, reason)
        return True

    async def unload(self, name: str) -> bool:
        """Unload the resident ``name`` names (``/api/generate`` with ``keep_alive: 0``, ``localrun stop``),
        waiting for its requests to end (at most ``load_wait_s``). → False when it is not loaded."""
        key = self.names.known(name)
        if key is None:
            try:
                from starlette.concurrency import run_in_threadpool

                key = await run_in_threadpool(self.names.resolve_sync, name)
            except ModelNotFoundError:
                return False
        r = self.residents.get(key)
        if r is None:
            return False
        r.keep_alive_s = 0
        deadline = time.monotonic() + self.load_wait_s
        while not self._idle(r):
            if r.unloading or key not in self.residents:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                raise ModelsBusyError(r.model_id, "it is still serving requests")
            await self._wait_change(min(left, 0.25))
        return await self._unload_when_idle(r, "request")

    async def reap(self, period_s: float = 0.5) -> None:
        """Unload the idle residents whose keep-alive ran out, forever (the app's lifespan runs it). It first
        starts the worker thread pool, so the first load does not pay for anyio's lazy imports and a thread
        start (~0.1 s on a loaded 2-core CPU)."""
        from starlette.concurrency import run_in_threadpool

        await run_in_threadpool(lambda: None)
        while True:
            now = time.monotonic()
            for r in list(self.residents.values()):
                if (r.expires_at is not None and now >= r.expires_at and not r.pinned
                        and r.keep_alive_s != FOREVER and self._idle(r)):
                    await self._unload_when_idle(r, "expired")
            await asyncio.sleep(period_s)

    # ------------------------------------------------------------------ shutdown
    def start(self) -> None:
        for r in self.residents.values():
            r.state.scheduler.start()

    def shutdown(self) -> None:
        """SIGINT/SIGTERM: end every request of every model now (see ``ServerState.shutdown``)."""
        for r in list(self.residents.values()):
            r.state.shutdown()

    def close(self) -> bool:
        """Stop every scheduler; close the engines the registry loaded when their scheduler is idle.
        → True when every scheduler is idle."""
        ok = True
        for r in list(self.residents.values()):
            r.state.close_wait_s = self.close_wait_s
            idle = r.state.close()
            ok = ok and idle
            if idle and r.owned:
                r.state.engine.close()
        return ok

    @property
    def idle(self) -> bool:
        return all(r.state.scheduler.idle for r in self.residents.values())

    # ------------------------------------------------------------------ views
    @property
    def default_state(self) -> ServerState | None:
        r = self.residents.get(self.names.default_key or "")
        return r.state if r is not None else None

    def busy(self, r: Resident) -> bool:
        return not self._idle(r)

    # ------------------------------------------------------------------ helpers
    def _state(self, engine, opts: ServeOptions) -> ServerState:
        factory = self.embedder_factory
        if factory is None and engine.backend in ("llamacpp", "mlx"):
            from localrun.backends import embedder_for

            factory = embedder_for
        elif factory is None:
            factory = no_embeddings
        mid = opts.model_id or Path(engine.model_path).name.removesuffix(".gguf")
        view = self.metrics.for_model(mid, engine.n_parallel, engine.n_ctx * engine.n_parallel)
        view.watch_kv_cache(engine.kv_cache)  # --cache-ram/--cache-dir (both engines; None = no tiers)
        view.watch_speculation(engine)  # serve --spec: drafted / accepted tokens in /metrics
        return ServerState(engine, self.settings, replace(opts, model_id=mid), view, factory, reader=self.reader)

    def _on_loaded(self, r: Resident) -> None:
        m = self.metrics
        m.loads.labels(r.model_id).inc()
        m.load_seconds.labels(r.model_id).observe(r.load_s)
        m.resident_bytes.labels(r.model_id, "vram").set(r.need.vram_bytes)
        m.resident_bytes.labels(r.model_id, "ram").set(r.need.ram_bytes)
        m.models_loaded.set(len(self.residents))
        ag = r.asked_given()
        extra = f"; asked {ag['asked']}, given {ag['given']} ({'; '.join(ag['reasons'][:3])})" if ag else ""
        plan_s = r.planned.plan_s if r.planned is not None else 0.0
        log.info("loaded %s in %.3f s (plan %.3f s; %s RAM, %s VRAM by the plan, keep-alive %s%s)%s", r.model_id,
                 r.load_s, plan_s, _fmt(r.need.ram_bytes), _fmt(r.need.vram_bytes), fmt_keep_alive(r.keep_alive_s),
                 ", pinned" if r.pinned else "", extra)

    def _default_keep_alive(self, model_id: str, key: str) -> float:
        for name in (model_id, key, Path(key).name, Path(key).stem):
            if name in self.keep_alive_by_model:
                return self.keep_alive_by_model[name]
        return self.keep_alive_s

    def _pinned(self, model_id: str, key: str) -> bool:
        return bool(self.pins & {model_id, key, Path(key).name, Path(key).stem})

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
        self._changed = None

    async def _wait_change(self, timeout_s: float) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        try:
            await asyncio.wait_for(self._changed.wait(), min(timeout_s, 1.0))
        except asyncio.TimeoutError:
            pass


def no_embeddings(engine):
    """/v1/embeddings on a backend without an embedding context: a 501 that says what to do."""
    raise RequestError(f"embeddings need the llama.cpp backend (this server runs {engine.backend})",
                       code="unsupported", status=501,
                       hint="start the server with `localrun serve --backend llamacpp` for /v1/embeddings")


def _fmt(n: int) -> str:
    from localrun.units import fmt_bytes

    return fmt_bytes(n)
