"""The server's ``Loader`` (``server.models.Loader``): what a model needs before it loads (the planner at the
server's context and slots, on the machine as probed at start-up and capped by ``--max-memory`` /
``--max-vram``), then the load itself. Split from ``server/models.py``, which keeps residency (which models
stay loaded, eviction, keep-alive)."""

from __future__ import annotations

import importlib
import logging
from dataclasses import replace
from pathlib import Path

from localrun.server.budget import Budget, Need, vram_by_device
from localrun.server.residency import Planned, path_key

log = logging.getLogger("localrun.server")


# imported lazily by a model's first request: plan_load / load_planned (the planner, the backend choice, the
# GGUF reader, templates, speculation), the KV-cache tiers, then the first generation (sampler, constraints)
LOAD_PATH_MODULES = ("localrun.loading", "localrun.backends", "localrun.backends.choice",
                     "localrun.model.gguf_info", "localrun.model.layers", "localrun.model.chat_template",
                     "localrun.machine.measurements",
                     "localrun.offload.plan", "localrun.offload.search", "localrun.offload.devices",
                     "localrun.offload.memory", "localrun.offload.speed", "localrun.store.resolve",
                     "localrun.backends.spec_decode", "localrun.offload.kv_tiers", "localrun.constrain",
                     "concurrent.futures.thread")


class PlannerLoader:
    """The server's ``Loader``: ``loading.plan_load`` for ``hardware`` (the machine as probed at start-up, its
    free RAM and VRAM capped by ``--max-memory``/``--max-vram``) at the server's context and parallel slots,
    then ``loading.load_planned``. ``templates``: a ``--chat-template`` per model key (start-up models)."""

    def __init__(self, settings, hardware, *, backend: str | None = None, n_ctx: int | None = None,
                 n_parallel: int = 1, kv_type: str | None = None, flash_attn: bool | None = None,
                 n_threads: int | None = None, force: bool = False, plan_fn=None) -> None:
        self.plan_fn = plan_fn  # plan_load's signature → loading.Prepared; None: loading.plan_load (tests inject)
        self.settings = settings
        self.hardware = hardware
        self.n_gpu_layers: int | None = None  # serve --n-gpu-layers (None: the plan's; -1 all)
        self.backend = backend or getattr(settings, "backend", None) or "llamacpp"
        self.n_ctx = n_ctx
        self.n_parallel = n_parallel
        self.kv_type = kv_type
        self.flash_attn = flash_attn
        self.n_threads = n_threads
        self.force = force
        self.templates: dict[str, str] = {}  # path_key → --chat-template (by name or file)
        self.kv_tiers: dict | None = None  # --cache-ram/--cache-dir/--cache-disk: backends.attach_kv_tiers keywords
        self.speculation = None  # serve --spec/--draft-model/--draft-max: server.spec_options.SpecOptions
        self.mmproj: dict[str, str] = {}  # path_key → --mmproj (the vision projector file)
        self.no_mmproj_offload = False  # serve --no-mmproj-offload: projectors on the CPU

    def warm_up(self) -> float:
        """Do the load path's one-time, model-independent work now (``localrun serve`` calls it at start-up),
        so that a model's first request pays only for that model: the modules the planner and the backend
        import lazily (``LOAD_PATH_MODULES``, then ``backends.warm_up``: the backend's own modules and
        llama.cpp's library with its backends initialised), and Jinja's sandbox. Without it a first request
        imported the KV-cache tiers, speculation, the sampler and the constraint modules on its clock (~0.13 s
        on a loaded 2-core CPU without .pyc files; in a registry built without `serve`'s start-up, llama_cpp,
        numpy and jinja2 too: 0.3–0.6 s).
        → the seconds spent. Raises nothing (a missing backend is reported by the load that needs it)."""
        import time

        t0 = time.perf_counter()
        try:
            for name in LOAD_PATH_MODULES:
                importlib.import_module(name)
            from localrun.backends import warm_up

            warm_up(self.backend)
            from localrun.model.chat_template import ChatTemplate

            ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", bos_token="", eos_token="")
        except Exception as e:  # noqa: BLE001 - the load that needs the backend says what is wrong
            log.debug("warm-up stopped: %s", e)
        return time.perf_counter() - t0

    def set_template(self, model_path, template: str) -> None:
        """Load the model at ``model_path`` with ``template`` (``--chat-template``) instead of its own."""
        self.templates[path_key(model_path)] = template

    def set_mmproj(self, model_path, mmproj: str) -> None:
        """Load the model at ``model_path`` with the vision projector ``mmproj`` (``--mmproj``)."""
        self.mmproj[path_key(model_path)] = mmproj

    def plan(self, path: str, n_ctx: int | None = None, held: dict[int, int] | None = None) -> Planned:
        """What loading ``path`` needs and how (``Planned``), at ``n_ctx`` tokens per sequence (a request's
        ``num_ctx``; None: the server's ``--ctx``, else the planner's choice). ``held``: the VRAM the resident
        models hold on each GPU (index → bytes): the model is also planned on what they leave free, and that
        plan is taken when it gives as much as the plan for the whole budget (same context, GPU layers and
        KV type), so that a model that fits on the emptier card goes there instead of evicting. Raises
        ModelNotFoundError, ModelFormatError, ChatTemplateError."""
        whole = self._plan(path, n_ctx, self.hardware)
        if not held or not any(held.values()) or not whole.need.vram_bytes or whole.prepared.spec is None:
            return whole
        left = replace(self.hardware, gpus=[_less(g, held.get(i, 0)) for i, g in enumerate(self.hardware.gpus)])
        around = self._plan(path, n_ctx, left)
        if around.fits and around.given == whole.given:
            around.hardware = whole.hardware  # the machine as the server sees it, not the leftovers
            return around
        return whole

    def _plan(self, path: str, n_ctx: int | None, hardware) -> Planned:
        from localrun.loading import plan_load

        plan_load = self.plan_fn or plan_load
        n_ctx = n_ctx or self.n_ctx
        prep = plan_load(path, backend=self.backend, n_ctx=n_ctx, n_parallel=self.n_parallel,
                         kv_type=self.kv_type, flash_attn=self.flash_attn, n_threads=self.n_threads,
                         chat_template=self.templates.get(path), force=self.force, n_gpu_layers=self.n_gpu_layers,
                         models_dir=self.settings.models_dir, hardware=hardware, warn=False,
                         mmproj=self.mmproj.get(path_key(path)), no_mmproj_offload=self.no_mmproj_offload,
                         **(self.speculation.for_model(path) if self.speculation else {}))
        plan, spec = prep.plan, prep.spec
        hw = self.hardware.to_dict() if hasattr(self.hardware, "to_dict") else None
        if spec is None:  # an MLX folder: its files are what it holds
            size = sum(f.stat().st_size for f in Path(prep.path).glob("*.safetensors"))
            return Planned(str(prep.path), Need(0, size), plan, True, [], hardware=hw, prepared=prep)
        for w in plan.warnings:
            log.warning("%s: %s", Path(prep.path).name, w)
        gpu = bool(getattr(self.hardware, "gpus", None)) and plan.backend == "llamacpp"
        asked = {"n_ctx": n_ctx or spec.n_ctx_train or plan.n_ctx, "n_gpu_layers": "all" if gpu else 0,
                 "kv_type": self.kv_type or "f16"}
        given = {"n_ctx": plan.n_ctx, "n_gpu_layers": "all" if gpu and plan.n_gpu_layers >= spec.n_layer
                 else plan.n_gpu_layers, "kv_type": plan.kv_type}
        need = Need(int(plan.vram_bytes), int(plan.ram_bytes), vram_by_device(plan, self.hardware))
        return Planned(str(prep.path), need, plan, bool(plan.fits or self.force), list(plan.reasons), asked, given,
                       hw, prep)

    def load(self, planned: Planned):
        from localrun.loading import load_planned

        engine = load_planned(planned.prepared).engine
        if self.kv_tiers and engine.backend in ("llamacpp", "mlx"):  # MLX: mlx-lm's prompt cache, same tiers
            from localrun.backends import attach_kv_tiers

            attach_kv_tiers(engine, **self.kv_tiers)
        return engine


def budget_hardware(hw, *, max_ram_bytes: int | None = None, max_vram_bytes: int | None = None,
                    max_models: int | None = None):
    """(the profile to plan with, the ``Budget``): the probed free RAM, and each GPU's usable VRAM (its own
    budget), capped by ``max_ram_bytes`` and ``max_vram_bytes`` (a cap on each GPU). A GPU that shares the
    RAM (``GpuInfo.unified``) is one pool with it: its budget is capped by the RAM budget too, and the
    ``Budget`` counts its bytes against the RAM (``Budget.shared``). Raises nothing."""
    ram = hw.ram_available_bytes if max_ram_bytes is None else min(max_ram_bytes, hw.ram_available_bytes)
    gpus, per_gpu = [], {}
    for i, g in enumerate(hw.gpus):
        vram = g.usable_bytes if max_vram_bytes is None else min(max_vram_bytes, g.usable_bytes)
        if g.unified:
            vram = min(vram, ram)
        gpus.append(replace(g, free_bytes=vram, working_set_bytes=min(g.working_set_bytes, vram)
                            if g.working_set_bytes else None))
        per_gpu[i] = vram
    shared = tuple(i for i, g in enumerate(hw.gpus) if g.unified)
    budget = Budget(ram, sum(per_gpu.values()) if per_gpu else None, max_models, per_gpu if per_gpu else None,
                    shared)
    return replace(hw, ram_available_bytes=ram, gpus=gpus), budget


def _less(g, held_bytes: int):
    """GPU ``g`` with ``held_bytes`` fewer free (and fewer in Apple's working set), at least 0."""
    if held_bytes <= 0:
        return g
    free = max(0, g.free_bytes - held_bytes)
    ws = max(0, g.working_set_bytes - held_bytes) if g.working_set_bytes else g.working_set_bytes
    return replace(g, free_bytes=free, working_set_bytes=ws)
