"""Backends: each turns a ``Plan`` into a loaded ``Engine`` (the contract is ``base.py``).

Two wings, one per backend, and the backend-neutral modules beside them:

* ``llamacpp/``: llama.cpp through llama-cpp-python (engine, params, sampling, speculation, embeddings, dry
  run, RPC workers); ``mlx/``: mlx-lm (engine, loaders, GGUF conversion, sampling, speculation, cache);
* here: the contract (``base``), the text pipeline (``text``), token control (``control``, ``dry``), the
  KV-cache tiers (``kv_cache``, ``kv_store``, ``kv_files``), speculation's pure parts (``spec_decode``,
  ``draft_vocab``), the backend choice (``choice``) and ``SerialEngine`` (``serial``).

Nothing outside ``backends/`` imports a wing: it calls the functions below, which import the wing inside
(so ``import localrun.backends`` stays cheap, and `localrun fit`/`--help` never import llama_cpp or mlx).
``load_engine(spec_path, plan)`` picks the backend named in the plan. ``as_batch_engine`` gives the server
and bench the ``BatchEngine`` they drive: the engine itself (llama.cpp), MLX's ``MlxBatchEngine``
(continuous batching), or a one-at-a-time engine wrapped in ``SerialEngine``. A new backend is a folder
here with a class that implements ``Engine`` (and ``BatchEngine`` when it batches sequences, else
``SingleStreamEngine``) plus a branch in each function below that dispatches on the backend.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from localrun.backends.base import BatchEngine, Engine
from localrun.errors import ConfigError

BACKENDS = ("llamacpp", "mlx")

# what a first request imports lazily (``warm_up``): the backend choice, for any model (``choice.py`` asks
# ``mlx/gguf.py`` whether a GGUF loads natively in MLX); on llama.cpp the engine, embeddings, speculation (and
# its vocabulary check), the sampler chain and the KV-cache tiers
CHOICE_MODULES = ("localrun.backends.choice", "localrun.backends.mlx.gguf")
LLAMACPP_MODULES = ("localrun.backends.llamacpp.engine", "localrun.backends.llamacpp.embed",
                    "localrun.backends.llamacpp.spec", "localrun.backends.draft_vocab",
                    "localrun.backends.llamacpp.sampling", "localrun.backends.kv_cache", "localrun.backends.kv_files",
                    "localrun.backends.llamacpp.checkpoints")


def load_engine(model_path: str | Path, plan, **kwargs) -> Engine:
    """Load ``model_path`` with the backend ``plan.backend`` names. Raises the backend's LocalrunErrors."""
    if plan.backend == "llamacpp":
        from localrun.backends.llamacpp.engine import LlamaCppEngine

        return LlamaCppEngine(str(model_path), plan, **kwargs)
    if plan.backend == "mlx":
        from localrun.backends.mlx.engine import MlxEngine

        return MlxEngine(str(model_path), plan, **kwargs)
    raise ConfigError(f"unknown backend {plan.backend!r}", hint=f"use one of: {', '.join(BACKENDS)}")


def as_batch_engine(engine: Engine) -> BatchEngine:
    """``engine`` as the ``BatchEngine`` the scheduler drives: itself when it is one (llama.cpp); an MLX
    engine planned for several sequences becomes ``mlx/batch.py MlxBatchEngine`` (``plan.n_parallel`` slots,
    continuous batching) when its caches batch (``mlx.batch.can_batch``: every cache layer merges into
    mlx-lm's batched caches, and no speculative decoding), else ``SerialEngine``, one slot, requests one at
    a time (as is any other ``SingleStreamEngine``, and an MLX engine planned for one sequence: the engine's
    own cache then stays the conversation's, as ``localrun chat`` and ``save_kv_file`` use it). The one
    place that decides; calling it on a ``BatchEngine`` (a ``SerialEngine`` or ``MlxBatchEngine`` too)
    returns it unchanged."""
    if isinstance(engine, BatchEngine):
        return engine
    n_parallel = int(getattr(getattr(engine, "plan", None), "n_parallel", 1) or 1)
    if getattr(engine, "backend", None) == "mlx" and n_parallel > 1:
        from localrun.backends.mlx.batch import MlxBatchEngine, can_batch

        if can_batch(engine):
            return MlxBatchEngine(engine)
    from localrun.backends.serial import SerialEngine

    return SerialEngine(engine)


# ---------------------------------------------------------------------------------------------- loading
def supports_gpu_offload(backend: str) -> bool:
    """Whether ``backend`` as installed can put layers on a GPU: llama.cpp asks its library
    (``llama_supports_gpu_offload``: a CPU-only wheel cannot); MLX always can (Metal on a Mac; the planner
    offloads only when the profile has a GPU). Raises BackendUnavailableError (no llama_cpp)."""
    if backend == "llamacpp":
        from localrun.backends.llamacpp.lib import supports_gpu_offload as llama_offload

        return llama_offload()
    return True


def warm_up(backend: str) -> None:
    """Import what a first request on ``backend`` would import lazily and, for llama.cpp, load the library
    with its backends initialised (``llama_backend_init``), so that a server's first request does not pay
    for it (``server.loader.PlannerLoader.warm_up``): the backend choice's modules for any ``backend``; MLX:
    nothing more (its engine imports mlx on load). Raises what the imports raise (BackendUnavailableError
    without llama_cpp)."""
    for name in CHOICE_MODULES:
        importlib.import_module(name)
    if backend not in ("llamacpp", "auto"):
        return
    from localrun.backends.llamacpp.lib import import_llama

    for name in LLAMACPP_MODULES:
        importlib.import_module(name)
    _, C = import_llama()
    C.llama_backend_init()


def embedder_for(engine, n_ctx: int | None = None):
    """A sentence-embedding context on ``engine``'s weights (llama.cpp: ``llamacpp/embed.py
    LlamaCppEmbedder``; MLX: ``mlx/embed.py MlxEmbedder``, the same mean-pooled, L2-normalized last hidden
    state; ``embed(tokens) -> list[float]``), ``n_ctx`` tokens per input at most (None: the engine's).
    Raises ConfigError for a backend without embeddings, BackendError (no context, an MLX architecture whose
    hidden state is not reachable)."""
    if engine.backend == "llamacpp":
        from localrun.backends.llamacpp.embed import LlamaCppEmbedder

        return LlamaCppEmbedder(engine, n_ctx)
    if engine.backend == "mlx":
        from localrun.backends.mlx.embed import MlxEmbedder

        return MlxEmbedder(engine, n_ctx)
    raise ConfigError(f"embeddings need the llama.cpp backend, not {engine.backend}",
                      hint="load the model with --backend llamacpp")


# ---------------------------------------------------------------------------------------------- KV tiers
def attach_kv_tiers(engine, *, ram_bytes: int | None, disk_dir: str | os.PathLike | None = None,
                    disk_bytes: int = 0):
    """Give ``engine`` RAM/disk KV-cache tiers (``--cache-ram``/``--cache-dir``/``--cache-disk``): llama.cpp's
    sequence snapshots (``kv_cache.attach_kv_cache``) or MLX's prompt cache (``mlx/cache.py
    attach_mlx_kv_cache``) → the ``KVCache`` set as ``engine.kv_cache``. Raises ConfigError for another
    backend."""
    if engine.backend == "llamacpp":
        from localrun.backends.kv_cache import attach_kv_cache

        return attach_kv_cache(engine, ram_bytes=ram_bytes, disk_dir=disk_dir, disk_bytes=disk_bytes)
    if engine.backend == "mlx":
        from localrun.backends.mlx.cache import attach_mlx_kv_cache

        return attach_mlx_kv_cache(engine, ram_bytes=ram_bytes, disk_dir=disk_dir, disk_bytes=disk_bytes)
    raise ConfigError(f"no KV-cache tiers for backend {engine.backend!r}")


def save_kv_file(engine, path: str | os.PathLike) -> int:
    """Write the KV of ``engine``'s conversation (llama.cpp: slot 0, what chat runs on; MLX: its prompt
    cache) to ``path`` as a snapshot file (``/save`` in ``localrun chat``) → bytes written, 0 when there is
    nothing to save. Raises OSError, ConfigError (another backend)."""
    if engine.backend == "llamacpp":
        from localrun.backends.kv_cache import save_slot_file

        return save_slot_file(engine, engine.slots[0], path)
    if engine.backend == "mlx":
        from localrun.backends.mlx.cache import save_mlx_file

        return save_mlx_file(engine, path)
    raise ConfigError(f"no KV files for backend {engine.backend!r}")


def load_kv_file(engine, path: str | os.PathLike) -> int:
    """Restore a file ``save_kv_file`` wrote into ``engine`` (its conversation's KV replaced) → tokens
    restored. Raises ``kv_files.SnapshotFileError`` (another model or settings, corrupt, truncated, refused),
    OSError, ConfigError (another backend)."""
    if engine.backend == "llamacpp":
        from localrun.backends.kv_cache import load_slot_file

        return load_slot_file(engine, engine.slots[0], path)
    if engine.backend == "mlx":
        from localrun.backends.mlx.cache import load_mlx_file

        return load_mlx_file(engine, path)
    raise ConfigError(f"no KV files for backend {engine.backend!r}")


# ---------------------------------------------------------------------------------------------- planning
def measure_compute(model_path: str, plan, spec=None) -> dict[str, int]:
    """The compute buffers llama.cpp's own dry run (``no_alloc``; ``llamacpp/dryrun.py``) reserves for ``plan``
    on ``model_path``: {buffer type name: bytes}. Raises BackendUnavailableError (no llama_cpp), BackendError
    (llama.cpp cannot read the file or create the context)."""
    from localrun.backends.llamacpp.dryrun import measure_compute as dry_run

    return dry_run(model_path, plan, spec)


def apply_measured_compute(plan, measured: dict[str, int]) -> bool:
    """Put ``measure_compute``'s buffers into ``plan.devices`` (and ``plan.vram_bytes``) in place of the
    planner's estimates → whether every used device got a measurement (``llamacpp/dryrun.py``)."""
    from localrun.backends.llamacpp.dryrun import apply_measured_compute as apply

    return apply(plan, measured)


# ---------------------------------------------------------------------------------------------- RPC workers
def parse_endpoints(text: str | None) -> list[str]:
    """``--rpc host:port,…`` → ``host:port`` strings, in order, duplicates dropped (``llamacpp/rpc.py``; pure,
    no llama_cpp). Raises ConfigError."""
    from localrun.backends.llamacpp.rpc import parse_endpoints as parse

    return parse(text)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) → (host, port) (``llamacpp/rpc.py``; pure). Raises ConfigError."""
    from localrun.backends.llamacpp.rpc import split_endpoint as split

    return split(endpoint)


def check_reachable(host: str, port: int, **kwargs) -> float:
    """Seconds a TCP connect to the RPC worker took (``llamacpp/rpc.py``; keyword ``timeout_s``). Raises
    ConfigError when it does not answer."""
    from localrun.backends.llamacpp.rpc import check_reachable as check

    return check(host, port, **kwargs)


def hardware_for(rpc: str | None, models_dir=None):
    """``--rpc host:port,…`` → this machine's ``HardwareProfile`` with the workers' devices first
    (``llamacpp/rpc.py``); None without ``--rpc`` (the caller probes as usual). Raises
    BackendUnavailableError (no RPC build), ConfigError (bad text, a worker that does not answer)."""
    from localrun.backends.llamacpp.rpc import hardware_for as for_rpc

    return for_rpc(rpc, models_dir)


def hardware_with_workers(hw, endpoints: list[str], *, time_link: bool = False, link: dict | None = None):
    """``hw`` with the RPC workers' devices put first in ``hw.gpus`` (their free/total memory; the link timed
    when ``time_link``, or ``link``: the user's ``--rpc-link`` numbers) (``llamacpp/rpc.py``). Raises
    BackendUnavailableError, ConfigError."""
    from localrun.backends.llamacpp.rpc import hardware_with_workers as with_workers

    return with_workers(hw, endpoints, time_link=time_link, link=link)
