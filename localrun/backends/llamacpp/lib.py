"""Loading llama-cpp-python's C library and capturing llama.cpp's log; small facts about this machine
that decide llama.cpp parameters (GPU offload support, AMX, physical cores)."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections import deque

from localrun.errors import BackendUnavailableError
from localrun.model.repack import repack_mode
from localrun.model.repack import repack_patterns as _patterns


def import_llama():
    """(llama_cpp, its low-level module), with llama.cpp's log captured. Raises BackendUnavailableError.

    Sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (unless the user set it) before CUDA initialises: the planner
    numbers GPUs as NVML does (PCI bus order) and its ``tensor_split``/``main_gpu`` must name the same cards;
    CUDA's default order is fastest first, which differs on a box with mixed cards."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        import llama_cpp
        from llama_cpp import llama_cpp as C
    except ImportError as e:  # pragma: no cover - depends on the install
        raise BackendUnavailableError(
            f"llama-cpp-python is not installed or failed to load ({e})",
            hint="pip install llama-cpp-python (CUDA: CMAKE_ARGS='-DGGML_CUDA=on' pip install "
            "--force-reinstall --no-cache-dir llama-cpp-python)") from None
    LlamaLog.install(C)
    return llama_cpp, C


class LlamaLog:
    """llama.cpp's log, captured (``llama_log_set`` is process-wide, so this is one shared sink).

    Lines are kept in a ring buffer (tests and `fit` compare the KV-cache and buffer sizes llama.cpp
    reports with the plan) and echoed to stderr only when ``LOCALRUN_DEBUG``/``LOCALRUN_VERBOSE`` is set.
    ``mark()`` returns a running line count, so ``since(mark)`` stays right after the ring wraps.
    """

    lines: deque[str] = deque(maxlen=4000)
    total = 0  # lines ever captured
    _partial = ""
    _callback = None
    _lock = threading.Lock()
    echo = bool(os.environ.get("LOCALRUN_DEBUG") or os.environ.get("LOCALRUN_VERBOSE"))  # copy lines to stderr

    @classmethod
    def install(cls, C) -> None:
        if cls._callback is not None:
            return
        cls.mark()

        @C.llama_log_callback
        def _cb(level: int, text: bytes, user_data) -> None:
            s = text.decode("utf-8", errors="replace")
            with cls._lock:
                buf = cls._partial + s
                *done, cls._partial = buf.split("\n")
                cls.lines.extend(done)
                cls.total += len(done)
            if cls.echo:
                sys.stderr.write(s)

        cls._callback = _cb  # keep a reference: C holds only the pointer
        C.llama_log_set(_cb, ctypes.c_void_p(0))

    @classmethod
    def install_mtmd(cls, M) -> None:
        """Send the multimodal library's log (``llama_cpp.mtmd_cpp``: clip and mtmd-helper) to the same sink."""
        if cls._callback is not None:
            M.mtmd_log_set(cls._callback, ctypes.c_void_p(0))
            M.mtmd_helper_log_set(cls._callback, ctypes.c_void_p(0))

    @classmethod
    def mark(cls) -> int:
        """The running line count; also re-reads ``LOCALRUN_DEBUG``/``LOCALRUN_VERBOSE`` (a load logs ~2,000
        lines: the callback does not look the environment up for each)."""
        cls.echo = bool(os.environ.get("LOCALRUN_DEBUG") or os.environ.get("LOCALRUN_VERBOSE"))
        return cls.total

    @classmethod
    def since(cls, mark: int) -> list[str]:
        """Lines captured after ``mark`` (those still in the ring); a negative mark = the last -mark lines."""
        with cls._lock:
            lines = list(cls.lines)
            total = cls.total
        if mark < 0:
            return lines[mark:]
        n_new = total - mark
        return lines[len(lines) - min(n_new, len(lines)):] if n_new > 0 else []


def last_errors(lines: list[str]) -> str:
    errs = [ln.strip() for ln in lines if any(w in ln.lower() for w in ("error", "failed", "unable", "cannot"))]
    return "; ".join(errs[-3:]) or "no detail in llama.cpp's log"


def supports_gpu_offload() -> bool:
    """Whether the installed llama.cpp was built with a GPU backend (CUDA, Metal, Vulkan, …)."""
    _, C = import_llama()
    return bool(C.llama_supports_gpu_offload())


def cpu_advertises_amx() -> bool:
    if os.environ.get("LOCALRUN_ALLOW_AMX"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return "amx_tile" in f.read()
    except OSError:
        return False


def physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:  # pragma: no cover
        return os.cpu_count() or 1


def default_threads() -> int:
    """Threads for a llama.cpp context whose plan names none: ``LOCALRUN_THREADS`` when set
    (``config.env_threads``), else the physical cores. Raises ConfigError for a bad ``LOCALRUN_THREADS``."""
    from localrun.config import env_threads

    return env_threads() or physical_cores()


# llama.cpp common/common.h: LLM_FFN_EXPS_REGEX, the MoE expert tensors (`--n-cpu-moe`)
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


class _BuftOverride(ctypes.Structure):
    """llama.h ``struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; }``"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def ggml_lib(name: str):
    """The ggml library ``name`` as llama.cpp itself loaded it. pip wheels store ``libggml-cpu.so``,
    ``.so.0`` and ``.so.0.25.3`` as three separate files; libllama links the soname (``.so.0``), and
    loading another of them would give a second copy with its own buffer types (whose pointers the
    first copy does not recognise)."""
    import pathlib

    import llama_cpp
    from llama_cpp._ctypes_extensions import load_shared_library

    libdir = pathlib.Path(llama_cpp.__file__).parent / "lib"
    for soname in (f"lib{name}.so.0", f"lib{name}.0.dylib"):
        if (libdir / soname).exists():
            return ctypes.CDLL(str(libdir / soname))
    return load_shared_library(name, libdir)


def _cpu_device():
    """(ggml-base library, the CPU ``ggml_backend_dev_t``) from llama.cpp's backend registry."""
    import_llama()  # libllama first: it loads and registers the backends
    g, base = ggml_lib("ggml"), ggml_lib("ggml-base")
    g.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    g.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    return base, g.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU


def cpu_buffer_type() -> int:
    """The CPU device's buffer type (``ggml_backend_cpu_buffer_type()``: plain host memory; llama.cpp
    still considers the extra buffer types for a tensor overridden to it)."""
    base, dev = _cpu_device()
    base.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    base.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    return int(base.ggml_backend_dev_buffer_type(dev))


def extra_buffer_types() -> dict[str, int]:
    """The CPU backend's extra buffer types by name (``"AMX"``, ``"CPU_REPACK"``, ``"KLEIDIAI"``…), from
    ``ggml_backend_dev_get_extra_bufts`` (ggml-cpu.cpp), as llama-model.cpp ``make_cpu_buft_list`` finds
    them; empty if this build has none."""
    base, dev = _cpu_device()
    base.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    base.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    fp = base.ggml_backend_reg_get_proc_address(base.ggml_backend_dev_backend_reg(dev),
                                                b"ggml_backend_dev_get_extra_bufts")
    if not fp:
        return {}
    arr = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fp)(dev)
    out, i = {}, 0
    while arr and arr[i]:
        out[base.ggml_backend_buft_name(arr[i]).decode()] = int(arr[i])
        i += 1
    return out


def cpu_moe_overrides(n_cpu_moe: int, regex: str | None = None) -> list[tuple[str, int]]:
    """(pattern, buffer type) pairs keeping the MoE experts of the first ``n_cpu_moe`` layers in CPU
    memory, as llama.cpp's ``--n-cpu-moe N`` (common/common.h ``llm_add_n_cpu_ffn_overrides``): one pattern
    ``blk\\.{i}{regex}`` per layer (default ``FFN_EXPS_REGEX``), mapped to ``ggml_backend_cpu_buffer_type()``."""
    if n_cpu_moe <= 0:
        return []
    regex = regex or FFN_EXPS_REGEX
    cpu = cpu_buffer_type()
    return [(f"blk\\.{i}{regex}", cpu) for i in range(n_cpu_moe)]


def repack_patterns(spec, n_gpu_layers: int, has: dict[str, bool] | None = None) -> list[str]:
    """``localrun.model.repack.repack_patterns`` with ``has`` (default: the AVX2 / AVX-512 ggml detects
    here). Used when the AMX buffer type must stay off (see ``weight_overrides``)."""
    if has is None:
        cpu = ggml_lib("ggml-cpu")
        has = {"avx2": bool(cpu.ggml_cpu_has_avx2()), "avx512": bool(cpu.ggml_cpu_has_avx512())}
    return _patterns(spec, n_gpu_layers, has)


def weight_overrides(pairs: list[tuple[str, int]]):
    """The NULL-terminated ``llama_model_tensor_buft_override`` array for (pattern, buffer type) pairs
    (first match wins, as in llama-model-loader.cpp), or None for no pairs. Keep a reference to it
    while the model loads."""
    if not pairs:
        return None
    arr = (_BuftOverride * (len(pairs) + 1))()
    for i, (pattern, buft) in enumerate(pairs):
        arr[i].pattern = pattern.encode()
        arr[i].buft = buft
    return arr


def weight_placement(spec, plan, amx_advertised: bool):
    """Where llama.cpp puts each weight, for ``plan`` → (``tensor_buft_overrides`` array or None,
    ``use_extra_bufts``, whether weights were named to CPU_REPACK).

    * The MoE experts of the first ``plan.n_cpu_moe`` layers stay on the CPU (``cpu_moe_overrides``).
    * On a CPU that advertises AMX the extra buffer types are turned off: llama.cpp's AMX matmul dies with
      SIGILL (tilezero/tileloadd) on the first multi-token batch, because the compiler drops the on-stack
      tile config (ggml-cpu/amx/mmq.cpp ``ggml_tile_config_init``; llama.cpp PR #26954). The weights
      llama.cpp would have repacked for its AVX2/AVX-512 GEMM kernels are then named to CPU_REPACK one
      kind at a time (``repack_patterns``), so prompt processing keeps that speed-up.
      ``LOCALRUN_ALLOW_AMX=1`` (a fixed llama.cpp) and ``LOCALRUN_NO_REPACK=1`` change this.
    """
    pairs = cpu_moe_overrides(int(getattr(plan, "n_cpu_moe", 0) or 0))
    mode = repack_mode(amx_advertised)
    if mode == "all":
        return weight_overrides(pairs), True, False
    repack = extra_buffer_types().get("CPU_REPACK")
    pats = repack_patterns(spec, int(plan.n_gpu_layers)) if repack and mode == "named" else []
    return weight_overrides(pairs + [(p, repack) for p in pats]), False, bool(pats)
