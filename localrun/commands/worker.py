"""`localrun worker`: offer this machine's GPU (or CPU) to another machine's llama.cpp over its RPC backend.

llama.cpp's RPC protocol has no authentication: whoever reaches the port can allocate memory and run
graphs on this machine (llama.cpp's own rpc-server README: "never run the RPC server on an open network").
So the worker binds 127.0.0.1 by default, and a non-loopback ``--host`` needs ``--allow CIDR`` (repeatable;
then llama.cpp's server listens on an ephemeral loopback port and an in-process relay on HOST:PORT passes
through only peers inside the networks) or ``--insecure`` (llama.cpp's server binds HOST:PORT itself, open
to anyone who reaches it). That check runs before anything else, so a refused worker has touched nothing.

The server runs in-process: ``ggml_backend_rpc_start_server`` (ggml/include/ggml-rpc.h) through ctypes,
found in the RPC backend's registry (``ggml_backend_reg_get_proc_address``, as llama.cpp's
tools/rpc/rpc-server.cpp does), offering the accelerators (else the CPU). It needs a llama-cpp-python built
with ``-DGGML_RPC=on`` (``localrun.machine.rpc``); without it the command exits 7 naming the reinstall.
"""

from __future__ import annotations

import ipaddress
from typing import List, Optional

import typer

DEFAULT_PORT = 50052


def register(app: typer.Typer) -> None:
    @app.command("worker")
    def worker(
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. Anything but loopback "
                                 "needs --allow CIDR or --insecure (the RPC protocol has no authentication)."),
        port: int = typer.Option(DEFAULT_PORT, "--port", min=1, max=65535, help="TCP port."),
        mem: Optional[str] = typer.Option(None, "--mem", help="Memory to offer, e.g. 20GiB (default: the "
                                          "devices' free memory); printed for the client's plan, since "
                                          "llama.cpp's RPC server cannot cap what a client allocates."),
        allow: List[str] = typer.Option([], "--allow", help="Client network allowed to connect, e.g. "
                                        "192.168.1.0/24 (repeatable); others are disconnected."),
        insecure: bool = typer.Option(False, "--insecure", help="Bind a non-loopback address with no client "
                                      "filter: anyone who reaches the port can use this machine."),
        cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help="Let the server cache tensors it "
                                                "received in this folder (llama.cpp rpc-server --cache)."),
        threads: Optional[int] = typer.Option(None, "--threads", "-t", min=1, help="CPU threads (CPU device)."),
    ) -> None:
        """Serve this machine's GPU/CPU to another machine's localrun over llama.cpp's RPC backend."""
        run_worker(host=host, port=port, mem=mem, allow=allow, insecure=insecure, cache_dir=cache_dir,
                   threads=threads)


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1). A wildcard (0.0.0.0, ::) or any other name
    is not."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_allow(allow: list[str]) -> list:
    """``--allow`` values → ip networks (a bare address is a /32 or /128). Raises ConfigError."""
    from localrun.errors import ConfigError

    nets = []
    for a in allow:
        try:
            nets.append(ipaddress.ip_network(a.strip(), strict=False))
        except ValueError:
            raise ConfigError(f"--allow {a!r} is not a network", hint="give a CIDR such as 192.168.1.0/24 "
                              "or one address such as 192.168.1.20") from None
    return nets


def check_bind(host: str, allow: list[str], insecure: bool) -> list:
    """The first check of ``localrun worker``: a non-loopback bind needs ``--allow`` or ``--insecure``.
    Returns the allowed networks ([] = no filter). Raises ConfigError (exit 9)."""
    from localrun.errors import ConfigError

    nets = parse_allow(allow)
    if not is_loopback(host) and not nets and not insecure:
        raise ConfigError(f"refusing to listen on {host}: llama.cpp's RPC protocol has no authentication, so "
                          "anyone who reaches the port could use this machine",
                          hint="add --allow CIDR for the machines that may connect (e.g. --allow 192.168.1.0/24), "
                          "or --insecure on a network you trust; the default --host 127.0.0.1 needs neither")
    return nets


def run_worker(*, host: str = "127.0.0.1", port: int = DEFAULT_PORT, mem: str | None = None,
               allow: list[str] | None = None, insecure: bool = False, cache_dir: str | None = None,
               threads: int | None = None) -> None:
    """Check the bind, the memory flag and the RPC build, then serve until Ctrl-C. Raises ConfigError (bind
    refused, bad --allow/--mem), BackendUnavailableError (no RPC in this build: the reinstall command)."""
    from localrun.machine.rpc import require_rpc
    from localrun.units import parse_bytes

    nets = check_bind(host, list(allow or []), insecure)  # before anything else
    mem_bytes = parse_bytes(mem, flag="--mem") if mem else None
    support = require_rpc(what="localrun worker")
    serve_rpc(support.lib_dir, host=host, port=port, nets=nets, mem_bytes=mem_bytes, cache_dir=cache_dir,
              threads=threads)


# -------------------------------------------------------------------------------------------------------
# the server (needs the RPC build: not exercised by the tests here, which run a build without it)
# -------------------------------------------------------------------------------------------------------

def serve_rpc(lib_dir: str, *, host: str, port: int, nets: list, mem_bytes: int | None, cache_dir: str | None,
              threads: int | None) -> None:
    """Start ``ggml_backend_rpc_start_server`` in a thread (ctypes releases the GIL during the call) and, with
    ``nets``, the filtering relay in front of it; print the devices and the memory offered; block."""
    import asyncio
    import ctypes
    import os
    import threading

    from localrun.machine.hardware import fmt_bytes
    from localrun.render import stderr

    g = _ggml(lib_dir)
    devices = _offered_devices(g)
    free = sum(f for _, _, f, _ in devices)
    if mem_bytes and mem_bytes > free:
        from localrun.errors import InsufficientMemoryError

        raise InsufficientMemoryError(f"--mem {fmt_bytes(mem_bytes)} is more than the {fmt_bytes(free)} free here",
                                      needed_bytes=mem_bytes, available_bytes=free,
                                      hint=f"use --mem {fmt_bytes(free)} or less, or leave it out")
    offered = mem_bytes or free
    inner = (host, port) if not nets else ("127.0.0.1", _free_port())
    n_threads = threads or os.cpu_count() or 1
    start = g.start_server
    arr = (ctypes.c_void_p * len(devices))(*[d for d, _, _, _ in devices])
    cache = cache_dir.encode() if cache_dir else None
    t = threading.Thread(target=start, args=(f"{inner[0]}:{inner[1]}".encode(), cache, n_threads, len(devices), arr),
                         daemon=True, name="ggml-rpc-server")
    t.start()
    err = stderr()
    for _, name, f, total in devices:
        err.print(f"device {name}: {fmt_bytes(f)} free of {fmt_bytes(total)}", highlight=False)
    err.print(f"offering {fmt_bytes(offered)} on {host}:{port}"
              + (f" to {', '.join(map(str, nets))}" if nets else "")
              + ("" if not mem_bytes else " (--mem: llama.cpp's RPC server cannot cap what a client allocates; "
                 "plan the client with it)"), highlight=False)
    if nets:
        asyncio.run(relay(host, port, inner, nets))
    else:
        t.join()


class _Ggml:
    pass


def _ggml(lib_dir: str):
    """ggml's device API and the RPC server entry point through ctypes (libggml + its registry)."""
    import ctypes
    from pathlib import Path

    lib = next((p for p in sorted(Path(lib_dir).glob("libggml.*")) if p.suffix in (".so", ".dylib")), None)
    ggml = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    ggml.ggml_backend_load_all.restype = None
    ggml.ggml_backend_load_all()
    ggml.ggml_backend_dev_count.restype = sz
    ggml.ggml_backend_dev_get.argtypes, ggml.ggml_backend_dev_get.restype = [sz], vp
    ggml.ggml_backend_dev_type.argtypes, ggml.ggml_backend_dev_type.restype = [vp], ctypes.c_int
    ggml.ggml_backend_dev_name.argtypes, ggml.ggml_backend_dev_name.restype = [vp], ctypes.c_char_p
    ggml.ggml_backend_dev_memory.argtypes = [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]
    ggml.ggml_backend_reg_by_name.argtypes, ggml.ggml_backend_reg_by_name.restype = [ctypes.c_char_p], vp
    ggml.ggml_backend_reg_get_proc_address.argtypes = [vp, ctypes.c_char_p]
    ggml.ggml_backend_reg_get_proc_address.restype = vp
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    addr = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_start_server") if reg else None
    if not addr:
        from localrun.errors import BackendUnavailableError
        from localrun.machine.rpc import RPC_REINSTALL

        raise BackendUnavailableError("ggml's RPC backend did not register ggml_backend_rpc_start_server",
                                      hint=f"reinstall llama-cpp-python with RPC: {RPC_REINSTALL}")
    proto = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, sz, sz, ctypes.POINTER(vp))
    out = _Ggml()
    out.lib, out.start_server = ggml, proto(addr)
    return out


def _offered_devices(g) -> list[tuple]:
    """(device handle, name, free bytes, total bytes) of the accelerators, else the CPU (rpc-server's rule:
    non-CPU devices first, tools/rpc/rpc-server.cpp get_devices)."""
    import ctypes

    lib, devs = g.lib, []
    for i in range(lib.ggml_backend_dev_count()):
        d = lib.ggml_backend_dev_get(i)
        devs.append((d, lib.ggml_backend_dev_type(d)))
    gpu = [d for d, kind in devs if kind in (1, 2)]  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
    chosen = gpu or [d for d, kind in devs if kind == 0][:1]  # GGML_BACKEND_DEVICE_TYPE_CPU
    out = []
    for d in chosen:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        out.append((d, lib.ggml_backend_dev_name(d).decode(), free.value, total.value))
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -------------------------------------------------------------------------------------------------------
# the relay in front of the server: only peers inside --allow get through
# -------------------------------------------------------------------------------------------------------

def peer_allowed(peer_ip: str, nets: list) -> bool:
    """Whether ``peer_ip`` lies in one of ``nets`` (IPv4-mapped IPv6 addresses count as IPv4)."""
    ip = ipaddress.ip_address(peer_ip.split("%")[0])
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return any(ip.version == n.version and ip in n for n in nets)


async def relay(host: str, port: int, target: tuple[str, int], nets: list, *, ready=None, log=None) -> None:
    """Listen on ``host:port``; pass each connection from a peer in ``nets`` through to ``target`` byte for
    byte, close the others at once (one line on ``log``, default stderr). ``ready``: an asyncio.Event-like
    object given the bound port as ``ready.port`` and then set (tests bind port 0). Runs until cancelled."""
    import asyncio

    log = log or _stderr_line

    async def pipe(r, w):
        try:
            while data := await r.read(1 << 16):
                w.write(data)
                await w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    async def handle(r, w):
        peer = w.get_extra_info("peername")[0]
        if not peer_allowed(peer, nets):
            log(f"refused {peer}: not in --allow {', '.join(map(str, nets))}")
            w.close()
            return
        try:
            tr, tw = await asyncio.open_connection(*target)
        except OSError as e:
            log(f"cannot reach the RPC server at {target[0]}:{target[1]}: {e}")
            w.close()
            return
        await asyncio.gather(pipe(r, tw), pipe(tr, w))

    server = await asyncio.start_server(handle, host, port)
    if ready is not None:
        ready.port = server.sockets[0].getsockname()[1]
        ready.set()
    async with server:
        await server.serve_forever()


def _stderr_line(msg: str) -> None:
    from localrun.render import stderr

    stderr().print(msg, highlight=False)
