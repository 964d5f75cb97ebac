"""One model loaded as localrun plans it: llama.cpp's buffers and NVML's memory against the plan, then
decode and prefill against ``llama-bench`` on the same device. Writes one JSON (``--out``) and prints the
comparison.

Per buffer (bytes; ratio = measured / planned, 1.00 exact):

* ``model``: llama.cpp's ``<buf> model buffer size`` (src/llama-model.cpp) on the GPU (``CUDA0``) against
  the plan's GPU weights (``plan.devices[0].weights_bytes``), and the CPU's (``CPU``/``CPU_Mapped``) against
  ``plan.weights_cpu_bytes``; any other model buffer (``CPU_REPACK``: weights copied into the CPU kernels'
  layout; ``CUDA_Host``) is listed with no planned figure;
* ``kv``: ``<buf> KV buffer size`` (src/llama-kv-cache.cpp; a sliding-window model logs two caches) on the GPU
  against ``kv_bytes`` of the GPU, and all of them against ``plan.kv_cache_bytes``;
* ``compute``: ``<buf> compute buffer size`` (src/llama-context.cpp) on the GPU against the GPU's
  ``compute_bytes``; on a CPU-only plan the CPU's against ``plan.compute_bytes``;
* ``vram (NVML)``: the device's used memory after the load minus before llama.cpp was imported
  (nvmlDeviceGetMemoryInfo; another process on the GPU meanwhile would count too), and
  this process's own (nvmlDeviceGetComputeRunningProcesses, where the driver reports it), against
  ``plan.vram_bytes`` (weights + KV + compute + the CUDA context, offload/plan.py);
* ``rss``: the process's resident set after the load against ``plan.rss_bytes``.

Speeds (tok/s, best of ``--rounds``): localrun's decode of ``--tokens`` tokens (``ignore_eos``) and prefill
of ``--prompt`` tokens (benches/decode.py's ``bench_localrun_prefill``) against ``llama-bench -p PROMPT -n
TOKENS -r ROUNDS`` with the plan's ``-ngl``, ``-fa``, ``-b``, ``-ub``, ``-ctk``/``-ctv`` (tg/pp avg_ts), and
the plan's predicted decode/prefill.

    python benches/gpu_check/measure.py MODEL.gguf --out OUT.json [--llama-bench PATH] [--tokens 128]
        [--prompt 512] [--rounds 3] [--ctx N] [--threads N] [--fit-json FIT.json]

With ``--fit-json`` the load takes `fit`'s n_ctx, n_gpu_layers, KV type and flash attention, and two rows
more compare `fit`'s GPU figures: its compute buffer (measured by llama.cpp's no_alloc dry run,
backends/llamacpp/dryrun.py) and its VRAM total against NVML's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MIB = 1024 * 1024
# "load_tensors:        CUDA0 model buffer size =    98.54 MiB", "llama_kv_cache:  CUDA0 KV buffer size = …",
# "sched_reserve:  CUDA0 compute buffer size = …", "llama_context:  CUDA_Host  output buffer size = …"
_BUF = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size\s*=\s*([\d.]+) MiB")


def buffers(lines: list[str]) -> dict[str, dict[str, int]]:
    """llama.cpp's log → {"model"|"kv"|"compute"|"output": {buffer name: bytes}} (summed per name; the log
    rounds to 0.01 MiB)."""
    out: dict[str, dict[str, int]] = {}
    for ln in lines:
        m = _BUF.search(ln)
        if m:
            kind = m.group(2).lower()
            d = out.setdefault(kind, {})
            d[m.group(1)] = d.get(m.group(1), 0) + round(float(m.group(3)) * MIB)
    return out


def nvml_used() -> dict | None:
    """{"used_bytes": device 0's used memory, "process_bytes": this process's (None where not reported)}."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        used = int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
        mine = None
        try:
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if p.pid == os.getpid() and p.usedGpuMemory is not None:
                    mine = int(p.usedGpuMemory)
        except pynvml.NVMLError:
            pass
        return {"used_bytes": used, "process_bytes": mine, "name": str(pynvml.nvmlDeviceGetName(h))}
    except Exception as e:  # no NVIDIA driver (the dry run): NVML rows are left out
        return {"error": f"{type(e).__name__}: {e}"}


def row(buffer: str, where: str, planned: int | None, measured: int | None) -> dict:
    ratio = measured / planned if planned and measured is not None else None
    return {"buffer": buffer, "where": where, "planned_bytes": planned, "measured_bytes": measured,
            "ratio": round(ratio, 4) if ratio is not None else None}


def compare(plan, bufs: dict, nv0: dict | None, nv1: dict | None, rss: int) -> list[dict]:
    """The per-buffer table (module docstring)."""
    dev = plan.devices[0] if plan.devices else None
    gpu_names = [n for n in {**bufs.get("model", {}), **bufs.get("kv", {}), **bufs.get("compute", {})}
                 if n.startswith(("CUDA", "ROCm", "Metal", "Vulkan")) and "Host" not in n]
    gname = gpu_names[0] if gpu_names else None
    models = bufs.get("model", {})
    cpu_model = sum(v for k, v in models.items() if k in ("CPU", "CPU_Mapped")) if models else None
    rows = []
    if dev is not None:
        rows.append(row("model", gname or "GPU", dev["weights_bytes"], bufs.get("model", {}).get(gname)))
        rows.append(row("kv", gname or "GPU", dev["kv_bytes"], bufs.get("kv", {}).get(gname)))
        rows.append(row("compute", gname or "GPU", dev["compute_bytes"], bufs.get("compute", {}).get(gname)))
    rows.append(row("model", "CPU", plan.weights_cpu_bytes, cpu_model))
    for name, b in models.items():  # buffers the plan has no line for: CPU_REPACK (weights repacked for the
        if name not in ("CPU", "CPU_Mapped", gname):  # CPU's kernels, a copy), CUDA_Host (pinned), …
            rows.append(row("model", name, None, b))
    rows.append(row("kv", "all", plan.kv_cache_bytes, sum(bufs.get("kv", {}).values())))
    if dev is None:
        rows.append(row("compute", "CPU", plan.compute_bytes, bufs.get("compute", {}).get("CPU")))
    if nv0 and nv1 and "used_bytes" in nv0 and "used_bytes" in nv1:
        rows.append(row("vram (NVML device used, after load - before import)", "GPU", plan.vram_bytes,
                        nv1["used_bytes"] - nv0["used_bytes"]))
        if nv1.get("process_bytes") is not None:
            rows.append(row("vram (NVML this process)", "GPU", plan.vram_bytes, nv1["process_bytes"]))
    rows.append(row("rss", "host", plan.rss_bytes, rss))
    return rows


def llama_bench(exe: str, path: str, plan, prompt: int, tokens: int, rounds: int, threads: int) -> dict:
    """llama-bench's pp/tg tok/s with the plan's GPU layers, flash attention, batch sizes and KV type (the
    value localrun gives llama.cpp, backends/llamacpp/params.py): {"pp_tok_s", "tg_tok_s", "argv"} or
    {"error", "argv"}."""
    fa = {None: "auto", True: "1", False: "0"}[plan.flash_attn]
    ngl = plan.n_gpu_layers if plan.n_gpu_layers >= 0 else 999
    argv = [exe, "-m", path, "-p", str(prompt), "-n", str(tokens), "-ngl", str(ngl), "-fa", fa, "-r", str(rounds),
            "-t", str(threads), "-b", str(plan.n_batch), "-ub", str(plan.n_ubatch), "-ctk", plan.kv_type,
            "-ctv", plan.kv_type, "-o", "json"]
    from localrun.backends.llamacpp.lib import cpu_advertises_amx

    argv += ["--repack", "0"] if cpu_advertises_amx() else []  # the AMX fix localrun applies (decode.py)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if r.returncode:
            return {"error": (r.stderr or r.stdout).strip().splitlines()[-3:], "argv": argv}
        res = json.loads(r.stdout)
        out = {"argv": argv}
        for e in res:
            if e.get("n_prompt") and not e.get("n_gen"):
                out["pp_tok_s"] = float(e["avg_ts"])
            elif e.get("n_gen") and not e.get("n_prompt"):
                out["tg_tok_s"] = float(e["avg_ts"])
        return out
    except (subprocess.SubprocessError, OSError, ValueError, KeyError) as e:
        return {"error": f"{type(e).__name__}: {e}", "argv": argv}


def _bench_decode():
    """benches/decode.py, loaded by path (benches/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_benches_decode", ROOT / "benches" / "decode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def localrun_speeds(engine, prompt: int, tokens: int, rounds: int) -> dict:
    from localrun.backends.base import SamplingParams

    bench_localrun_prefill = _bench_decode().bench_localrun_prefill

    dec, pre = [], []
    text = engine.tokenize("The history of the printing press begins")
    for _ in range(rounds):
        for s in engine.slots:
            s.tokens.clear()
            engine.C.llama_memory_seq_rm(engine.mem, s.seq_id, 0, -1)
        last = None
        for c in engine.generate(text, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)):
            last = c
        dec.append(last.stats.decode_tok_s)
        if prompt:
            pre.append(bench_localrun_prefill(engine, prompt))
    return {"decode_tok_s": max(dec), "decode_rounds": dec, "prefill_tok_s": max(pre) if pre else None,
            "prefill_rounds": pre, "tokens": tokens, "prompt": prompt}


def fit_rows(fit: dict, bufs: dict, nv0: dict | None, nv1: dict | None) -> list[dict]:
    """`localrun fit --json`'s GPU figures against the same load: its compute buffer comes from llama.cpp's
    own no_alloc dry run on the real device (backends/llamacpp/dryrun.py), never yet run on a GPU."""
    devs = fit.get("devices") or []
    if not devs:
        return []
    gname = next((n for n in bufs.get("compute", {}) if n.startswith("CUDA") and "Host" not in n), None)
    d = devs[0]
    used = (nv1["used_bytes"] - nv0["used_bytes"]) if nv0 and nv1 and "used_bytes" in nv0 and "used_bytes" in nv1 \
        else None
    return [row("compute (fit: llama.cpp dry run)", gname or "GPU", d.get("compute_bytes"),
                bufs.get("compute", {}).get(gname)),
            row("vram (fit) vs NVML device used", "GPU", fit.get("vram_bytes"), used)]


def measure(path: str, *, llama_bench_exe: str | None, tokens: int, prompt: int, rounds: int,
            n_ctx: int | None = None, threads: int | None = None, fit: dict | None = None) -> dict:
    """Load ``path`` as planned (with ``fit``, `localrun fit --json`'s plan, its n_ctx, n_gpu_layers, KV type
    and flash attention), compare, time. Returns the JSON written by ``main``."""
    from localrun.backends import load_engine
    from localrun.backends.llamacpp.lib import LlamaLog, import_llama, supports_gpu_offload
    from localrun.machine.hardware import probe_hardware
    from localrun.machine.measurements import planner_measurement
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.search import plan_for_run

    nv0 = nvml_used()  # before llama.cpp is loaded: the CUDA context it creates counts as the plan's overhead
    import_llama()
    hw = probe_hardware()
    fit = fit or {}
    plan = plan_for_run(read_gguf(path), hw, n_ctx=n_ctx or fit.get("n_ctx"), n_gpu_layers=fit.get("n_gpu_layers"),
                        kv_type=fit.get("kv_type"), flash_attn=fit.get("flash_attn"),
                        gpu_offload_supported=supports_gpu_offload(), measurement=planner_measurement("llamacpp"))
    if threads:
        plan.n_threads = plan.n_threads_batch = threads
    mark = LlamaLog.mark()
    t0 = time.perf_counter()
    engine = load_engine(path, plan)
    load_s = time.perf_counter() - t0
    bufs = buffers(LlamaLog.since(mark))
    nv1 = nvml_used()
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    out = {"model": path, "file_bytes": os.path.getsize(path), "load_s": round(load_s, 3),
           "plan": {k: v for k, v in plan.to_dict().items() if k not in ("reasons", "kv_cells")},
           "buffers": bufs, "nvml_before": nv0, "nvml_after": nv1, "rss_bytes": rss,
           "compare": compare(plan, bufs, nv0, nv1, rss) + fit_rows(fit, bufs, nv0, nv1)}
    threads = plan.n_threads or os.cpu_count() or 1
    try:
        out["localrun"] = localrun_speeds(engine, prompt, tokens, rounds)
    finally:
        engine.close()
    if llama_bench_exe and os.path.exists(llama_bench_exe):
        out["llama_bench"] = llama_bench(llama_bench_exe, path, plan, prompt, tokens, rounds, threads)
    else:
        out["llama_bench"] = {"skipped": f"no llama-bench at {llama_bench_exe!r}"}
    lr, lb = out["localrun"], out["llama_bench"]
    out["ratios"] = {
        "decode_localrun_over_llama_bench": lr["decode_tok_s"] / lb["tg_tok_s"] if lb.get("tg_tok_s") else None,
        "prefill_localrun_over_llama_bench": (lr["prefill_tok_s"] / lb["pp_tok_s"]
                                              if lb.get("pp_tok_s") and lr["prefill_tok_s"] else None),
        "decode_planned_over_localrun": plan.decode_tok_s / lr["decode_tok_s"] if lr["decode_tok_s"] else None,
        "prefill_planned_over_localrun": (plan.prefill_tok_s / lr["prefill_tok_s"]
                                          if lr["prefill_tok_s"] else None),
    }
    return out


def _read_fit(path: str | None) -> dict | None:
    try:
        return json.loads(Path(path).read_text()) if path else None
    except (OSError, ValueError):
        return None  # fit failed: the plan is plan_for_run's own


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--llama-bench", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=None, help="context (default: the planner's choice)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: the planner's choice)")
    ap.add_argument("--fit-json", default=None, help="`localrun fit --json`'s output: load with its plan")
    a = ap.parse_args(argv)
    out = measure(a.model, llama_bench_exe=a.llama_bench, tokens=a.tokens, prompt=a.prompt, rounds=a.rounds,
                  n_ctx=a.ctx, threads=a.threads, fit=_read_fit(a.fit_json))
    Path(a.out).write_text(json.dumps(out, indent=1))
    def mb(b):
        return "n/a" if b is None else f"{b / MIB:9.2f} MiB"

    for r in out["compare"]:
        print(f"  {r['buffer']:<42} {r['where']:<8} planned {mb(r['planned_bytes'])}  measured "
              f"{mb(r['measured_bytes'])}  ratio {r['ratio'] if r['ratio'] is not None else 'n/a'}", flush=True)
    speeds = {"localrun": {k: out["localrun"][k] for k in ("decode_tok_s", "prefill_tok_s")},
              "llama_bench": {k: v for k, v in out["llama_bench"].items() if k != "argv"}, **out["ratios"]}
    print(f"  speeds {json.dumps(speeds)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # localrun from this tree
    sys.exit(main())
