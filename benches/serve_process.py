"""The server processes the serving benches run (``serve_concurrency.py``, ``serve_concurrency_mlx.py``,
``serve_mixed.py``) and the CPU they use: ``Server`` (one subprocess on a loopback port, ready when it
names its model, stopped idempotently), ``free_port``, and ``CpuWindow`` (cores used by the server, its
event-loop thread, this client, everything else, and the hypervisor's steal, from /proc jiffies).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


# ------------------------------------------------------------------------------------------------ CPU
def _cpu_line() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def _busy_jiffies() -> int:
    """Busy CPU time of the whole machine (all cores), clock ticks, from /proc/stat."""
    v = _cpu_line()
    return sum(v[:8]) - v[3] - (v[4] if len(v) > 4 else 0) - _steal_jiffies(v)  # minus idle, iowait, steal


def _steal_jiffies(v: list[int] | None = None) -> int:
    """Time the hypervisor gave this VM's CPUs to other guests (/proc/stat "steal"), clock ticks."""
    v = v if v is not None else _cpu_line()
    return v[7] if len(v) > 7 else 0


def _proc_jiffies(pid: int, tid: int | None = None) -> int:
    """utime + stime of one process (all its threads), or of its thread ``tid``, clock ticks."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, IndexError, ValueError):
        return 0


class CpuWindow:
    """CPU used by the server, by this client and by everything else between ``__init__`` and ``stop``.

    ``loop_cores`` is the server's main thread alone: uvicorn's asyncio event loop (HTTP, JSON, SSE) in both
    servers; the model runs on other threads (localrun's scheduler thread, llama-cpp-python's threadpool
    worker, llama.cpp's compute threads)."""

    def __init__(self, server_pid: int) -> None:
        self.pid, self.tck = server_pid, os.sysconf("SC_CLK_TCK")
        self.t0, self.all0, self.steal0 = time.perf_counter(), _busy_jiffies(), _steal_jiffies()
        self.srv0, self.me0 = _proc_jiffies(server_pid), _proc_jiffies(os.getpid())
        self.loop0 = _proc_jiffies(server_pid, server_pid)

    def stop(self) -> dict:
        wall = max(1e-9, time.perf_counter() - self.t0)
        srv = _proc_jiffies(self.pid) - self.srv0
        loop = _proc_jiffies(self.pid, self.pid) - self.loop0
        me = _proc_jiffies(os.getpid()) - self.me0
        other = max(0, _busy_jiffies() - self.all0 - srv - me)
        c = lambda j: j / self.tck / wall  # noqa: E731  (cores)
        return {"server_cores": c(srv), "loop_cores": c(loop), "client_cores": c(me), "other_cores": c(other),
                "steal_cores": c(_steal_jiffies() - self.steal0)}


# ------------------------------------------------------------------------------------------------ servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    """One server subprocess on a loopback port; ``stop()`` is idempotent (terminate, then kill)."""

    def __init__(self, name: str, argv: list[str], port: int, log_dir: str, env: dict | None = None) -> None:
        env_extra = env
        self.name, self.port = name, port
        self.base = f"http://{HOST}:{port}"
        self.log_path = os.path.join(log_dir, f"{name}.log")
        env = {k: v for k, v in os.environ.items()
               if k not in ("HOST", "PORT", "MODEL", "CONFIG_FILE", "LOCALRUN_API_KEY", "LOCALRUN_HOST",
                            "LOCALRUN_PORT", "LOCALRUN_BACKEND", "LOCALRUN_COUNT_UBATCHES")}
        env.update(env_extra or {})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=str(ROOT))
        self.model_id = ""

    def ready_model(self) -> str | None:
        """The model id requests name, once the server answers (``/v1/models``' first entry); None before."""
        import httpx

        r = httpx.get(self.base + "/v1/models", timeout=5.0)
        return r.json()["data"][0]["id"] if r.status_code == 200 else None

    def wait_ready(self, timeout_s: float) -> None:
        """Poll ``ready_model`` until it answers; raises RuntimeError if the process exits or time runs out."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                model = self.ready_model()
                if model is not None:
                    self.model_id = model
                    return
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            self._log.flush()
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
