"""MODEL argument → a loaded engine, through the plan: resolve → inspect → probe → plan → check → load.

Shared by `chat`, `serve` and `bench`, so all three load exactly what `fit` predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from localrun.gguf_info import ModelSpec


@dataclass
class Loaded:
    engine: object
    spec: ModelSpec | None
    plan: object
    hardware: object


def make_plan(spec: ModelSpec, hardware, *, backend: str = "llamacpp", n_ctx: int | None = None,
              n_parallel: int = 1, n_gpu_layers: int | None = None, kv_type: str | None = None,
              flash_attn: bool | None = None):
    """The plan for this machine (the planner's choice; flags override it)."""
    from localrun.offload import plan as planmod

    if hasattr(planmod, "plan_for_run"):
        return planmod.plan_for_run(spec, hardware, n_ctx=n_ctx, n_parallel=n_parallel, kv_type=kv_type,
                                    n_gpu_layers=n_gpu_layers, flash_attn=flash_attn, backend=backend)
    overrides = {"backend": backend, "n_parallel": n_parallel}
    if kv_type:
        overrides["kv_type"] = kv_type
    if flash_attn is not None:
        overrides["flash_attn"] = flash_attn
    return planmod.simple_plan(spec, hardware, n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, **overrides)


def load_model(model: str | None, *, backend: str | None = None, n_ctx: int | None = None,
               n_parallel: int = 1, n_gpu_layers: int | None = None, kv_type: str | None = None,
               flash_attn: bool | None = None, chat_template: str | None = None, force: bool = False,
               status=None) -> Loaded:
    """Resolve, plan and load MODEL. ``status(text)`` is called with progress messages.

    Raises ModelNotFoundError, ModelFormatError/TruncatedModelError, InsufficientMemoryError (the plan
    does not fit and not ``force``), ChatTemplateError (a bad --chat-template), backend errors.
    """
    from pathlib import Path

    from localrun.backends import load_engine
    from localrun.chat_template import load_template
    from localrun.gguf_info import read_gguf
    from localrun.hardware import probe_hardware
    from localrun.store import resolve_model

    say = status or (lambda _text: None)
    path = resolve_model(model)
    spec = read_gguf(path) if Path(path).is_file() else None
    if spec is not None:
        spec.check_complete()
    hw = probe_hardware()
    backend = _choose_backend(path, spec, hw, backend)
    template = load_template(chat_template) if chat_template else None
    if spec is not None:
        plan = make_plan(spec, hw, backend=backend, n_ctx=n_ctx, n_parallel=n_parallel,
                         n_gpu_layers=n_gpu_layers, kv_type=kv_type, flash_attn=flash_attn)
        _check(plan, force)
    else:
        from localrun.offload.plan import Plan

        plan = Plan(backend=backend, n_ctx=n_ctx or 4096, n_parallel=n_parallel)
    say(f"loading {Path(path).name} ({backend}, n_ctx {plan.n_ctx}, {plan.n_gpu_layers} GPU layers)")
    kwargs = {"chat_template": template}
    if spec is not None:
        kwargs["spec"] = spec
    engine = load_engine(path, plan, **kwargs)
    return Loaded(engine=engine, spec=spec, plan=plan, hardware=hw)


def _choose_backend(path, spec, hw, requested: str | None) -> str:
    try:
        from localrun.backends.choice import choose_backend
    except ImportError:  # the MLX backend's chooser is optional at this layer
        return requested or "llamacpp"
    backend, _reason = choose_backend(path, spec, hw, requested)
    return backend


def _check(plan, force: bool) -> None:
    from localrun.offload import plan as planmod

    if hasattr(planmod, "check_fits"):
        planmod.check_fits(plan, force=force)
