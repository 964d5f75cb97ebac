"""Loading llama-cpp-python's C library and capturing llama.cpp's log; small facts about this machine
that decide llama.cpp parameters (GPU offload support, AMX, physical cores)."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections import deque

from localrun.errors import BackendUnavailableError


def _import_llama():
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

    @classmethod
    def install(cls, C) -> None:
        if cls._callback is not None:
            return

        @C.llama_log_callback
        def _cb(level: int, text: bytes, user_data) -> None:
            s = text.decode("utf-8", errors="replace")
            with cls._lock:
                buf = cls._partial + s
                *done, cls._partial = buf.split("\n")
                cls.lines.extend(done)
                cls.total += len(done)
            if os.environ.get("LOCALRUN_DEBUG") or os.environ.get("LOCALRUN_VERBOSE"):
                sys.stderr.write(s)

        cls._callback = _cb  # keep a reference: C holds only the pointer
        C.llama_log_set(_cb, ctypes.c_void_p(0))

    @classmethod
    def mark(cls) -> int:
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


def _last_errors(lines: list[str]) -> str:
    errs = [ln.strip() for ln in lines if any(w in ln.lower() for w in ("error", "failed", "unable", "cannot"))]
    return "; ".join(errs[-3:]) or "no detail in llama.cpp's log"


def supports_gpu_offload() -> bool:
    """Whether the installed llama.cpp was built with a GPU backend (CUDA, Metal, Vulkan, …)."""
    _, C = _import_llama()
    return bool(C.llama_supports_gpu_offload())


def _cpu_advertises_amx() -> bool:
    if os.environ.get("LOCALRUN_ALLOW_AMX"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return "amx_tile" in f.read()
    except OSError:
        return False


def _physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:  # pragma: no cover
        return os.cpu_count() or 1


# llama.cpp common/common.h: LLM_FFN_EXPS_REGEX, the MoE expert tensors (`--n-cpu-moe`)
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


class _BuftOverride(ctypes.Structure):
    """llama.h ``struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; }``"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def cpu_moe_overrides(n_cpu_moe: int, regex: str = FFN_EXPS_REGEX):
    """``tensor_buft_overrides`` keeping the MoE experts of the first ``n_cpu_moe`` layers in CPU memory,
    as llama.cpp's ``--n-cpu-moe N`` (common/common.h ``llm_add_n_cpu_ffn_overrides``): one pattern
    ``blk\\.{i}{regex}`` per layer, mapped to ``ggml_backend_cpu_buffer_type()``, NULL-terminated.

    Returns the ctypes array (keep a reference while the model loads), or None for n_cpu_moe <= 0.
    """
    if n_cpu_moe <= 0:
        return None
    import pathlib

    import llama_cpp
    from llama_cpp._ctypes_extensions import load_shared_library

    lib = load_shared_library("ggml-cpu", pathlib.Path(llama_cpp.__file__).parent / "lib")
    lib.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    cpu = lib.ggml_backend_cpu_buffer_type()
    arr = (_BuftOverride * (n_cpu_moe + 1))()
    for i in range(n_cpu_moe):
        arr[i].pattern = f"blk\\.{i}{regex}".encode()
        arr[i].buft = cpu
    return arr
