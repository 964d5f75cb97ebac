"""Decode speed of the two backends on the same GGUF, in one run: llama.cpp vs MLX.

    .venv/bin/python benches/backends.py [MODEL.gguf] [--tokens 64] [--ctx 2048]

Both engines load the same file with the same plan, decode ``--tokens`` greedy tokens (after a short
warm-up) from the same prompt, and the script prints decode tok/s (Stats.decode_tok_s: tokens after the
first over the time after the first) and MLX / llama.cpp as a ratio. Not a test: no thresholds.
MLX on the CPU (mlx[cpu]) dequantizes weights to float32; on Apple Silicon it runs the quantized
Metal kernels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def run(backend: str, path: str, n_tokens: int, n_ctx: int) -> tuple[float, float]:
    from localrun.backends import load_engine
    from localrun.backends.base import SamplingParams
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(path), n_ctx=n_ctx)
    plan.backend = backend
    eng = load_engine(path, plan)
    try:
        list(eng.generate("Hi", SamplingParams(temperature=0, max_tokens=4)))  # warm-up, no shared prefix
        last = list(eng.generate(PROMPT, SamplingParams(temperature=0, max_tokens=n_tokens)))[-1]
        st = last.stats
        return st.decode_tok_s, st.prefill_tok_s
    finally:
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="a GGUF (default: the embedded SmolLM2-135M Q4_1)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=2048)
    a = ap.parse_args()
    if a.model is None:
        from localrun.store.resolve import default_model_path

        a.model = str(default_model_path())
    res = {}
    for backend in ("llamacpp", "mlx"):
        dec, pre = run(backend, a.model, a.tokens, a.ctx)
        res[backend] = dec
        print(f"{backend:9s} decode {dec:7.1f} tok/s   prefill {pre:7.1f} tok/s")
    ratio = res["mlx"] / res["llamacpp"] if res["llamacpp"] else float("nan")
    print(f"MLX / llama.cpp decode ratio: {ratio:.2f}  ({Path(a.model).name}, {a.tokens} tokens)")


if __name__ == "__main__":
    main()
