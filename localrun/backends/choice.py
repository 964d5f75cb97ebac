"""Which backend runs a model here, and the MLX memory guardrail. Pure decisions; no backend imports
at module level (``fit`` and ``--help`` stay fast).

``choose_backend``:

* ``--backend mlx|llamacpp`` wins everywhere (an MLX folder cannot go to llama.cpp: ConfigError);
* on **Apple Silicon** (a unified ``apple`` GPU in the HardwareProfile): MLX for an MLX folder or for a
  GGUF that MLX reads natively (F16/Q4_0/Q4_1/Q8_0 of an architecture ``mlx.gguf`` converts) — no
  conversion, and MLX is usually the faster Metal runtime; llama.cpp (Metal) for everything else, K-quants
  above all, which llama.cpp runs as they are while MLX would have to re-quantize them;
* **elsewhere** llama.cpp (MLX is Apple's framework; ``--backend mlx`` runs it through ``mlx[cpu]``),
  except an MLX folder, which only MLX can load.

``check_mlx_memory`` / ``prepare_mlx_memory``: mlx-lm aborts the process on a Metal out-of-memory
instead of raising, so before loading on a Mac localrun compares what the model needs (weights as MLX
stores them + KV cache for ``plan.n_ctx`` + a compute margin) with Metal's GPU working-set budget
(``GpuInfo.working_set_bytes``: recommendedMaxWorkingSetSize, or ``iogpu.wired_limit_mb``). Too big →
InsufficientMemoryError with the numbers; fits → the wired limit is set to the budget (as mlx-lm's
``generate.wired_limit`` does) so the weights stay resident.
"""

from __future__ import annotations

import platform
from pathlib import Path

from localrun.errors import BackendUnavailableError, ConfigError, InsufficientMemoryError


def mlx_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None


def choose_backend(model_path, spec, hardware, requested: str | None = None) -> tuple[str, str]:
    """(``"mlx"`` | ``"llamacpp"``, a one-line reason for the user).

    ``spec`` is the GGUF's ModelSpec (None for an MLX folder); ``hardware`` a HardwareProfile (None =
    not Apple Silicon); ``requested`` is ``--backend`` (None or "auto" = choose). Raises ConfigError for
    an unknown or impossible request, BackendUnavailableError when MLX is requested but not installed."""
    from localrun.backends.mlx.gguf import loads_natively

    folder = spec is None and model_path is not None and Path(model_path).is_dir()
    req = (requested or "auto").lower()
    if req not in ("auto", "mlx", "llamacpp"):
        raise ConfigError(f"unknown backend {requested!r}", hint="use --backend mlx, llamacpp or auto")
    if req == "llamacpp":
        if folder:
            raise ConfigError(f"{model_path} is an MLX folder; llama.cpp runs GGUF files only",
                              hint="drop --backend llamacpp (MLX loads it), or give a .gguf")
        return "llamacpp", "--backend llamacpp"
    if req == "mlx":
        if not mlx_available():
            raise BackendUnavailableError("--backend mlx needs mlx and mlx-lm",
                                          hint="pip install 'localrun[mlx]' (Linux: pip install 'mlx[cpu]' mlx-lm)")
        return "mlx", "--backend mlx" + ("" if _apple(hardware) else " (mlx[cpu]: MLX on the CPU)")
    if folder:
        return "mlx", "an MLX model folder: only MLX loads it"
    if not _apple(hardware):
        return "llamacpp", "llama.cpp is the default off Apple Silicon (--backend mlx runs mlx[cpu])"
    if not mlx_available():
        return "llamacpp", "Apple Silicon, but mlx/mlx-lm are not installed: llama.cpp (Metal)"
    if spec is not None and loads_natively(spec):
        return "mlx", f"Apple Silicon and a {spec.file_type} GGUF MLX loads natively: MLX (Metal)"
    kinds = sorted({t.type_name for t in spec.tensors} - {"F32", "F16", "Q4_0", "Q4_1", "Q8_0"}) if spec else []
    why = (f"its {', '.join(kinds)} tensors would have to be re-quantized for MLX" if kinds
           else f"MLX does not convert the {spec.arch if spec else '?'} architecture")
    return "llamacpp", f"Apple Silicon: llama.cpp (Metal), because {why}"


def _apple(hardware) -> bool:
    return bool(hardware is not None and getattr(hardware, "is_apple_silicon", False))


def mlx_memory_need(plan, spec=None, folder: str | None = None) -> dict[str, int]:
    """{weights_bytes, kv_bytes, compute_bytes, total_bytes} the MLX backend needs for ``plan``: the
    planner's MLX formulas (``offload.memory.mlx_weight_bytes`` / ``mlx_kv_bytes`` / ``mlx_memory``)
    applied to a GGUF ``spec``, an MLX ``folder`` (safetensors sizes + config.json), or the plan alone."""
    import json

    from localrun.offload.memory import mlx_kv_bytes, mlx_memory, mlx_weight_bytes

    if spec is not None:
        weights = mlx_weight_bytes(spec)
        kv = mlx_kv_bytes(spec, int(plan.n_ctx))
    elif folder is not None:
        weights = sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))
        try:
            cfg = json.loads((Path(folder) / "config.json").read_text())
            cfg = cfg.get("text_config", cfg) | {k: v for k, v in cfg.items() if k != "text_config"}
            kv = mlx_kv_bytes(cfg, int(plan.n_ctx))
        except (OSError, ValueError):
            kv = 0
    else:
        weights, kv = int(plan.weights_bytes), int(plan.kv_cache_bytes)
    return mlx_memory(weights, kv)


def check_mlx_memory(plan, spec, hardware, *, folder: str | None = None, force: bool = False) -> int | None:
    """The wired limit (bytes) to set before loading with MLX on Apple Silicon, or None off Apple Silicon.

    Raises InsufficientMemoryError (with the numbers) when the model does not fit Metal's working-set
    budget, unless ``force``."""
    from localrun.machine.hardware import fmt_bytes

    if not _apple(hardware):
        return None
    gpu = next(g for g in hardware.gpus if g.unified and g.vendor == "apple")
    budget = int(gpu.working_set_bytes or gpu.total_bytes * 2 // 3)
    need = mlx_memory_need(plan, spec, folder)
    if need["total_bytes"] > budget and not force:
        raise InsufficientMemoryError(
            f"the model needs {fmt_bytes(need['total_bytes'])} on the GPU with MLX (weights "
            f"{fmt_bytes(need['weights_bytes'])} + KV cache {fmt_bytes(need['kv_bytes'])} for "
            f"{int(plan.n_ctx)} tokens + compute {fmt_bytes(need['compute_bytes'])}), but Metal's working-set "
            f"budget on this Mac is {fmt_bytes(budget)} ({gpu.name}, {fmt_bytes(gpu.total_bytes)} unified memory)",
            needed_bytes=need["total_bytes"], available_bytes=budget,
            hint="use a smaller quantization or a shorter --ctx, try --backend llamacpp (it can keep layers "
            "on the CPU), raise the budget with `sudo sysctl iogpu.wired_limit_mb=N`, or --force")
    return budget


def prepare_mlx_memory(plan, spec, hardware, *, folder: str | None = None, force: bool = False) -> int | None:
    """Run the guardrail (probing the hardware on a Mac when none is given) and set MLX's wired limit
    when the plan fits. Returns the limit set (bytes) or None. The probe and ``mx.set_wired_limit``
    lines run only on macOS arm64 (``_on_apple_silicon``); tests inject profiles and a fake ``mx``."""
    if hardware is None and _on_apple_silicon():  # Mac only
        from localrun.machine.hardware import probe_hardware

        hardware = probe_hardware()
    limit = check_mlx_memory(plan, spec, hardware, folder=folder, force=force)
    if limit:
        set_wired_limit(limit)
    return limit


def set_wired_limit(limit_bytes: int, mx=None) -> bool:
    """``mx.set_wired_limit(limit)`` when Metal is available (a no-op on the CPU build). Returns whether it
    was set."""
    if mx is None:
        import mlx.core as mx
    if not mx.metal.is_available():
        return False
    mx.set_wired_limit(int(limit_bytes))  # Mac only
    return True


def _on_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def metal_device_info(mx=None) -> dict:
    """MLX's view of the GPU: ``{device_name, architecture, memory_size, max_recommended_working_set_size,
    ...}`` (``mx.device_info()``; on the CPU build only name and architecture)."""
    if mx is None:
        import mlx.core as mx
    info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
    return dict(info)


def gpu_from_mlx(info: dict):
    """A GpuInfo for Apple's GPU from ``metal_device_info()`` (None when MLX reports no Metal GPU)."""
    from localrun.machine.hardware import GpuInfo

    mem = int(info.get("memory_size") or 0)
    ws = info.get("max_recommended_working_set_size")
    if not mem or ws is None:
        return None
    return GpuInfo(name=str(info.get("device_name") or "Apple GPU"), vendor="apple", backend="metal",
                   total_bytes=mem, free_bytes=mem, unified=True, working_set_bytes=int(ws))
