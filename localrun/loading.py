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
    spec_mode: str = "off"  # speculative decoding (llama.cpp, MLX): auto | ngram | draft | off
    draft_path: Path | None = None  # the draft model, its vocabulary checked against ``spec``
    draft_max: int | None = None
    mmproj_path: Path | None = None  # the vision projector loaded with the model (images in), None: text only
    mmproj_found: bool = False  # found beside the model (not --mmproj): a projector that does not load is skipped

    @property
    def has_chat_template(self) -> bool | None:
        """Whether the loaded engine will have a chat template, as it chooses one (``template``, the
        --chat-template source, else the GGUF header's); None for an MLX folder, known only once loaded."""
        if self.template is not None:
            return True
        return None if self.spec is None else self.spec.chat_template is not None


def plan_load(model: str | None, *, backend: str | None = None, n_ctx: int | None = None,
              n_parallel: int = 1, n_gpu_layers: int | None = None, kv_type: str | None = None,
              flash_attn: bool | None = None, n_threads: int | None = None, chat_template: str | None = None,
              force: bool = False, models_dir: Path | None = None, hardware=None, warn: bool = True,
              spec_mode: str = "off", draft_model: str | None = None, draft_max: int | None = None,
              mmproj: str | None = None, no_mmproj_offload: bool = False) -> Prepared:
    """Resolve and plan MODEL without loading it (the server checks the plan's bytes against its residents
    first). ``hardware``: the profile to plan for (default: probe this machine). The plan's ``fits`` and
    ``reasons`` are not checked here (``offload.plan.check_fits``). ``warn``: print the plan's warnings on
    stderr. ``spec_mode``/``draft_model``/``draft_max``: speculative decoding (``load_model``), checked here.
    ``mmproj``: the vision projector file (default: an ``mmproj-*.gguf`` beside a GGUF model, ``find_mmproj``);
    ``no_mmproj_offload``: keep it on the CPU.
    Raises ModelNotFoundError, ModelFormatError/TruncatedModelError, ChatTemplateError,
    VocabularyMismatchError, LocalrunError (a bad --spec)."""
    from localrun.backends.choice import choose_backend
    from localrun.machine.hardware import probe_hardware
    from localrun.model.chat_template import load_template
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import Plan
    from localrun.offload.search import plan_for_run
    from localrun.store.resolve import resolve_model

    path = resolve_model(model, models_dir)
    spec = read_gguf(path) if Path(path).is_file() else None
    if spec is not None:
        spec.check_complete()
    template = load_template(chat_template) if chat_template else None
    draft_path = _check_speculation(spec_mode, draft_model, spec, models_dir)
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
    if not n_threads:
        from localrun.config import env_threads

        n_threads = env_threads()  # LOCALRUN_THREADS, where set, stands in for --threads
    if n_threads:
        plan.n_threads = plan.n_threads_batch = n_threads
    if draft_path and spec is not None:
        from localrun.offload.plan import add_draft_model

        add_draft_model(plan, read_gguf(draft_path))
    mmproj_path = _mmproj_for(path, mmproj, backend)
    if mmproj_path is not None and spec is not None:
        from localrun.offload.plan import add_projector

        plan.no_mmproj_offload = no_mmproj_offload
        add_projector(plan, read_gguf(mmproj_path))
    return Prepared(Path(path), spec, plan, hw, backend, reason, template, force, spec_mode,
                    Path(draft_path) if draft_path else None, draft_max, mmproj_path, not mmproj)


def find_mmproj(model_path) -> Path | None:
    """The vision projector beside a GGUF model: the one ``mmproj-*.gguf`` (or ``*mmproj*.gguf``) in its
    folder, as llama.cpp's and Hugging Face's repositories name it; None when there is none or several."""
    p = Path(model_path)
    if not p.is_file():
        return None
    found = sorted(f for f in p.parent.glob("*.gguf") if "mmproj" in f.name.lower() and f != p)
    return found[0] if len(found) == 1 else None


def _mmproj_for(path, mmproj: str | None, backend: str) -> Path | None:
    """``--mmproj`` (must exist; ConfigError otherwise) or the one beside the model; llama.cpp only."""
    from localrun.errors import ConfigError

    if mmproj:
        if not Path(mmproj).is_file():
            raise ConfigError(f"--mmproj {mmproj}: no such file", hint="give the projector GGUF's path")
        return Path(mmproj)
    return find_mmproj(path) if backend == "llamacpp" else None


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
    elif prep.mmproj_path is not None:
        kwargs.update(mmproj=str(prep.mmproj_path), mmproj_optional=prep.mmproj_found)
    engine = load_engine(prep.path, plan, **kwargs)
    if prep.spec_mode != "off" and prep.backend in ("llamacpp", "mlx"):  # both engines: set_speculation
        if prep.draft_path:
            (status or (lambda _text: None))(f"loading the draft model {prep.draft_path.name}")
        try:
            engine.set_speculation(prep.spec_mode, prep.draft_max, str(prep.draft_path) if prep.draft_path else None)
        except BaseException:
            engine.close()
            raise
    return Loaded(engine=engine, spec=prep.spec, plan=plan, hardware=prep.hardware, backend_reason=prep.backend_reason)


def load_model(model: str | None, *, backend: str | None = None, n_ctx: int | None = None,
               n_parallel: int = 1, n_gpu_layers: int | None = None, kv_type: str | None = None,
               flash_attn: bool | None = None, n_threads: int | None = None, chat_template: str | None = None,
               force: bool = False, status=None, models_dir: Path | None = None, spec_mode: str = "off",
               draft_model: str | None = None, draft_max: int | None = None, hardware=None,
               mmproj: str | None = None, no_mmproj_offload: bool = False, check=None) -> Loaded:
    """Resolve, plan and load MODEL (``plan_load``, ``check_fits``, ``load_planned``). ``status(text)`` is
    called with progress messages. ``hardware``: the profile to plan for (default: probe this machine;
    ``--rpc`` adds the workers' devices, ``backends.hardware_with_workers``). ``check(prepared)``: called
    with the ``Prepared`` before anything loads; what it raises is raised (``chat`` refuses a base model
    there).

    The plan is ``plan_for_run`` for the detected machine; every flag given overrides the planner.
    Speculative decoding (llama.cpp and MLX): ``spec_mode`` ``auto`` | ``ngram`` | ``draft`` | ``off``, ``draft_model``
    (a model argument, resolved like MODEL; its vocabulary is checked against MODEL's header before
    anything loads), ``draft_max`` tokens per verify step at most (``backends/spec_decode.py``).

    Raises ModelNotFoundError, ModelFormatError/TruncatedModelError, InsufficientMemoryError (the plan
    does not fit and not ``force``), ChatTemplateError (a bad --chat-template), VocabularyMismatchError
    (a draft model with another vocabulary), LocalrunError (a bad --spec), backend errors.
    """
    from localrun.offload.plan import check_fits

    prep = plan_load(model, backend=backend, n_ctx=n_ctx, n_parallel=n_parallel, n_gpu_layers=n_gpu_layers,
                     kv_type=kv_type, flash_attn=flash_attn, n_threads=n_threads, chat_template=chat_template,
                     force=force, models_dir=models_dir, spec_mode=spec_mode, draft_model=draft_model,
                     draft_max=draft_max, hardware=hardware, mmproj=mmproj,
                     no_mmproj_offload=no_mmproj_offload)
    if check is not None:
        check(prep)
    if prep.spec is not None:
        check_fits(prep.plan, force=force)
    return load_planned(prep, status)


def _gpu_offload_supported(backend: str) -> bool:
    from localrun.backends import supports_gpu_offload

    return supports_gpu_offload(backend)  # MLX: True (Metal on a Mac; the planner offloads only onto a GPU)


def _check_speculation(mode: str, draft_model: str | None, spec: ModelSpec | None, models_dir: Path | None):
    """Check the speculation options before anything loads → the draft model's path, or None. Raises
    LocalrunError (an unknown mode; ``draft`` without a draft model), ModelNotFoundError,
    VocabularyMismatchError (the draft's header names another vocabulary than MODEL's)."""
    from localrun.backends.spec_decode import SPEC_MODES
    from localrun.errors import LocalrunError

    if mode not in SPEC_MODES:
        raise LocalrunError(f"unknown --spec {mode!r}", hint=f"use one of {', '.join(SPEC_MODES)}")
    if mode == "draft" and not draft_model:
        raise LocalrunError("--spec draft needs --draft-model", hint="give --draft-model MODEL, or use --spec ngram")
    if not draft_model or mode in ("off", "ngram"):
        return None
    from localrun.backends.draft_vocab import check_same_vocab
    from localrun.model.gguf_info import read_gguf
    from localrun.store.resolve import resolve_model

    draft_path = resolve_model(draft_model, models_dir)
    if spec is not None and Path(draft_path).is_file():
        draft_spec = read_gguf(draft_path)
        draft_spec.check_complete()
        check_same_vocab(spec, draft_spec)
    return draft_path
