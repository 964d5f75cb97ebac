"""`localrun serve --backend mlx` against `python -m mlx_lm.server`: concurrency, same run.

``benches/serve_concurrency.py --backend mlx`` runs this (the llama.cpp comparison stays in that file; the
client, the closed-loop levels and the CPU accounting are its own, imported). Both servers load the same
MLX folder, written once from the GGUF (``mlx/gguf.py write_mlx_folder``; default: the embedded
SmolLM2-135M Q4_1): localrun with ``--parallel`` = the top level (continuous batching, ``mlx/batch.py``),
mlx_lm.server with ``--decode-concurrency`` and ``--prompt-concurrency`` = the top level (its
``BatchGenerator``). One server at a time, a fresh process per level, the order alternating per level.

Per level (default 1, 4, 8): aggregate decode tok/s, TTFT p50, ITL p50, CPU used; printed as ratios
localrun / mlx_lm.server. Goals: aggregate tok/s ≥ 1.0× at every level, TTFT p50 ≤ 1.0×.

Note for a CPU box (``mlx[cpu]``): localrun keeps the weights quantized, as mlx_lm.server runs them, where
that multiplies faster on this CPU, else expands them to float32 (measured at load: ``mlx/load.py``
``dequantize_pays``); ``LOCALRUN_MLX_DEQUANTIZE=0`` / ``=1`` in this bench's environment forces either. On a
Mac (Metal) both run the quantized weights.

    timeout 1200 .venv/bin/python benches/serve_concurrency.py --backend mlx [--model GGUF] [--levels 1,4,8]
        [--requests 8] [--max-tokens 32] [--json OUT.json]

Not a test: it prints numbers and ratios, no thresholds are asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serve_concurrency as sc  # noqa: E402
from serve_process import HOST, Server, free_port  # noqa: E402

NAMES = {"localrun": "localrun serve", "mlx-lm": "mlx_lm.server"}


class MlxPeer(Server):
    """mlx_lm.server: ready when /health answers; requests name its ``default_model``."""

    def ready_model(self) -> str | None:
        import httpx

        return "default_model" if httpx.get(self.base + "/health", timeout=5.0).status_code == 200 else None


def server_argv(kind: str, args, port: int) -> list[str]:
    py, n = sys.executable, str(max(args.levels))
    if kind == "localrun":
        return [py, "-m", "localrun", "serve", str(args.folder), "--backend", "mlx", "--host", HOST,
                "--port", str(port), "--parallel", n, "--ctx", str(args.ctx), "--max-queue", "256",
                "--log-level", "warning"]
    return [py, "-m", "mlx_lm.server", "--model", str(args.folder), "--host", HOST, "--port", str(port),
            "--decode-concurrency", n, "--prompt-concurrency", n, "--max-tokens", str(args.max_tokens)]


def with_server(kind: str, args, log_dir: str, what: str, fn):
    port = free_port()
    cls = Server if kind == "localrun" else MlxPeer
    srv = cls(kind, server_argv(kind, args, port), port, log_dir)
    try:
        t0 = time.perf_counter()
        srv.wait_ready(args.start_timeout)
        print(f"-- {NAMES[kind]:<16} {what:<11} (ready in {time.perf_counter() - t0:.1f}s, "
              f"load average {os.getloadavg()[0]:.2f})", flush=True)
        asyncio.run(sc.warmup(srv))
        return fn(srv)
    finally:
        srv.stop()


def run_all(args, log_dir: str) -> dict[str, list[dict]]:
    kinds = ["mlx-lm", "localrun"]
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for i, level in enumerate(args.levels):
        n = args.requests_single if level == 1 else max(args.requests, level)
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            try:
                lv = with_server(kind, args, log_dir, f"{level} streams",
                                 lambda srv: asyncio.run(sc.run_level(srv, level, n, args)))
            except RuntimeError as e:
                print(f"   FAILED: {e}", flush=True)
                continue
            runs[kind].append(lv)
            print(f"   {level:>2} streams: {lv['tok_s']:7.1f} tok/s aggregate, TTFT p50 {sc._ms(lv['ttft_p50_s'])}, "
                  f"ITL p50 {sc._ms(lv['itl_p50_s'])}, {lv['ok']}/{n} ok, {lv['tokens_per_req']:.1f} tok/req, "
                  f"server {lv['server_cores']:.2f} cores, others {lv['other_cores']:.2f}"
                  + (f"  ERRORS: {lv['errors']}" if lv["errors"] else ""), flush=True)
    return runs


def report(runs: dict[str, list[dict]], args) -> None:
    print(f"\nMLX folder {args.folder} (from {args.model}); ctx {args.ctx}; max_tokens {args.max_tokens}; "
          f"CPUs {os.cpu_count()}")
    print(f"{'server':<17}{'streams':>8}{'tok/s':>9}{'TTFT p50':>10}{'ITL p50':>9}{'ok':>7}{'srv cores':>10}")
    for kind, levels in runs.items():
        for lv in levels:
            print(f"{NAMES[kind]:<17}{lv['level']:>8}{lv['tok_s']:>9.1f}{sc._ms(lv['ttft_p50_s']):>10}"
                  f"{sc._ms(lv['itl_p50_s']):>9}{lv['ok']:>4}/{lv['requests']:<2}{lv['server_cores']:>10.2f}")
    peer = {lv["level"]: lv for lv in runs.get("mlx-lm", [])}
    print("\nlocalrun serve / mlx_lm.server (goals: tok/s ≥ 1.0×, TTFT p50 ≤ 1.0×):")
    for lv in runs.get("localrun", []):
        other = peer.get(lv["level"])
        if not other or other["tok_s"] <= 0:
            continue
        tok = lv["tok_s"] / other["tok_s"]
        ttft = (lv["ttft_p50_s"] / other["ttft_p50_s"]) if lv["ttft_p50_s"] and other["ttft_p50_s"] else float("nan")
        print(f"  {lv['level']:>2} streams: tok/s {tok:.2f}× ({'MET' if tok >= 1.0 else 'NOT MET'}), "
              f"TTFT p50 {ttft:.2f}× ({'MET' if ttft <= 1.0 else 'NOT MET'})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("mlx",), default="mlx")
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded SmolLM2-135M Q4_1)")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--requests", type=int, default=8, help="requests per level (levels > 1)")
    ap.add_argument("--requests-single", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=20)
    ap.add_argument("--level-timeout", type=float, default=300.0)
    ap.add_argument("--start-timeout", type=float, default=240.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.levels = sorted({int(x) for x in args.levels.split(",") if x.strip()})
    if args.model is None:
        from localrun.store.resolve import default_model_path

        args.model = default_model_path()

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    with tempfile.TemporaryDirectory(prefix="serve_concurrency_mlx-") as tmp:
        from localrun.backends.mlx.gguf import write_mlx_folder

        args.folder = write_mlx_folder(str(args.model), Path(tmp) / "model")
        runs = run_all(args, tmp)
    report(runs, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
