"""Backends: each turns a ``Plan`` into a loaded ``Engine`` (the contract is ``base.py``).

``load_engine(spec_path, plan)`` picks the backend named in the plan; backend modules are imported
only here, on demand, so `localrun fit`/`--help` never import llama_cpp or mlx. ``as_batch_engine``
gives the server and bench the ``BatchEngine`` they drive: the engine itself (llama.cpp), or a
one-at-a-time engine (MLX) wrapped in ``SerialEngine``. A new backend is a module here with a class
that implements ``Engine`` (and ``BatchEngine`` when it batches sequences, else ``SingleStreamEngine``)
plus a branch in ``load_engine``.
"""

from __future__ import annotations

from pathlib import Path

from localrun.backends.base import BatchEngine, Engine
from localrun.errors import ConfigError

BACKENDS = ("llamacpp", "mlx")


def load_engine(model_path: str | Path, plan, **kwargs) -> Engine:
    """Load ``model_path`` with the backend ``plan.backend`` names. Raises the backend's LocalrunErrors."""
    if plan.backend == "llamacpp":
        from localrun.backends.llamacpp import LlamaCppEngine

        return LlamaCppEngine(str(model_path), plan, **kwargs)
    if plan.backend == "mlx":
        from localrun.backends.mlx import MlxEngine

        return MlxEngine(str(model_path), plan, **kwargs)
    raise ConfigError(f"unknown backend {plan.backend!r}", hint=f"use one of: {', '.join(BACKENDS)}")


def as_batch_engine(engine: Engine) -> BatchEngine:
    """``engine`` as the ``BatchEngine`` the scheduler drives: itself when it is one (llama.cpp), else
    (a ``SingleStreamEngine``: MLX) wrapped in ``SerialEngine``, one slot, requests one at a time. The one
    place that decides; calling it on a ``BatchEngine`` (a ``SerialEngine`` too) returns it unchanged."""
    if isinstance(engine, BatchEngine):
        return engine
    from localrun.backends.serial import SerialEngine

    return SerialEngine(engine)
