"""llama.cpp's own llama-server as the peer of benches/kv_tiers.py: the same resumed conversation with its
RAM prompt cache (``--cache-ram``) and its slot save/restore (``--slot-save-path``,
``POST /slots/0?action=save|restore``), one slot, the same threads and context as localrun.

The cases (each the next turn of the conversation, the prompt sent as token ids):
  cold    the conversation, nothing cached;
  ram     another prompt takes the slot (llama-server moves the slot's prompt to its RAM cache), then the
          next turn: the RAM cache's best match is loaded;
  disk    the slot saved to a file, another prompt takes the slot, the file restored, then the next turn
          (TTFT counts the restore call too);
  restart the slot saved, the server stopped and started again, the file restored, the next turn.
TTFT is the wall time of a 1-token request on localhost (+ the restore call), ``cached`` the prompt
tokens llama-server did not evaluate (``timings.prompt_n``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on a free port (``{port}`` in ``argv`` is replaced by it); ``start`` waits for /health,
    ``stop`` ends it. llama-server (``LlamaServer``) and the agent-session bench start theirs with it."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict | None = None) -> None:
        self.name, self.argv, self.log, self.env = name, argv, log, env
        self.proc = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 600.0) -> "Server":
        import httpx

        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([a.replace("{port}", str(self.port)) for a in self.argv], stdout=log,
                                         stderr=subprocess.STDOUT, env=self.env)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); see {self.log}:\n"
                                   + self.log.read_text(errors="replace")[-2000:])
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"{self.name} did not start in {timeout_s:.0f} s; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class LlamaServer:
    """A llama-server process: ``-np 1`` with ``--cache-ram`` and ``--slot-save-path`` (``--no-repack`` where the
    CPU advertises AMX, as localrun); ``stop`` ends it."""

    def __init__(self, binary: str, model: Path, n_ctx: int, threads: int, slot_dir: Path, log: Path):
        self.binary, self.model, self.n_ctx, self.threads, self.slot_dir, self.log = \
            binary, model, n_ctx, threads, slot_dir, log
        self.proc = None
        self.url = ""

    def start(self, timeout_s: float = 300.0) -> "LlamaServer":

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        Path(self.slot_dir).mkdir(parents=True, exist_ok=True)  # llama-server exits (usage, 1) without it
        cmd = [self.binary, "-m", str(self.model), "-c", str(self.n_ctx), "-np", "1", "-t", str(self.threads),
               "-tb", str(self.threads), "--host", "127.0.0.1", "--port", str(port), "--cache-ram", "4096",
               "--slot-save-path", str(self.slot_dir)]
        from localrun.backends.llamacpp.lib import cpu_advertises_amx

        if cpu_advertises_amx():  # llama.cpp's AMX kernels crash here (SIGSEGV at load); localrun turns them off
            cmd.append("--no-repack")
        self._server = Server("llama-server", cmd, Path(self.log))
        self._server.port, self._server.url = port, self.url
        self._server.start(timeout_s)
        self.proc = self._server.proc
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self._server.stop()
        self.proc = None

    def complete(self, tokens: list[int]) -> tuple[float, int, list[int]]:
        """(wall seconds, prompt tokens not evaluated, generated ids) of a greedy 1-token completion."""
        import httpx

        t0 = time.perf_counter()
        r = httpx.post(self.url + "/completion", timeout=1200,
                       json={"prompt": tokens, "n_predict": 1, "temperature": 0, "cache_prompt": True,
                             "return_tokens": True})
        dt = time.perf_counter() - t0
        r.raise_for_status()
        d = r.json()
        return dt, len(tokens) - int(d["timings"]["prompt_n"]), list(d.get("tokens") or [])

    def slot(self, action: str, filename: str) -> float:
        """POST /slots/0?action=save|restore → wall seconds. A refusal is printed (the request after it then
        shows what llama-server reuses without it), not raised."""
        import httpx

        t0 = time.perf_counter()
        r = httpx.post(self.url + f"/slots/0?action={action}", json={"filename": filename}, timeout=600)
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            print(f"  llama-server refused slot {action}: {r.status_code} {r.text[:300]}", flush=True)
        return dt


def peer_round(binary: str, model: Path, n_ctx: int, threads: int, prompt: list[int], other: list[int],
               turn) -> dict:
    """The four cases on llama-server for one conversation ``prompt``; ``turn(k)`` → the token ids of the
    k-th next user turn. Returns {case: TTFT s, case_cached: tokens, "n_prompt": tokens}."""
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="kv_tiers_peer-") as d:
        srv = LlamaServer(binary, model, n_ctx, threads, Path(d), Path(d) / "server.log").start()
        try:
            out["cold"], out["cold_cached"], gen = srv.complete(prompt)
            held = prompt + gen
            resume = held + turn(1)
            srv.complete(other)  # the slot is taken: its prompt goes to the RAM cache
            out["ram"], out["ram_cached"], gen = srv.complete(resume)
            out["ram_n"] = len(resume)
            held = resume + gen
            resume = held + turn(2)
            srv.slot("save", "conv.bin")
            srv.complete(other)
            t_restore = srv.slot("restore", "conv.bin")
            dt, out["disk_cached"], gen = srv.complete(resume)
            out["disk"], out["disk_n"] = t_restore + dt, len(resume)
            held = resume + gen
            resume = held + turn(3)
            srv.slot("save", "conv.bin")
            srv.stop()
            srv.start()
            t_restore = srv.slot("restore", "conv.bin")
            dt, out["restart_cached"], _ = srv.complete(resume)
            out["restart"] = t_restore + dt
            out["n_prompt"] = out["restart_n"] = len(resume)
        except Exception:
            print(f"llama-server log tail:\n{(Path(d) / 'server.log').read_text(errors='replace')[-3000:]}")
            raise
        finally:
            srv.stop()
    return out


def find_llama_server(given: str | None) -> tuple[str | None, str]:
    """(the llama-server binary, or None with the reason it is skipped)."""
    path = given or os.environ.get("LLAMA_SERVER") or "/tmp/peer/build/bin/llama-server"
    if not Path(path).is_file() or not os.access(path, os.X_OK):
        return None, (f"no llama-server at {path} (set LLAMA_SERVER or --llama-server to llama.cpp's "
                      "build/bin/llama-server)")
    return path, ""
