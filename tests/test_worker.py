"""`localrun worker` refusals, the RPC-build probe (`localrun hw`, `fit --rpc`), and the --allow relay.

Fast tier, in-process CLI. The RPC server itself (ggml_backend_rpc_start_server) needs a llama-cpp-python
built with -DGGML_RPC=on; the tests that would reach it skip on such a build (they would start a server)."""

from __future__ import annotations

import asyncio
import ipaddress
import json

import pytest
from helpers import localrun_inprocess

from localrun.commands.worker import is_loopback, peer_allowed, relay
from localrun.machine.rpc import RPC_REINSTALL, probe_rpc

RPC = probe_rpc()
needs_no_rpc = pytest.mark.skipif(RPC.available, reason="this llama-cpp-python has RPC: the command would serve")


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::", "myhost.lan"])
def test_non_loopback_bind_is_refused_before_anything_else(host):
    # a bad --mem and (here) a build without RPC would fail later: the bind check comes first
    r = localrun_inprocess("worker", "--host", host, "--mem", "24")
    assert r.returncode == 9, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: refusing to listen on {host}: llama.cpp's RPC protocol has no authentication")
    assert lines[1].startswith("hint: add --allow CIDR") and "--insecure" in lines[1] and len(lines) == 2
    assert r.stdout == ""


def test_bad_allow_and_mem_are_config_errors():
    r = localrun_inprocess("worker", "--host", "192.168.1.5", "--allow", "192.168.1.0/33")
    assert r.returncode == 9 and "--allow '192.168.1.0/33' is not a network" in r.stderr
    r = localrun_inprocess("worker", "--mem", "24")  # loopback: the bind passes, the size does not
    assert r.returncode == 9 and "--mem" in r.stderr and "24GiB" in r.stderr


@needs_no_rpc
@pytest.mark.parametrize("args", [(), ("--host", "192.168.1.5", "--allow", "192.168.1.0/24"),
                                  ("--host", "0.0.0.0", "--insecure"), ("--host", "localhost", "--mem", "8GiB")])
def test_without_the_rpc_build_the_error_names_the_reinstall(args):
    r = localrun_inprocess("worker", *args)
    assert r.returncode == 7, r.stderr
    assert "error: localrun worker needs llama.cpp's RPC backend" in r.stderr
    assert RPC_REINSTALL in r.stderr and "--no-cache-dir" in r.stderr and "cached" in r.stderr


@needs_no_rpc
def test_fit_rpc_without_the_rpc_build():
    r = localrun_inprocess("fit", "--rpc", "127.0.0.1:50052", "--preset", "nvidia-24gb")
    assert r.returncode == 7 and RPC_REINSTALL in r.stderr
    r = localrun_inprocess("fit", "--rpc-link", "1,1")
    assert r.returncode == 9 and "--rpc host:port" in r.stderr


def test_rpc_probe_agrees_with_llama_cpp(tmp_path):
    import llama_cpp

    assert RPC.available == bool(llama_cpp.llama_supports_rpc())
    assert RPC.lib_dir and (RPC.available or "-DGGML_RPC=on" in RPC.detail)
    (tmp_path / "libggml-rpc.so").write_bytes(b"")  # a build with RPC ships this library
    found = probe_rpc(tmp_path)
    assert found.available and found.library.endswith("libggml-rpc.so")
    (tmp_path / "libggml-rpc.so").unlink()
    assert not probe_rpc(tmp_path).available
    assert not probe_rpc(tmp_path / "missing").available


def test_hw_reports_rpc(isolated_home):
    r = localrun_inprocess("hw", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["rpc"]["available"] == RPC.available and d["rpc"]["detail"] == RPC.detail
    t = localrun_inprocess("hw", env={"COLUMNS": "300"})
    line = next(x for x in t.stdout.splitlines() if x.startswith("RPC backend"))
    assert RPC.detail in line and ((RPC_REINSTALL in line) != RPC.available)


def test_loopback_rules():
    for h in ("127.0.0.1", "127.1.2.3", "::1", "localhost", "[::1]"):
        assert is_loopback(h), h
    for h in ("0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "example.lan", ""):
        assert not is_loopback(h), h
    nets = [ipaddress.ip_network("192.168.1.0/24"), ipaddress.ip_network("fd00::/8")]
    assert peer_allowed("192.168.1.77", nets) and peer_allowed("::ffff:192.168.1.9", nets)
    assert peer_allowed("fd12::1", nets)
    assert not peer_allowed("192.168.2.1", nets) and not peer_allowed("127.0.0.1", nets)


def test_relay_passes_allowed_peers_and_closes_the_others():
    """The relay in front of llama.cpp's server, against a loopback echo server standing in for it."""

    async def main():
        async def echo(r, w):
            while data := await r.read(1024):
                w.write(data)
                await w.drain()
            w.close()

        target = await asyncio.start_server(echo, "127.0.0.1", 0)
        tport = target.sockets[0].getsockname()[1]
        logs: list[str] = []
        results = {}
        for name, cidr in (("allowed", "127.0.0.0/8"), ("refused", "10.0.0.0/8")):
            ready = asyncio.Event()
            task = asyncio.create_task(relay("127.0.0.1", 0, ("127.0.0.1", tport),
                                             [ipaddress.ip_network(cidr)], ready=ready, log=logs.append))
            await ready.wait()
            r, w = await asyncio.open_connection("127.0.0.1", ready.port)
            w.write(b"graph")
            await w.drain()
            try:
                results[name] = await asyncio.wait_for(r.read(1024), 5)
            except ConnectionResetError:  # closed with our bytes unread: a reset instead of an EOF
                results[name] = b""
            w.close()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        target.close()
        return results, logs

    results, logs = asyncio.run(main())
    assert results == {"allowed": b"graph", "refused": b""}
    assert logs == ["refused 127.0.0.1: not in --allow 10.0.0.0/8"]


@pytest.mark.skipif(not RPC.available, reason="needs llama-cpp-python with RPC (-DGGML_RPC=on)")
def test_a_worker_behind_its_allow_relay_answers_an_allowed_client():
    """A real worker with --allow: llama.cpp's server on an ephemeral loopback port, the relay on --port; an
    RPC client inside the network registers its device and reads its memory through the relay."""
    import socket
    import subprocess
    import sys
    import time

    from localrun.backends.llamacpp.rpc import worker_devices

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "localrun", "worker", "--port", str(port), "--allow", "127.0.0.0/8",
                             "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.2)
        devs = worker_devices([f"127.0.0.1:{port}"])
        assert len(devs) == 1 and devs[0].backend == "rpc" and devs[0].endpoint == f"127.0.0.1:{port}"
        assert 0 < devs[0].free_bytes <= devs[0].total_bytes
    finally:
        proc.kill()
        err = proc.communicate(timeout=10)[1]
    assert f"on 127.0.0.1:{port} to 127.0.0.0/8" in err
