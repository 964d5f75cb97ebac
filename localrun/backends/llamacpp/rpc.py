"""llama.cpp's RPC backend as a client: register workers, list their devices, ask their memory, time the link.

A worker (``localrun worker`` or llama.cpp's ``rpc-server``) serves its GPU or CPU over TCP. The client
registers it with ``ggml_backend_rpc_add_server(endpoint)`` (ggml/include/ggml-rpc.h), found through the
RPC registry as llama.cpp's common/arg.cpp ``add_rpc_devices`` does; the registry's devices go, in order and
before the local GPUs (src/llama.cpp: "add RPC servers at the front of the list"), into
``llama_model_params.devices`` (a NULL-terminated array) with the plan's ``tensor_split``.

Two facts of ggml-rpc.cpp shape everything around it:
- the client ABORTS the whole process when a worker disappears mid-call (``RPC_STATUS_ASSERT`` →
  ``GGML_ABORT``): ``localrun serve --rpc`` runs its engine in a runner subprocess (server/runner.py);
- a worker serves ONE client at a time (``ggml_backend_rpc_start_server`` accepts, serves until the
  client hangs up, then accepts the next; listen backlog 1): a second client waits until the first
  one disconnects. Every call here opens its connection and drops it before returning.

Every function needs a llama-cpp-python built with ``-DGGML_RPC=on`` and raises BackendUnavailableError
(with the reinstall command) without it, ConfigError for a worker that does not answer.
"""

from __future__ import annotations

import ctypes
import socket
import time
from dataclasses import dataclass

from localrun.errors import BackendUnavailableError, ConfigError

GGML_TYPE_I8 = 24  # ggml.h enum ggml_type
CONNECT_TIMEOUT_S = 3.0


@dataclass
class RpcDevice:
    """One device a worker offers: llama.cpp's ``ggml_backend_dev_t`` (an address), its name in llama.cpp's
    log (``RPC0``, ``RPC1``… in registration order), the worker's ``host:port``, and its memory (bytes)."""

    handle: int
    name: str
    endpoint: str
    free_bytes: int
    total_bytes: int


class _InitParams(ctypes.Structure):
    """ggml.h ``struct ggml_init_params { size_t mem_size; void * mem_buffer; bool no_alloc; }``"""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class Ggml:
    """ggml's backend API through ctypes, on the libraries llama.cpp itself loaded (``ggml_lib``)."""

    def __init__(self) -> None:
        from localrun.backends.llamacpp.lib import ggml_lib, import_llama
        from localrun.machine.rpc import RPC_REINSTALL

        import_llama()  # libllama first: it loads and registers the backends
        g, base = ggml_lib("ggml"), ggml_lib("ggml-base")
        vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        sigs = {
            (g, "ggml_backend_reg_by_name"): ([cp], vp), (g, "ggml_backend_dev_count"): ([], sz),
            (g, "ggml_backend_dev_get"): ([sz], vp),
            (base, "ggml_backend_reg_get_proc_address"): ([vp, cp], vp),
            (base, "ggml_backend_reg_dev_count"): ([vp], sz), (base, "ggml_backend_reg_dev_get"): ([vp, sz], vp),
            (base, "ggml_backend_dev_name"): ([vp], cp), (base, "ggml_backend_dev_description"): ([vp], cp),
            (base, "ggml_backend_dev_type"): ([vp], ctypes.c_int),
            (base, "ggml_backend_dev_memory"): ([vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
            (base, "ggml_backend_dev_buffer_type"): ([vp], vp),
            (base, "ggml_backend_buft_alloc_buffer"): ([vp, sz], vp),
            (base, "ggml_backend_buffer_get_base"): ([vp], vp), (base, "ggml_backend_buffer_free"): ([vp], None),
            (base, "ggml_init"): ([_InitParams], vp), (base, "ggml_free"): ([vp], None),
            (base, "ggml_new_tensor_1d"): ([vp, ctypes.c_int, ctypes.c_int64], vp),
            (base, "ggml_backend_tensor_alloc"): ([vp, vp, vp], ctypes.c_int),
            (base, "ggml_backend_tensor_set"): ([vp, vp, sz, sz], None),
            (base, "ggml_backend_tensor_get"): ([vp, vp, sz, sz], None),
        }
        for (lib, name), (args, res) in sigs.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = args, res
        self.g, self.base = g, base
        reg = g.ggml_backend_reg_by_name(b"RPC")
        add = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
        if not add:
            raise BackendUnavailableError("this llama-cpp-python has no RPC backend (ggml_backend_rpc_add_server)",
                                          hint=f"reinstall llama-cpp-python with RPC: {RPC_REINSTALL}")
        self._add_server = ctypes.CFUNCTYPE(vp, cp)(add)

    def add_server(self, endpoint: str) -> list[int]:
        """Register ``host:port`` (once per process: ggml-rpc keeps a map) → its devices' handles, in order.
        Raises ConfigError when nothing answers there or it offers no device."""
        host, port = split_endpoint(endpoint)
        check_reachable(host, port)
        reg = self._add_server(f"{host}:{port}".encode())
        n = self.base.ggml_backend_reg_dev_count(reg) if reg else 0
        if not n:
            raise ConfigError(f"RPC worker {endpoint} offers no device (is it an RPC server of this llama.cpp "
                              "version?)", hint="start it with `localrun worker` from the same localrun install")
        return [self.base.ggml_backend_reg_dev_get(reg, i) for i in range(n)]

    def memory(self, dev: int) -> tuple[int, int]:
        """(free, total) bytes of a device (an RPC device asks its worker: RPC_CMD_GET_DEVICE_MEMORY)."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def local_gpus(self) -> list[int]:
        """This machine's GPUs in llama.cpp's default order (discrete GPUs, else the integrated ones;
        src/llama.cpp ``llama_model_load_from_file_impl``), RPC devices excluded."""
        gpus, igpus = [], []
        for i in range(self.g.ggml_backend_dev_count()):
            d = self.g.ggml_backend_dev_get(i)
            kind = self.base.ggml_backend_dev_type(d)
            if (self.base.ggml_backend_dev_name(d) or b"").startswith(b"RPC"):
                continue
            if kind == 1:  # GGML_BACKEND_DEVICE_TYPE_GPU
                gpus.append(d)
            elif kind == 2:  # GGML_BACKEND_DEVICE_TYPE_IGPU
                igpus.append(d)
        return gpus or igpus

    def time_transfer(self, dev: int, n_bytes: int, rounds: int = 3) -> dict:
        """The link to a device, timed: a 4-byte read (one round trip: latency) and ``n_bytes`` written then
        read back (bandwidth) in a buffer allocated on the device and freed after. Best of ``rounds``.
        Returns {"latency_s", "bandwidth_gbps" (10^9 B/s, both directions averaged), "source"}."""
        ctx = self.base.ggml_init(_InitParams(1 << 16, None, True))
        buf = self.base.ggml_backend_buft_alloc_buffer(self.base.ggml_backend_dev_buffer_type(dev), n_bytes + 64)
        try:
            t = self.base.ggml_new_tensor_1d(ctx, GGML_TYPE_I8, n_bytes)
            if not buf or self.base.ggml_backend_tensor_alloc(buf, t, self.base.ggml_backend_buffer_get_base(buf)):
                raise ConfigError(f"could not allocate {n_bytes} bytes on the worker to time its link",
                                  hint="free memory there, or give the link with --rpc-link LAT_MS,GBPS")
            data = ctypes.create_string_buffer((bytes(range(256)) * (n_bytes // 256 + 1))[:n_bytes], n_bytes)
            small = ctypes.create_string_buffer(4)

            def timed(fn) -> float:
                best = float("inf")
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    fn()
                    best = min(best, time.perf_counter() - t0)
                return best

            get = self.base.ggml_backend_tensor_get
            rtt = timed(lambda: get(t, small, 0, 4))
            # a set is sent without waiting for an answer; the 4-byte get after it waits for both
            up = timed(lambda: (self.base.ggml_backend_tensor_set(t, data, 0, n_bytes), get(t, small, 0, 4)))
            down = timed(lambda: get(t, data, 0, n_bytes))
        finally:
            if buf:
                self.base.ggml_backend_buffer_free(buf)
            self.base.ggml_free(ctx)
        moved_s = max(1e-9, (up - rtt) + (down - rtt))
        return {"latency_s": rtt, "bandwidth_gbps": 2 * n_bytes / moved_s / 1e9,
                "source": f"measured ({n_bytes >> 20} MiB each way, best of {rounds})"}


_GGML: Ggml | None = None


def ggml() -> Ggml:
    """The process's ``Ggml`` (built once). Raises BackendUnavailableError without the RPC build."""
    global _GGML
    if _GGML is None:
        _GGML = Ggml()
    return _GGML


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) → (host, port). Raises ConfigError."""
    host, sep, port = endpoint.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--rpc {endpoint!r} is not host:port",
                          hint="list the workers as host:port, comma-separated, e.g. --rpc 192.168.1.20:50052")
    return host, int(port)


def parse_endpoints(text: str | None) -> list[str]:
    """``--rpc`` text → ``host:port`` strings, in order, duplicates dropped. Raises ConfigError."""
    out: list[str] = []
    for part in (text or "").split(","):
        if part.strip():
            host, port = split_endpoint(part)
            ep = f"{host}:{port}"
            if ep not in out:
                out.append(ep)
    if text is not None and not out:
        raise ConfigError("--rpc names no worker", hint="give host:port of each worker, comma-separated")
    return out


def check_reachable(host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> float:
    """Seconds a TCP connect to the worker took. Raises ConfigError when it does not answer (before llama.cpp
    tries: its client aborts the process on a refused connection in some paths)."""
    try:
        t0 = time.perf_counter()
        socket.create_connection((host, port), timeout=timeout_s).close()
        return time.perf_counter() - t0
    except OSError as e:
        raise ConfigError(f"RPC worker {host}:{port} does not answer ({e.strerror or e})",
                          hint="start it there with `localrun worker` (a non-loopback --host needs --allow "
                          "THIS_MACHINE's address), or fix the address in --rpc") from None


def worker_devices(endpoints: list[str], *, time_link: bool = False, transfer_bytes: int = 8 << 20) -> list:
    """Each worker's devices as ``GpuInfo(backend="rpc", endpoint=…, link=…)``, in llama.cpp's order, for
    the planner. Memory from ``ggml_backend_dev_memory`` (RPC_CMD_GET_DEVICE_MEMORY); ``time_link``: the
    link timed with a transfer of ``transfer_bytes`` (``Ggml.time_transfer``), else left to the planner
    (gigabit Ethernet, ``offload.links.ETHERNET_1G``). Raises BackendUnavailableError, ConfigError."""
    from localrun.machine.hardware import GpuInfo

    g, out = ggml(), []
    for ep in endpoints:
        for dev in g.add_server(ep):
            free, total = g.memory(dev)
            link = g.time_transfer(dev, transfer_bytes) if time_link else None
            name = (g.base.ggml_backend_dev_name(dev) or b"RPC").decode()
            out.append(GpuInfo(name=f"{name} ({ep})", vendor="rpc", backend="rpc", total_bytes=total,
                               free_bytes=free, index=len(out), endpoint=ep, link=link))
    return out


def model_devices(endpoints: list[str]):
    """``llama_model_params.devices`` for a model split over ``endpoints``' devices and then this machine's
    GPUs: a NULL-terminated ``ggml_backend_dev_t`` array (keep a reference while the model loads), and the
    number of devices in it (``tensor_split`` positions). Raises BackendUnavailableError, ConfigError."""
    g = ggml()
    devs = [d for ep in endpoints for d in g.add_server(ep)] + g.local_gpus()
    arr = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
    return arr, len(devs)


def plan_endpoints(plan) -> list[str]:
    """The RPC workers a plan's devices name (``Plan.devices[i]["endpoint"]``), in order, once each."""
    out: list[str] = []
    for d in getattr(plan, "devices", None) or []:
        ep = d.get("endpoint") if d.get("backend") == "rpc" else None
        if ep and ep not in out:
            out.append(ep)
    return out


def hardware_with_workers(hw, endpoints: list[str], *, time_link: bool = False, link: dict | None = None):
    """``hw`` with the workers' devices put first in ``hw.gpus`` (llama.cpp's order), for the planner.
    ``link``: the user's ``--rpc-link`` numbers, used instead of a measurement. Raises as ``worker_devices``."""
    import dataclasses

    devs = worker_devices(endpoints, time_link=time_link and link is None)
    if link is not None:
        for d in devs:
            d.link = dict(link)
    local = [g for g in hw.gpus if g.backend != "rpc"]
    return dataclasses.replace(hw, gpus=devs + local)


def hardware_for(rpc: str | None, models_dir=None):
    """``--rpc host:port,…`` of chat/serve/bench → this machine's profile with the workers' devices first
    (None without ``--rpc``: the caller probes as usual). Raises BackendUnavailableError (no RPC build:
    the reinstall command), ConfigError (bad text, a worker that does not answer)."""
    if not rpc:
        return None
    from localrun.machine.hardware import probe_hardware
    from localrun.machine.rpc import require_rpc

    endpoints = parse_endpoints(rpc)
    require_rpc(what="--rpc")
    return hardware_with_workers(probe_hardware(models_dir), endpoints)
