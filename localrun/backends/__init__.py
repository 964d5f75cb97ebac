"""Backends: each turns a ``Plan`` into a loaded ``Engine`` (see ``base.py``).

``load_engine(spec_path, plan)`` picks the backend named in the plan; backend modules are imported
only here, on demand, so `localrun fit`/`--help` never import llama_cpp or mlx.
"""

from __future__ import annotations

from pathlib import Path

from localrun.backends.base import Engine
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
