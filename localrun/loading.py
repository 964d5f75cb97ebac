"""MODEL argument → a loaded engine, through the plan: resolve → inspect → probe → plan → check → load.

Shared by `chat`, `serve` and `bench`, so all three load exactly what `fit` predicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localrun.model.spec import ModelSpec

if TYPE_CHECKING:
    from localrun.backends.base import Engine


@dataclass
class Loaded:
    """What ``load_model`` loaded: the engine (an ``Engine``; the server and bench drive it through
    ``backends.as_batch_engine``), its GGUF header (None for an MLX folder), the plan and the hardware probe."""

    engine: Engine
    spec: ModelSpec | None
    plan: object
    hardware: object
    backend_reason: str = ""


@dataclass
class Prepared:
    """A model planned but not loaded yet (``plan_load``): the file, its header, the plan and the probe the
    plan was made for, and what ``load_planned`` passes to the backend."""

    path: Path
    spec: ModelSpec | None
    plan: object
    hardware: object
    backend: str
    backend_reason: str = ""
    template: object = None
    force: bool = False


def plan_load(model: str | None, *, backend: str | None = None, n_ctx: int | None = None,
              n_parallel: int = 1, n_gpu_layers: int | None = None, kv_type: str | None = None,
              flash_attn: bool | None = None, n_threads: int | None = None, chat_template: str | None = None,
              force: bool = False, models_dir: Path | None = None, hardware=None, warn: bool = True) -> Prepared:
    """Resolve and plan MODEL without loading it (the server checks the plan's bytes against its residents
    first). ``hardware``: the profile to plan for (default: probe this machine). The plan's ``fits`` and
    ``reasons`` are not checked here (``offload.plan.check_fits``). ``warn``: print the plan's warnings on
    stderr. Raises ModelNotFoundError, ModelFormatError/TruncatedModelError, ChatTemplateError."""
    from localrun.backends.choice import choose_backend
    from localrun.machine.hardware import probe_hardware
    from localrun.model.chat_template import load_template
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import Plan, plan_for_run
    from localrun.store.resolve import resolve_model

    path = resolve_model(model, models_dir)
    spec = read_gguf(path) if Path(path).is_file() else None
    if spec is not None:
        spec.check_complete()
    template = load_template(chat_template) if chat_template else None
    hw = hardware if hardware is not None else probe_hardware(models_dir)
    backend, reason = choose_backend(path, spec, hw, backend)
    if spec is not None:
        from localrun.machine.measurements import planner_measurement

        plan = plan_for_run(spec, hw, n_ctx=n_ctx, n_parallel=n_parallel, kv_type=kv_type,
                            n_gpu_layers=n_gpu_layers, flash_attn=flash_attn, backend=backend,
                            gpu_offload_supported=_gpu_offload_supported(backend),
                            measurement=planner_measurement(backend))
        if warn:
            from localrun.render import stderr

            for w in plan.warnings:  # context beyond training, rounded context: said on stderr, every time
                stderr().print(f"[yellow]warning:[/] {w}", highlight=False)
    else:  # an MLX model folder: no GGUF header to plan from
        plan = Plan(backend=backend, n_ctx=n_ctx or 4096, n_parallel=n_parallel, model=Path(path).name)
    if n_threads:
        plan.n_threads = plan.n_threads_batch = n_threads
    return Prepared(Path(path), spec, plan, hw, backend, reason, template, force)


def load_planned(prep: Prepared, status=None) -> Loaded:
    """Load what ``plan_load`` planned (no fit check here). Raises backend errors."""
    from localrun.backends import load_engine

    plan = prep.plan
    (status or (lambda _text: None))(f"loading {prep.path.name} ({prep.backend}, n_ctx {plan.n_ctx}, "
                                     f"{plan.n_gpu_layers} GPU layers)")
    kwargs: dict = {"chat_template": prep.template}
    if prep.spec is not None:
        kwargs["spec"] = prep.spec
    if prep.backend == "mlx":
        kwargs.update(hardware=prep.hardware, force=prep.force)  # the MLX memory guardrail uses this probe
    engine = load_engine(prep.path, plan, **kwargs)
    return Loaded(engine=engine, spec=prep.spec, plan=plan, hardware=prep.hardware, backend_reason=prep.backend_reason)


def load_model(model: str | None, *, backend: str | None = None, n_ctx: int | None = None,
               n_parallel: int = 1, n_gpu_layers: int | None = None, kv_type: str | None = None,
               flash_attn: bool | None = None, n_threads: int | None = None, chat_template: str | None = None,
               force: bool = False, status=None, models_dir: Path | None = None) -> Loaded:
    """Resolve, plan and load MODEL (``plan_load``, ``check_fits``, ``load_planned``). ``status(text)`` is
    called with progress messages.

    The plan is ``plan_for_run`` for the detected machine; every flag given overrides the planner.
    Raises ModelNotFoundError, ModelFormatError/TruncatedModelError, InsufficientMemoryError (the plan
    does not fit and not ``force``), ChatTemplateError (a bad --chat-template), backend errors.
    """
    from localrun.offload.plan import check_fits

    prep = plan_load(model, backend=backend, n_ctx=n_ctx, n_parallel=n_parallel, n_gpu_layers=n_gpu_layers,
                     kv_type=kv_type, flash_attn=flash_attn, n_threads=n_threads, chat_template=chat_template,
                     force=force, models_dir=models_dir)
    if prep.spec is not None:
        check_fits(prep.plan, force=force)
    return load_planned(prep, status)


def _gpu_offload_supported(backend: str) -> bool:
    if backend == "llamacpp":
        from localrun.backends.llamacpp_lib import supports_gpu_offload

        return supports_gpu_offload()
    return True  # MLX: Metal on a Mac (the planner only offloads when the profile has a GPU)
