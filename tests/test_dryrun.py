"""llama.cpp's dry run of a plan (``backends.llamacpp.dryrun``): the compute buffers it reserves per device.

- On this machine's CPU, the dry run (``no_alloc``: no weights read, no buffer allocated) gives the same
  compute buffer as a real load of the same plan logs, for SmolLM2 and Gemma-3 (the RPC split is checked
  against real workers in test_rpc.py);
- its figures go into a multi-GPU plan's devices by buffer name (injected 2×24 GB profile: no GPU here),
  and the plan's VRAM total and fit follow.
"""

from __future__ import annotations

import pytest

from localrun.backends.llamacpp.dryrun import apply_measured_compute, compute_buffers

MIB = 1024 * 1024


def test_compute_buffers_reads_llama_cpp_s_log_lines():
    lines = ["sched_reserve: RPC0[127.0.0.1:50052] compute buffer size =   109.67 MiB",
             "sched_reserve:      CUDA0 compute buffer size =    24.91 MiB",
             "sched_reserve:        CPU compute buffer size =    13.68 MiB",
             "llama_kv_cache: CUDA0 KV buffer size =    28.50 MiB"]
    assert compute_buffers(lines) == {"RPC0[127.0.0.1:50052]": round(109.67 * MIB), "CUDA0": round(24.91 * MIB),
                                      "CPU": round(13.68 * MIB)}


def test_measured_compute_replaces_each_gpu_s_estimate():
    from localrun.machine.presets import get_preset
    from localrun.model.catalog import get_entry
    from localrun.model.synthetic import spec_from_entry
    from localrun.offload.search import plan_for_run

    p = plan_for_run(spec_from_entry(get_entry("llama-3.3-70b-instruct"), "Q4_K_M"), get_preset("2x24gb"))
    assert len(p.devices) == 2 and p.fits
    before = [d["total_bytes"] for d in p.devices]
    vram = p.vram_bytes
    measured = {"CUDA0": 300 * MIB, "CUDA1": 900 * MIB, "CUDA_Host": 40 * MIB, "CPU": 10 * MIB}
    assert apply_measured_compute(p, measured)
    assert [d["compute_bytes"] for d in p.devices] == [300 * MIB, 900 * MIB]
    assert all(d["compute_source"] == "llama.cpp dry run" for d in p.devices)
    assert p.vram_bytes == sum(d["total_bytes"] for d in p.devices) == vram + sum(
        d["total_bytes"] - b for d, b in zip(p.devices, before))
    # a compute buffer larger than a card's room: that card, and the plan, no longer fit
    assert apply_measured_compute(p, {"CUDA0": 300 * MIB, "CUDA1": 30 * 1024 * MIB})
    assert not p.devices[1]["fits"] and not p.fits


def test_a_device_the_dry_run_did_not_report_is_left_as_planned():
    from localrun.machine.presets import get_preset
    from localrun.model.catalog import get_entry
    from localrun.model.synthetic import spec_from_entry
    from localrun.offload.search import plan_for_run

    p = plan_for_run(spec_from_entry(get_entry("llama-3.3-70b-instruct"), "Q4_K_M"), get_preset("2x24gb"))
    planned = [d["compute_bytes"] for d in p.devices]
    assert not apply_measured_compute(p, {"CPU": 10 * MIB})  # a CPU-only llama.cpp: no GPU buffers
    assert [d["compute_bytes"] for d in p.devices] == planned
    assert not any("compute_source" in d for d in p.devices)


@pytest.mark.model
@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_dry_run_matches_a_real_load_on_the_cpu(which, request):
    from localrun.backends import load_engine
    from localrun.backends.llamacpp.dryrun import measure_compute
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    path = request.getfixturevalue(f"{which}_path")
    plan = simple_plan(read_gguf(path), n_ctx=1024)
    dry = measure_compute(str(path), plan)
    eng = load_engine(path, plan)
    try:
        real = compute_buffers(eng.load_log)
    finally:
        eng.close()
    assert dry and dry == real, (dry, real)
