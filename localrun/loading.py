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


def load_model(model: str | None, *, backend: str | None = None, n_ctx: int | None = None,
               n_parallel: int = 1, n_gpu_layers: int | None = None, kv_type: str | None = None,
               flash_attn: bool | None = None, n_threads: int | None = None, chat_template: str | None = None,
               force: bool = False, status=None, models_dir: Path | None = None) -> Loaded:
    """Resolve, plan and load MODEL. ``status(text)`` is called with progress messages.

    The plan is ``plan_for_run`` for the detected machine; every flag given overrides the planner.
    Raises ModelNotFoundError, ModelFormatError/TruncatedModelError, InsufficientMemoryError (the plan
    does not fit and not ``force``), ChatTemplateError (a bad --chat-template), backend errors.
    """
    from localrun.backends import load_engine
    from localrun.backends.choice import choose_backend
    from localrun.machine.hardware import probe_hardware
    from localrun.model.chat_template import load_template
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import Plan, check_fits, plan_for_run
    from localrun.store.resolve import resolve_model

    say = status or (lambda _text: None)
    path = resolve_model(model, models_dir)
    spec = read_gguf(path) if Path(path).is_file() else None
    if spec is not None:
        spec.check_complete()
    template = load_template(chat_template) if chat_template else None
    hw = probe_hardware(models_dir)
    backend, reason = choose_backend(path, spec, hw, backend)
    if spec is not None:
        gpu_ok = _gpu_offload_supported(backend)
        from localrun.machine.measurements import planner_measurement
        from localrun.render import stderr

        plan = plan_for_run(spec, hw, n_ctx=n_ctx, n_parallel=n_parallel, kv_type=kv_type,
                            n_gpu_layers=n_gpu_layers, flash_attn=flash_attn, backend=backend,
                            gpu_offload_supported=gpu_ok, measurement=planner_measurement(backend))
        check_fits(plan, force=force)
        for w in plan.warnings:  # context beyond training, rounded context: said on stderr, every time
            stderr().print(f"[yellow]warning:[/] {w}", highlight=False)
    else:  # an MLX model folder: no GGUF header to plan from
        plan = Plan(backend=backend, n_ctx=n_ctx or 4096, n_parallel=n_parallel, model=Path(path).name)
    if n_threads:
        plan.n_threads = plan.n_threads_batch = n_threads
    say(f"loading {Path(path).name} ({backend}, n_ctx {plan.n_ctx}, {plan.n_gpu_layers} GPU layers)")
    kwargs: dict = {"chat_template": template}
    if spec is not None:
        kwargs["spec"] = spec
    if backend == "mlx":
        kwargs.update(hardware=hw, force=force)  # the MLX memory guardrail uses this probe, not a second one
    engine = load_engine(path, plan, **kwargs)
    return Loaded(engine=engine, spec=spec, plan=plan, hardware=hw, backend_reason=reason)


def _gpu_offload_supported(backend: str) -> bool:
    if backend == "llamacpp":
        from localrun.backends.llamacpp_lib import supports_gpu_offload

        return supports_gpu_offload()
    return True  # MLX: Metal on a Mac (the planner only offloads when the profile has a GPU)
