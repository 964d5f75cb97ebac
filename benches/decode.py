"""Decode speed of localrun against two peers, same file, same threads, same run.

  (a) llama-cpp-python's streamed ``Llama.create_completion`` (what most Python apps use);
  (b) the tightest loop the binding allows: ``llama_decode`` of one token + llama.cpp's own sampler
      chain (``llama_sampler_sample``), no per-token NumPy copy of the logits;
  (c) localrun's ``LlamaCppEngine.generate`` (what `localrun chat` runs).

Each is measured ``--rounds`` times, interleaved (a, b, c, a, b, c, …) so machine noise hits all three
alike; the best round of each is compared. Goal: (c)/(b) >= 0.95.

Prefill (``--prefill N``, default 2048 tokens; 0 = skip): localrun's prefill tok/s of an N-token prompt
(``Stats.prefill_s``, one request, nothing cached) against llama.cpp's ``llama-bench -p N -n 0`` with the
same threads and flash-attention setting, interleaved round by round in the same run (``--llama-bench
PATH``, default /tmp/peer/build/bin/llama-bench when it exists; ``--repack 0`` where the CPU advertises AMX,
whose kernels crash this llama.cpp: localrun then still repacks by name, docs/architecture.md §7, unless
``LOCALRUN_NO_REPACK=1``). Goal: localrun ≥ 0.97× llama-bench.

    python benches/decode.py [--model PATH] [--tokens 128] [--rounds 3] [--threads N] [--prefill 2048]
        [--llama-bench PATH]
"""

from __future__ import annotations

import argparse
import os
import time

PROMPT = "Once upon a time, in a land far away, there lived"


def no_amx_patch():
    """This machine's llama.cpp dies on AMX (see localrun.backends.llamacpp.lib); peers get the same fix."""
    import llama_cpp
    from llama_cpp import llama_cpp as C

    orig = C.llama_model_default_params

    def patched():
        p = orig()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama.llama_cpp.llama_model_default_params = patched
    return patched


def bench_create_completion(llm, n_tokens: int) -> float:
    t0 = None
    n = 0
    for _ in llm.create_completion(PROMPT, max_tokens=n_tokens, temperature=0.0, stream=True):
        if t0 is None:
            t0 = time.perf_counter()  # first token out: prefill done
        n += 1
    return (n - 1) / (time.perf_counter() - t0)


def bench_tight_loop(model_path: str, n_tokens: int, threads: int, params_fn, flash_attn: bool | None) -> float:
    from llama_cpp import llama_cpp as C

    model = C.llama_model_load_from_file(model_path.encode(), params_fn())
    vocab = C.llama_model_get_vocab(model)
    cp = C.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 1024, 512, threads, threads
    cp.no_perf = True
    cp.flash_attn_type = {None: -1, True: 1, False: 0}[flash_attn]  # the same attention path as localrun's plan
    ctx = C.llama_init_from_model(model, cp)
    data = PROMPT.encode()
    toks = (C.llama_token * 256)()
    n = C.llama_tokenize(vocab, data, len(data), toks, 256, True, False)
    smpl = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
    C.llama_sampler_chain_add(smpl, C.llama_sampler_init_greedy())
    if C.llama_decode(ctx, C.llama_batch_get_one(toks, n)) != 0:
        raise RuntimeError("prefill failed")
    tok = C.llama_sampler_sample(smpl, ctx, -1)
    one = (C.llama_token * 1)()
    t0 = time.perf_counter()
    produced = 0
    for _ in range(n_tokens - 1):
        one[0] = tok
        if C.llama_decode(ctx, C.llama_batch_get_one(one, 1)) != 0:
            break
        tok = C.llama_sampler_sample(smpl, ctx, -1)
        produced += 1
        if C.llama_vocab_is_eog(vocab, tok):
            break
    dt = time.perf_counter() - t0
    C.llama_sampler_free(smpl)
    C.llama_free(ctx)
    C.llama_model_free(model)
    return produced / dt


def bench_localrun(engine, n_tokens: int) -> float:
    from localrun.backends.base import SamplingParams

    engine.slots[0].tokens.clear()  # no prefix reuse between rounds: same work as the peers
    engine.C.llama_memory_seq_rm(engine.mem, 0, 0, -1)
    last = None
    for c in engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=n_tokens)):
        last = c
    return last.stats.decode_tok_s


def bench_localrun_prefill(engine, n_prompt: int) -> float:
    """localrun's prefill tok/s of an ``n_prompt``-token prompt (distinct each call: nothing cached)."""
    import random

    from localrun.backends.base import SamplingParams

    words = PROMPT.split()
    rng = random.Random()
    toks: list[int] = []
    while len(toks) < n_prompt:
        toks += engine.tokenize(" ".join(rng.choice(words) for _ in range(256)), add_special=not toks)
    toks = toks[:n_prompt]
    for s in engine.slots:  # nothing reused
        s.tokens.clear()
        engine.C.llama_memory_seq_rm(engine.mem, s.seq_id, 0, -1)
    last = None
    for c in engine.generate(toks, SamplingParams(temperature=0, max_tokens=1)):
        last = c
    return n_prompt / last.stats.prefill_s


def bench_llama_bench(exe: str, path: str, n_prompt: int, threads: int, flash_attn: bool | None) -> float | None:
    """llama-bench's pp``n_prompt`` tok/s (one repetition), or None when it fails."""
    import json
    import subprocess

    from localrun.backends.llamacpp.lib import cpu_advertises_amx

    fa = {None: "auto", True: "on", False: "off"}[flash_attn]
    argv = [exe, "-m", path, "-p", str(n_prompt), "-n", "0", "-t", str(threads), "-fa", fa, "-r", "1", "-o", "json"]
    argv += ["--repack", "0"] if cpu_advertises_amx() else []
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=True).stdout
        return float(json.loads(out)[0]["avg_ts"])
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, IndexError) as e:
        print(f"llama-bench failed: {e}")
        return None


def main() -> None:
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.store.resolve import default_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prefill", type=int, default=2048, help="prompt tokens for the prefill comparison (0 = skip)")
    ap.add_argument("--llama-bench", default="/tmp/peer/build/bin/llama-bench", help="llama-bench binary")
    args = ap.parse_args()

    import psutil

    path = str(args.model or default_model_path())
    threads = args.threads or psutil.cpu_count(logical=False) or 1
    params_fn = no_amx_patch()
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    from localrun.machine.hardware import probe_hardware
    from localrun.offload.search import plan_for_run

    n_ctx = max(1024, args.prefill + 256)
    plan = plan_for_run(read_gguf(path), probe_hardware(), n_ctx=n_ctx)  # what `localrun chat` loads
    plan.n_threads = plan.n_threads_batch = threads
    engine = load_engine(path, plan)

    res = {"a": [], "b": [], "c": []}
    for r in range(args.rounds):
        res["a"].append(bench_create_completion(llm, args.tokens))
        res["b"].append(bench_tight_loop(path, args.tokens, threads, params_fn, plan.flash_attn))
        res["c"].append(bench_localrun(engine, args.tokens))
        print(f"round {r + 1}: create_completion {res['a'][-1]:.1f}  tight loop {res['b'][-1]:.1f}  "
              f"localrun {res['c'][-1]:.1f} tok/s")
    a, b, c = (max(res[k]) for k in "abc")
    print(f"\nmodel {path}\nthreads {threads}, {args.tokens} tokens, flash attention {plan.flash_attn}, "
          f"best of {args.rounds} rounds (decode tok/s)")
    print(f"  (a) llama-cpp-python create_completion(stream=True): {a:7.1f}")
    print(f"  (b) llama_decode + llama.cpp sampler (tight loop):   {b:7.1f}")
    print(f"  (c) localrun LlamaCppEngine.generate:                {c:7.1f}")
    print(f"ratio localrun / tight loop        = {c / b:.3f}  (goal >= 0.95)")
    print(f"ratio localrun / create_completion = {c / a:.3f}")
    med = sorted(ci / bi for ci, bi in zip(res["c"], res["b"]))[len(res["b"]) // 2]
    print(f"median per-round ratio localrun / tight loop = {med:.3f}")
    if args.prefill and os.path.exists(args.llama_bench):
        pre = {"localrun": [], "llama-bench": []}
        for r in range(args.rounds):
            pre["localrun"].append(bench_localrun_prefill(engine, args.prefill))
            lb = bench_llama_bench(args.llama_bench, path, args.prefill, threads, plan.flash_attn)
            if lb:
                pre["llama-bench"].append(lb)
            print(f"prefill round {r + 1}: localrun {pre['localrun'][-1]:.1f}  llama-bench "
                  f"{lb or float('nan'):.1f} tok/s (load average {os.getloadavg()[0]:.2f})", flush=True)
        if pre["llama-bench"]:
            lr, lb = max(pre["localrun"]), max(pre["llama-bench"])
            print(f"prefill of {args.prefill} tokens, best of {args.rounds}: localrun {lr:.1f}, llama-bench "
                  f"pp{args.prefill} {lb:.1f} tok/s; ratio {lr / lb:.3f} (goal >= 0.97; n_batch {plan.n_batch}, "
                  f"n_ubatch {plan.n_ubatch}, flash attention {plan.flash_attn})")
    elif args.prefill:
        print(f"prefill comparison skipped: no llama-bench at {args.llama_bench}")
    engine.close()


if __name__ == "__main__":
    main()
