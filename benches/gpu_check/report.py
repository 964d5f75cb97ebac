"""benches/gpu_check.sh's bookkeeping: the carry's size, the inflated models' check, and the report.

    python benches/gpu_check/report.py carry CARRY ROOT OUT.json
    python benches/gpu_check/report.py check-model CARRY NAME MODEL.gguf OUT.json
    python benches/gpu_check/report.py write WORK REPORT_DIR ELAPSED_S BUDGET_S

``write`` reads WORK/steps.tsv (name, status ok|failed|skipped, seconds, detail) and WORK/results/*.json
and writes REPORT_DIR/report.json and REPORT_DIR/report.md (fields: docs/benchmarks.md, "GPU check").
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MIB = 1024 * 1024
LIMIT_BYTES = 64 * MIB  # the device call: working tree + carried paths


def tree_bytes(root: Path) -> int | None:
    """What the device call sends besides the carry: tracked + untracked-not-ignored files (git), or None."""
    try:
        names = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], capture_output=True, check=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())


def carry(carry_dir: str, root: str, out: str) -> int:
    c = Path(carry_dir)
    parts = {p.name: (sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size)
             for p in c.iterdir()}
    size, tree = sum(parts.values()), tree_bytes(Path(root))
    man = json.loads((c / "manifest.json").read_text())
    sys.path.insert(0, str(Path(__file__).parent))
    from prepare import runtime_requirements  # pyproject.toml now

    carried = (c / "requirements.txt").read_text().split() if (c / "requirements.txt").exists() else None
    d = {"carry_bytes": size, "parts_bytes": parts, "tree_bytes": tree, "limit_bytes": LIMIT_BYTES,
         "total_bytes": size + (tree or 0), "fits": size + (tree or 0) < LIMIT_BYTES,
         "models": man.get("models"), "source": man.get("source"),
         "wheels": {k: v for k, v in (man.get("wheels") or {}).items() if k != "wheels"},
         "requirements_current": carried is None or carried == runtime_requirements()}
    Path(out).write_text(json.dumps(d, indent=1))
    print(f"carry {size / MIB:.2f} MiB + working tree {'n/a' if tree is None else f'{tree / MIB:.2f} MiB'} = "
          f"{d['total_bytes'] / MIB:.2f} MiB (limit {LIMIT_BYTES // MIB} MiB): {'fits' if d['fits'] else 'TOO BIG'}")
    for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<32} {v / MIB:8.2f} MiB")
    if not d["requirements_current"]:
        print("the carried requirements.txt is not pyproject.toml's dependencies: run "
              "`bash benches/gpu_check.sh --prepare` again")
    return 0 if d["fits"] and d["requirements_current"] else 1


def check_model(carry_dir: str, name: str, path: str, out: str) -> int:
    """The inflated file against the carried header: same size and header bytes; where the real model is
    installed (here, not on the device), the same tensor table too."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from localrun.model.gguf_info import read_gguf

    info = json.loads((Path(carry_dir) / "manifest.json").read_text())["models"][name]
    with open(path, "rb") as f:
        head = f.read(info["data_offset"])
    d = {"name": name, "file_bytes": os.path.getsize(path), "expected_bytes": info["file_bytes"],
         "header_same": hashlib.sha256(head).hexdigest() == info["head_sha256"]}
    try:
        sys.path.insert(0, str(Path(__file__).parent))
        from prepare import model_sources

        real = model_sources((name,)).get(name)
    except Exception:  # noqa: BLE001 - the model packages are not on the device
        real = None
    if real is not None and not read_gguf(real).truncated:
        a, b = read_gguf(path), read_gguf(real)
        d["real_file_bytes"] = os.path.getsize(real)
        d["same_tensor_table"] = [(t.name, t.shape, t.ggml_type, t.offset, t.n_bytes) for t in a.tensors] == \
            [(t.name, t.shape, t.ggml_type, t.offset, t.n_bytes) for t in b.tensors]
    Path(out).write_text(json.dumps(d, indent=1))
    print(json.dumps(d))
    ok = d["file_bytes"] == d["expected_bytes"] and d["header_same"] and d.get("same_tensor_table", True)
    return 0 if ok else 1


def _load(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def collect(work: Path, elapsed: int, budget: int) -> dict:
    steps = []
    for ln in (work / "steps.tsv").read_text().splitlines():
        name, status, secs, detail = (ln.split("\t") + ["", "", "", ""])[:4]
        steps.append({"name": name, "status": status, "seconds": int(secs or 0), "detail": detail})
    res = work / "results"
    rep = {"mode": os.environ.get("GPU_CHECK_MODE", "?"), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
           time.gmtime()), "elapsed_s": elapsed, "budget_s": budget, "steps": steps,
           "probe": (res / "probe.txt").read_text() if (res / "probe.txt").exists() else None,
           "carry": _load(res / "carry.json"), "hw": _load(res / "hw.json"), "fit": {}, "inflate": {},
           "measure": {}, "serve": None}
    for p in sorted(res.glob("fit_*.json")):
        d = _load(p)
        keys = ("model", "quant", "fits", "n_ctx", "n_gpu_layers", "kv_type", "flash_attn", "weights_bytes",
                "kv_cache_bytes", "compute_bytes", "vram_bytes", "ram_bytes", "decode_tok_s", "prefill_tok_s",
                "devices", "warnings")
        rep["fit"][p.stem[4:]] = {k: d.get(k) for k in keys} if isinstance(d, dict) else None
    for p in sorted(res.glob("inflate_*.json")):
        rep["inflate"][p.stem[8:]] = _load(p)
    for p in sorted(res.glob("measure_*.json")):
        d = _load(p)
        if isinstance(d, dict):
            plan = d.get("plan", {})
            d["plan"] = {k: plan.get(k) for k in ("n_ctx", "n_gpu_layers", "n_batch", "n_ubatch", "kv_type",
                                                   "flash_attn", "vram_bytes", "rss_bytes", "decode_tok_s",
                                                   "prefill_tok_s", "devices", "speed_source")}
        rep["measure"][p.stem[8:]] = d
    s = _load(res / "serve.json")
    if isinstance(s, dict):
        rep["serve"] = {k: {"server": v.get("server"), "errors": v.get("errors"),
                            "levels": [{f: lv.get(f) for f in ("level", "requests", "ok", "tok_s", "ttft_p50_s",
                                                               "itl_p50_s", "itl_p99_s", "tokens_per_req")}
                                       for lv in v.get("levels", [])]} for k, v in s.get("runs", {}).items()}
    return rep


def _mib(b) -> str:
    return "n/a" if b is None else f"{b / MIB:.2f}"


def _ms(s) -> str:
    return "n/a" if s is None else f"{s * 1000:.1f}"


def _f(x, nd=2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def markdown(rep: dict) -> str:
    L = [f"# GPU check ({rep['mode']} run)", "",
         f"Finished {rep['finished_at']}, {rep['elapsed_s']} s of a {rep['budget_s']} s budget.", ""]
    if rep.get("probe"):
        L += ["```", rep["probe"].strip(), "```", ""]
    L += ["## Steps", "", "| step | status | s | detail |", "|---|---|---|---|"]
    L += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['detail'].replace('|', '/')[:200]} |"
          for s in rep["steps"]]
    c = rep.get("carry")
    if c:
        L += ["", "## Carry", "", f"{_mib(c['carry_bytes'])} MiB carried + {_mib(c['tree_bytes'])} MiB working "
              f"tree = {_mib(c['total_bytes'])} MiB of the {c['limit_bytes'] // MIB} MiB limit "
              f"({'fits' if c['fits'] else 'TOO BIG'})."]
    if rep["fit"]:
        L += ["", "## fit", "", "| model | fits | n_ctx | n_gpu_layers | kv | VRAM MiB | RAM MiB | decode tok/s |",
              "|---|---|---|---|---|---|---|---|"]
        for k, d in rep["fit"].items():
            if d:
                L.append(f"| {k} ({d['quant']}) | {d['fits']} | {d['n_ctx']} | {d['n_gpu_layers']} | "
                         f"{d['kv_type']} | {_mib(d['vram_bytes'])} | {_mib(d['ram_bytes'])} | "
                         f"{_f(d['decode_tok_s'], 1)} |")
    for k, d in rep["measure"].items():
        if not isinstance(d, dict):
            continue
        p = d["plan"]
        L += ["", f"## {k}: plan against llama.cpp and NVML", "",
              f"n_ctx {p['n_ctx']}, n_gpu_layers {p['n_gpu_layers']}, KV {p['kv_type']}, flash attention "
              f"{p['flash_attn']}, n_ubatch {p['n_ubatch']}; load {d['load_s']} s.", "",
              "| buffer | where | planned MiB | measured MiB | measured / planned |", "|---|---|---|---|---|"]
        L += [f"| {r['buffer']} | {r['where']} | {_mib(r['planned_bytes'])} | {_mib(r['measured_bytes'])} | "
              f"{_f(r['ratio'], 3)} |" for r in d["compare"]]
        lr, lb, ra = d.get("localrun", {}), d.get("llama_bench", {}), d.get("ratios", {})
        L += ["", "| tok/s | localrun | llama-bench | localrun / llama-bench | planned / localrun |",
              "|---|---|---|---|---|",
              f"| decode ({lr.get('tokens')} tokens) | {_f(lr.get('decode_tok_s'), 1)} | {_f(lb.get('tg_tok_s'), 1)} "
              f"| {_f(ra.get('decode_localrun_over_llama_bench'), 3)} | {_f(ra.get('decode_planned_over_localrun'))} |",
              f"| prefill ({lr.get('prompt')} tokens) | {_f(lr.get('prefill_tok_s'), 1)} | "
              f"{_f(lb.get('pp_tok_s'), 1)} | {_f(ra.get('prefill_localrun_over_llama_bench'), 3)} | "
              f"{_f(ra.get('prefill_planned_over_localrun'))} |"]
        if lb.get("skipped") or lb.get("error"):
            L.append(f"\nllama-bench: {lb.get('skipped') or lb.get('error')}")
    if rep.get("serve"):
        L += ["", "## serve (SmolLM2 layout, /v1/completions streams)", "",
              "| server | streams | ok/requests | aggregate tok/s | TTFT p50 ms | ITL p50 ms | ITL p99 ms |",
              "|---|---|---|---|---|---|---|"]
        for v in rep["serve"].values():
            for lv in v["levels"]:
                L.append(f"| {v['server']} | {lv['level']} | {lv['ok']}/{lv['requests']} | {_f(lv['tok_s'], 1)} | "
                         f"{_ms(lv['ttft_p50_s'])} | {_ms(lv['itl_p50_s'])} | {_ms(lv['itl_p99_s'])} |")
    return "\n".join(L) + "\n"


def write(work: str, report_dir: str, elapsed: str, budget: str) -> int:
    rep = collect(Path(work), int(elapsed), int(budget))
    out = Path(report_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=1))
    (out / "report.md").write_text(markdown(rep))
    return 0


def main(argv: list[str]) -> int:
    cmds = {"carry": carry, "check-model": check_model, "write": write}
    if not argv or argv[0] not in cmds:
        print(__doc__)
        return 2
    return cmds[argv[0]](*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
