"""`serve --rpc` ends every process it started: SIGTERM (or SIGINT) to the front stops its runner before the
front exits, whether the runner is still loading or the front is serving. Before, SIGTERM left the runner
running under PID 1 with the model loaded: uvicorn re-raises SIGTERM after its own shutdown and the
default action ended the front without running its ``finally``.

The front is ``server.runner.run_front`` in a real process; its runner a stand-in (no llama.cpp): a small
HTTP server that answers /health and writes its pid, so the fast tier checks the process tree. The same
front runs `localrun serve --rpc` (``commands/serve_rpc.py``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

_RUNNER = r"""
import http.server, os, sys, time
port, pidfile, delay = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
open(pidfile, "w").write(str(os.getpid()))
time.sleep(delay)  # "loading the model"

class Health(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""

_FRONT = r"""
import sys
from localrun.server.runner import run_front
runner, pidfile, delay, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    sys.exit(run_front(lambda p: [sys.executable, runner, str(p), pidfile, delay], [], "127.0.0.1", port,
                       log_level="warning"))
except KeyboardInterrupt:  # as localrun.cli.main ends on Ctrl-C
    sys.exit(130)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _until(cond, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _serving(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"GET /health HTTP/1.0\r\nHost: front\r\n\r\n")
            return s.recv(16).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("when", ["loading", "serving"])
def test_a_signal_to_the_front_ends_its_runner(tmp_path, sig, when):
    """While the runner loads (the front waits for its first /health) and while the front serves (uvicorn
    holds the signal, shuts down, then raises it again). ~0.4 s per case loading, ~1 s serving."""
    runner, front, pidfile = tmp_path / "runner.py", tmp_path / "front.py", tmp_path / "runner.pid"
    runner.write_text(_RUNNER)
    front.write_text(_FRONT)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(front), str(runner), str(pidfile),
                             "0" if when == "serving" else "600", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    runner_pid = None
    try:
        _until(lambda: pidfile.exists() and pidfile.read_text().strip(), "the front never started its runner")
        runner_pid = int(pidfile.read_text())
        if when == "serving":
            _until(lambda: _serving(port), "the front never served its runner's /health")
        assert psutil.Process(runner_pid).ppid() == proc.pid
        proc.send_signal(sig)
        proc.wait(60)
        assert not _alive(runner_pid), f"the runner (pid {runner_pid}) outlived the front"
        if sig == signal.SIGTERM:
            assert proc.returncode == -signal.SIGTERM  # ends by the signal, as `serve` without --rpc does
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if runner_pid is not None and _alive(runner_pid):
            os.kill(runner_pid, signal.SIGKILL)


@pytest.mark.model
def test_serve_rpc_sigterm_leaves_no_process_behind(smollm_path, tmp_path):
    """The real thing: `localrun serve --rpc` on a loopback worker, SIGTERM once it serves; every process it
    started (its runner, with the model loaded over RPC) is gone when it has exited."""
    from localrun.machine.rpc import RPC_REINSTALL, probe_rpc

    rpc = probe_rpc()
    if not rpc.available:
        pytest.skip(f"llama-cpp-python without RPC ({rpc.detail}); {RPC_REINSTALL}")
    wport, port = _free_port(), _free_port()
    env = {**os.environ, "LOCALRUN_HOME": str(tmp_path)}
    env.pop("LOCALRUN_API_KEY", None)
    worker = subprocess.Popen([sys.executable, "-m", "localrun", "worker", "--port", str(wport), "--threads", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    front = None
    started: list[psutil.Process] = []
    try:
        _until(lambda: _connects(wport), "the RPC worker never listened")
        front = subprocess.Popen([sys.executable, "-m", "localrun", "serve", str(smollm_path), "--rpc",
                                  f"127.0.0.1:{wport}", "--port", str(port), "--ctx", "512", "--parallel", "1",
                                  "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 env=env)
        _until(lambda: front.poll() is not None or _serving(port), "serve --rpc never served", timeout_s=180)
        assert front.poll() is None, front.stderr.read()
        started = psutil.Process(front.pid).children(recursive=True)
        assert started, "serve --rpc runs its engine in a runner process"
        front.send_signal(signal.SIGTERM)
        front.wait(60)
        _until(lambda: not any(_alive(p.pid) for p in started), "a process serve --rpc started outlived it",
               timeout_s=10)
        assert front.returncode == -signal.SIGTERM
    finally:
        for p in started:
            if _alive(p.pid):
                p.kill()
        if front is not None and front.poll() is None:
            front.kill()
            front.wait()
        worker.kill()
        worker.wait()


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False
