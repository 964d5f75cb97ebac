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


def probe_rpc_workers(endpoints: list[str], link: dict | None = None, lib_dir: str | Path | None = None) -> list:
    """Each worker's devices as ``GpuInfo(backend="rpc", endpoint=…, link=…)``, RPC devices in llama.cpp's
    order. Memory from ``ggml_backend_dev_memory`` on the RPC registry's devices (for an RPC device that is
    ``ggml_backend_rpc_get_device_memory``, ggml-rpc.cpp); the link's latency from the TCP connect time
    (one round trip), its bandwidth from ``link`` (``--rpc-link``) else gigabit Ethernet's (a timed transfer
    would replace it). Raises BackendUnavailableError without the RPC build, ConfigError for a worker that
    does not answer. Needs the RPC build: not exercised by the tests here."""
    import ctypes
    import socket
    import time

    from localrun.errors import ConfigError
    from localrun.machine.hardware import GpuInfo

    support = require_rpc(lib_dir, what="fit --rpc")
    lib = next(p for p in sorted(Path(support.lib_dir).glob("libggml.*")) if p.suffix in (".so", ".dylib"))
    g = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    g.ggml_backend_load_all()
    g.ggml_backend_reg_by_name.argtypes, g.ggml_backend_reg_by_name.restype = [ctypes.c_char_p], vp
    g.ggml_backend_reg_get_proc_address.argtypes = [vp, ctypes.c_char_p]
    g.ggml_backend_reg_get_proc_address.restype = vp
    g.ggml_backend_reg_dev_count.argtypes, g.ggml_backend_reg_dev_count.restype = [vp], sz
    g.ggml_backend_reg_dev_get.argtypes, g.ggml_backend_reg_dev_get.restype = [vp, sz], vp
    g.ggml_backend_dev_description.argtypes, g.ggml_backend_dev_description.restype = [vp], ctypes.c_char_p
    g.ggml_backend_dev_memory.argtypes = [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]
    reg = g.ggml_backend_reg_by_name(b"RPC")
    add_addr = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    add = ctypes.CFUNCTYPE(vp, ctypes.c_char_p)(add_addr)
    out = []
    for ep in endpoints:
        host, _, port = ep.rpartition(":")
        try:
            t0 = time.perf_counter()
            socket.create_connection((host, int(port)), timeout=3).close()
            rtt = time.perf_counter() - t0
        except (OSError, ValueError) as e:
            raise ConfigError(f"RPC worker {ep} does not answer: {e}",
                              hint="start it there: `localrun worker --host ADDRESS --allow THIS_MACHINE`") from None
        wreg = add(ep.encode())
        lk = dict(link) if link else {"latency_s": rtt, "bandwidth_gbps": 0.117, "source": "connect time; "
                                      "bandwidth assumed (gigabit)"}
        for i in range(g.ggml_backend_reg_dev_count(wreg)):
            d = g.ggml_backend_reg_dev_get(wreg, i)
            free, total = sz(), sz()
            g.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
            out.append(GpuInfo(name=(g.ggml_backend_dev_description(d) or b"RPC").decode(), vendor="rpc",
                               backend="rpc", total_bytes=total.value, free_bytes=free.value, index=len(out),
                               endpoint=ep, link=lk))
    return out
