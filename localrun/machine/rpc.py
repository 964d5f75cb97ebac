"""Whether this llama-cpp-python build has llama.cpp's RPC backend (ggml-rpc), and the fix when not.

llama-cpp-python builds ggml's RPC backend only when compiled with ``-DGGML_RPC=on``: then its ``lib``
folder holds ``libggml-rpc`` (or, in a static build, a library exporting ``ggml_backend_rpc_start_server``,
ggml/include/ggml-rpc.h). The probe looks at files and exported symbols only; it never imports llama_cpp.
pip caches the wheel it built, so a plain reinstall can bring the old build back: ``--no-cache-dir``.
"""

from __future__ import annotations

import ctypes
import importlib.util
from dataclasses import asdict, dataclass
from pathlib import Path

RPC_REINSTALL = 'CMAKE_ARGS="-DGGML_RPC=on" pip install --no-cache-dir --force-reinstall llama-cpp-python'
RPC_SYMBOL = "ggml_backend_rpc_start_server"


@dataclass
class RpcSupport:
    available: bool
    library: str | None  # the file that provides the RPC backend
    lib_dir: str | None  # llama_cpp's lib folder
    detail: str  # one line for `localrun hw`

    def to_dict(self) -> dict:
        return asdict(self)


def llama_cpp_lib_dir() -> Path | None:
    """llama_cpp's ``lib`` folder (found without importing the package), or None when not installed."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return lib if lib.is_dir() else None


def _exports(path: Path, symbol: str) -> bool:
    try:
        return hasattr(ctypes.CDLL(str(path)), symbol)
    except OSError:
        return False


def probe_rpc(lib_dir: str | Path | None = None) -> RpcSupport:
    """Look for the RPC backend in ``lib_dir`` (default: llama_cpp's): a ``*ggml-rpc*`` library, or one of
    the ggml/llama libraries exporting ``ggml_backend_rpc_start_server``. Never raises."""
    d = Path(lib_dir) if lib_dir is not None else llama_cpp_lib_dir()
    if d is None or not d.is_dir():
        return RpcSupport(False, None, None, "llama-cpp-python is not installed")
    libs = sorted(p for p in d.iterdir() if p.suffix in (".so", ".dylib", ".dll"))
    for p in libs:
        if "ggml-rpc" in p.name:
            return RpcSupport(True, str(p), str(d), f"available ({p.name})")
    for p in libs:
        if p.name.startswith(("libggml", "ggml", "libllama", "llama")) and _exports(p, RPC_SYMBOL):
            return RpcSupport(True, str(p), str(d), f"available ({p.name} exports {RPC_SYMBOL})")
    return RpcSupport(False, None, str(d), "not in this llama-cpp-python build (compiled without -DGGML_RPC=on)")


def require_rpc(lib_dir: str | Path | None = None, *, what: str = "this") -> RpcSupport:
    """``probe_rpc``, raising BackendUnavailableError with the reinstall command when RPC is missing."""
    from localrun.errors import BackendUnavailableError

    s = probe_rpc(lib_dir)
    if not s.available:
        raise BackendUnavailableError(
            f"{what} needs llama.cpp's RPC backend, and it is {s.detail}",
            hint=f"reinstall llama-cpp-python with RPC: {RPC_REINSTALL} (--no-cache-dir: pip would otherwise "
            "reuse the wheel it built and cached without RPC; the compile takes several minutes)")
    return s

