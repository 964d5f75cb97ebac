"""Does `bench --calibrate` make the next plan right? Prints fit's predicted decode tok/s for SmolLM2
against a fresh in-process bench run, as a ratio (goal: within ±10%).

Steps, all in a throw-away LOCALRUN_HOME (your measurements.json is not touched) unless --home is given:
  1. `localrun fit --ctx C --json`                  → the table-based prediction (before calibration)
  2. `localrun bench --calibrate -c 1 …`            → stores effective bandwidth/compute
  3. `localrun fit --ctx C --json`                  → the calibrated prediction (and its reasons)
  4. `localrun bench -c 1 …` (fresh process)        → measured single-stream decode tok/s
  5. ratio = measured / predicted for both predictions

Usage: .venv/bin/python benches/calibration.py [--model PATH] [--ctx 512] [--prompt-tokens 64]
       [--max-tokens 64] [--requests 8] [--threads N] [--repeat 3] [--home DIR]
This is a benchmark, not a test: on a machine shared with other work, both runs see the same noise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

LOCALRUN = [sys.executable, "-m", "localrun"]


def run(args: list[str], env: dict) -> dict:
    p = subprocess.run([*LOCALRUN, *args], capture_output=True, text=True, env=env)
    if p.returncode not in (0, 1) or not p.stdout.strip():
        sys.exit(f"`localrun {' '.join(args)}` failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded SmolLM2)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of calibrate → fit → fresh bench")
    ap.add_argument("--home", default=None, help="LOCALRUN_HOME to calibrate (default: a temporary one)")
    a = ap.parse_args()
    home = a.home or tempfile.mkdtemp(prefix="localrun-calib-")
    env = {**os.environ, "LOCALRUN_HOME": home}
    model = [a.model] if a.model else []
    work = ["--concurrency", "1", "--requests", str(a.requests), "--prompt-tokens", str(a.prompt_tokens),
            "--max-tokens", str(a.max_tokens), "--ctx", str(a.ctx), "--json"]
    if a.threads:
        work += ["--threads", str(a.threads)]
    fit_args = ["fit", *model, "--ctx", str(a.ctx), "--json"]

    before = run(fit_args, env)
    ratios = []
    for k in range(a.repeat):
        cal = run(["bench", *model, *work, "--calibrate"], env)
        after = run(fit_args, env)
        fresh = run(["bench", *model, *work], env)
        c = cal["calibration"]
        measured_cal = c["decode_tok_s"]  # 1 / P50 TPOT, as --calibrate stores it
        measured = 1.0 / fresh["levels"][0]["tpot_s"]["p50"]
        mean_fresh = fresh["levels"][0]["decode_tok_s"]
        if k == 0:
            print(f"model {fresh['target']['model']} · ctx {a.ctx} · prompt {a.prompt_tokens} · output "
                  f"{a.max_tokens} · {a.requests} requests · LOCALRUN_HOME {home}")
            print(f"fit before calibration (table): {before['decode_tok_s']:.2f} tok/s")
        print(f"round {k + 1}: stored {c['key']} decode bandwidth {c['decode_bandwidth_gbps']:.3f} GB/s "
              f"({c['bytes_per_token'] / 2**20:.1f} MiB/token × {measured_cal:.2f} tok/s), prefill "
              f"{c['prefill_gflops']:.2f} GFLOP/s; fit says {after['decode_tok_s']:.2f} tok/s "
              f"({'; '.join(r for r in after.get('reasons', []) if 'measure' in r)})")
        r = measured / after["decode_tok_s"]
        ratios.append(r)
        print(f"         fresh bench {measured:.2f} tok/s (1/P50 TPOT; mean {mean_fresh:.2f}) → "
              f"measured / calibrated fit = {r:.3f}; table fit ratio {measured / before['decode_tok_s']:.3f}")
    med = sorted(ratios)[len(ratios) // 2]
    print(f"median ratio fresh bench / calibrated fit over {len(ratios)} rounds = {med:.3f} → "
          f"{'within' if abs(med - 1) <= 0.10 else 'OUTSIDE'} ±10% (rounds: {', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
