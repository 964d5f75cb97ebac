"""Residency by memory: which models are in memory, what memory they hold, and what makes room for another.

A load is planned first (``Loader.plan`` → ``Planned``: the planner's VRAM and RAM bytes at the server's
context and parallel slots). ``Residency`` keeps the ledger against the server's ``Budget``: the residents'
``Need``s, plus the loads reserved and the unloads still closing their engines (their memory counts until
the engine is closed). Its decisions:

* ``check_alone``: a model that cannot fit even alone is a 400 with the planner's reasons;
* ``check_next_to``: at start-up a model must fit next to the models loaded before it (nothing is evicted);
* ``victims``: when a model does not fit next to the residents (or ``max_models`` is reached), the idle
  residents to unload, least recently used first among those holding memory where the budget is short (a
  model on another card stays). A resident with a request in flight, or pinned, is never a
  victim (the caller says which are idle: ``ModelRegistry`` knows the requests); when only busy ones hold
  the memory there is no answer yet, and the load waits (``ModelsBusyError`` past ``load_wait_s``).

Pure bookkeeping: no I/O, no engine calls; ``ModelRegistry`` (models.py) acts on the answers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from localrun.errors import InsufficientMemoryError, LocalrunError
from localrun.server.budget import Budget, Need, budget_text, need_text, vram_by_device
from localrun.server.errors import QueueFullError, RequestError
from localrun.server.runtime import ServerState


class ModelsBusyError(QueueFullError):
    """A model cannot load before ``load_wait_s``: the memory it needs is held by models serving requests
    (503 with Retry-After)."""

    def __init__(self, name: str, why: str, retry_after_s: int = 5) -> None:
        LocalrunError.__init__(self, f"cannot load {name} now: {why}",
                               hint="retry later; the models holding the memory are serving requests")
        self.retry_after_s = retry_after_s


@dataclass
class Planned:
    """A model planned for loading (``Loader.plan``). ``fits``/``reasons``: the planner's verdict alone in the
    budget; ``asked``/``given``: the configuration asked for and the one planned (shown when they differ)."""

    path: str
    need: Need
    plan: Any = None
    fits: bool = True
    reasons: list[str] = field(default_factory=list)
    asked: dict = field(default_factory=dict)
    given: dict = field(default_factory=dict)
    hardware: dict | None = None
    prepared: Any = None  # the loader's own (loading.Prepared)
    plan_s: float = 0.0  # seconds spent planning (resolve excluded): the log's share of a cold start


@dataclass(eq=False)
class Resident:
    """A model in memory, or being unloaded."""

    key: str  # the resolved path: one resident per file
    model_id: str
    state: ServerState
    need: Need
    planned: Planned | None
    keep_alive_s: float
    pinned: bool = False
    owned: bool = True  # False: the engine was handed to create_app; its owner closes it
    refs: int = 0  # requests holding it (routed, not yet answered)
    last_used: float = field(default_factory=time.monotonic)
    expires_at: float | None = None  # monotonic; None: never (or in use)
    load_s: float = 0.0
    loaded_at: float = field(default_factory=time.time)
    unloading: bool = False
    reloading: bool = False  # a request asked another context: new requests wait for the reload

    def names(self) -> set[str]:
        path = self.state.engine.model_path.rstrip("/")
        base = Path(path).name
        return {self.model_id, f"{self.model_id}:latest", base, base.removesuffix(".gguf"), path, self.key}

    def serves_ctx(self, n_ctx: int | None) -> bool:
        """Whether a request asking ``n_ctx`` tokens of context (Ollama's ``options.num_ctx``; None: any) is
        served by this resident as loaded: it is what the load asked for, or what the engine has. A model
        loaded with less than asked (the planner's cut) is not reloaded for the same ask again."""
        if n_ctx is None:
            return True
        asked = self.planned.asked.get("n_ctx") if self.planned is not None else None
        return n_ctx in (asked, self.state.engine.n_ctx)

    def asked_given(self) -> dict | None:
        """{"asked", "given", "reasons"} when the plan gives less than asked, else None."""
        p = self.planned
        if p is None or not p.asked or p.asked == p.given:
            return None
        return {"asked": p.asked, "given": p.given, "reasons": p.reasons}


@dataclass(eq=False)
class Lease:
    """A request's hold on ``resident`` (``ModelRegistry.state_for`` until ``release``); ``keep_alive_s`` the
    request's own keep-alive (None: the model's)."""

    resident: Resident
    keep_alive_s: float | None


class Residency:
    """The residents (key → ``Resident``) and the memory they hold against ``budget``, with the loads
    reserved (key → ``Need``) and the unloads in flight (their ``Need`` until their engine is closed)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.residents: dict[str, Resident] = {}
        self.freeing: dict[str, Need] = {}  # unloads in flight (``unload_key``): held until closed
        self.reserved: dict[str, Need] = {}  # keys being loaded

    def used(self) -> Need:
        """The memory held: residents, reserved loads, unloads in flight."""
        total = Need()
        for n in [r.need for r in self.residents.values()] + list(self.freeing.values()) + list(
                self.reserved.values()):
            total = total + n
        return total

    def check_alone(self, name: str, planned: Planned) -> None:
        """RequestError (400) with the planner's reasons when ``planned`` cannot fit even alone."""
        alone_ok = self.budget.fits(planned.need, 1)
        if planned.fits and alone_ok:
            return
        why = "; ".join(planned.reasons[:6]) or f"it needs {need_text(planned.need)}"
        raise RequestError(f"{name} cannot be loaded by this server even alone: it needs "
                           f"{need_text(planned.need)}, the server may use {budget_text(self.budget)} ({why})",
                           param="model", code="model_too_large",
                           hint="pick a smaller quantization or model, or restart the server with a larger "
                           "--max-memory/--max-vram or a shorter --ctx")

    def check_next_to(self, name: str, planned: Planned) -> None:
        """InsufficientMemoryError when ``planned`` does not fit next to the residents (start-up loads: nothing
        is evicted for them)."""
        used = self.used() + planned.need
        if not self.budget.fits(used, len(self.residents) + 1):
            raise InsufficientMemoryError(
                f"{name} does not fit next to the models loaded before it ({need_text(used)} > "
                f"{budget_text(self.budget)})", hint="raise --max-memory/--max-vram/--max-models, or name fewer "
                "models at start-up (the others load on first request)")

    def victims(self, need: Need, idle: Callable[[Resident], bool]) -> list[Resident] | None:
        """The idle residents (``idle(r)``, never a pinned one) to unload so that ``need`` fits, least recently
        used first among those that hold memory where the budget is exceeded (a model on another card, or
        one holding nothing of the pool that is short, stays): [] when it fits already, None when it
        cannot fit until a busy model goes idle."""
        used = self.used() + need
        n = len(self.residents) + len(self.reserved) + 1
        out: list[Resident] = []
        candidates = self.lru(idle)
        while over := self.budget.over(used, n):
            r = next((c for c in candidates if any(self.budget.frees(c.need, cap) for cap in over)), None)
            if r is None:
                return None
            candidates.remove(r)
            out.append(r)
            used = used - r.need
            n -= 1
        return out

    def lru(self, idle: Callable[[Resident], bool]) -> list[Resident]:
        """The residents that may be unloaded (``idle(r)``, not pinned), least recently used first."""
        return sorted((r for r in self.residents.values() if idle(r) and not r.pinned), key=lambda r: r.last_used)

    def held_without(self, gone: list[Resident]) -> dict[int, int]:
        """The VRAM held on each GPU (index → bytes) once the residents ``gone`` are unloaded."""
        used = self.used()
        for r in gone:
            used = used - r.need
        return used.vram_by_gpu

    def begin_unload(self, r: Resident) -> None:
        """``r`` leaves the residents; its memory stays held until ``end_unload``."""
        r.unloading = True
        self.residents.pop(r.key, None)
        self.freeing[unload_key(r)] = r.need

    def end_unload(self, r: Resident) -> None:
        """``r``'s engine is closed: its memory is free."""
        self.freeing.pop(unload_key(r), None)


def unload_key(r: Resident) -> str:
    """``Residency.freeing``'s key for ``r`` (a reload unloads and loads the same path at once)."""
    return r.key + f"#{id(r)}"


def path_key(path) -> str:
    """The registry's key for a model file or folder: its resolved absolute path (the name as given when it
    cannot be resolved)."""
    try:
        return str(Path(path).resolve())
    except OSError:
        return str(path)


def plan_need(plan) -> Need:
    """The memory a ``Plan`` (or None) says its model holds: VRAM, RAM, VRAM per device."""
    if plan is None:
        return Need()
    return Need(int(getattr(plan, "vram_bytes", 0) or 0), int(getattr(plan, "ram_bytes", 0) or 0),
                vram_by_device(plan))
