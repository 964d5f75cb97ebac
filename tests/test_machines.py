"""Issue 30: AMD, Intel and NVIDIA unified-memory machines, probed from recorded sysfs/procfs trees
(tests/data/machines/<name>/, sources in SOURCES.md) by the real probe code, compared field by field; the GTT
rule planned on Strix Halo and a 780M; `hw` here still says CPU only, quickly."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from localrun.machine.hardware import (
    CpuInfo,
    DiskInfo,
    GiB,
    GpuInfo,
    build_advice,
    installed_backends,
    meminfo,
    probe_hardware,
    probe_linux_gpus,
    probe_nvidia_unified,
    unified_pool,
)

MACHINES = Path(__file__).parent / "data" / "machines"
CPU = CpuInfo(model="test", arch="x86_64", physical_cores=8, logical_cores=16)


def profile_of(name: str):
    """``probe_hardware`` with the Linux GPU probes pointed at the recorded tree (and NVML's recorded answer)."""
    root = MACHINES / name
    total, avail = meminfo(root)
    nvml = root / "nvml.json"
    answer = [(d["name"], None) for d in json.loads(nvml.read_text())["devices"]] if nvml.exists() else []
    return probe_hardware(
        "/tmp", cpu=lambda: CPU, memory=lambda: (total, avail),
        nvidia=lambda: probe_nvidia_unified(total, avail, root, nvml=answer) if answer else [],
        apple=lambda t, a: [], disk=lambda p: DiskInfo(p, 1 << 40, 1 << 39, "nvme"),
        linux_gpus=lambda t, a: probe_linux_gpus(t, a, root))


def gpu(**kw) -> dict:
    base = asdict(GpuInfo(name="", vendor="", backend="vulkan", total_bytes=0, free_bytes=0))
    base.update(kw)
    return base


KB = 1024
EXPECTED = {
    "radeon-7900xtx": gpu(name="AMD Radeon RX 7900 XTX", vendor="amd", total_bytes=25753026560,
                          free_bytes=25753026560 - 1101004800, index=1, memory_kind="dedicated",
                          memory_note="VRAM (mem_info_vram_total − mem_info_vram_used)", arch="gfx1100"),
    "strix-halo": gpu(name="AMD Radeon 8060S (Strix Halo)", vendor="amd", total_bytes=96 * GiB,
                      free_bytes=96 * GiB - 30000000, index=1, unified=True, working_set_bytes=96 * GiB,
                      memory_kind="unified", arch="gfx1151",
                      memory_note="unified pool: GTT 96.0 GiB, bounded by GTT → 96.0 GiB; BIOS carve-out 0.5 GiB "
                                  "not counted"),
    "laptop-780m": gpu(name="AMD Radeon 780M (Phoenix)", vendor="amd", total_bytes=16 * GiB,
                       free_bytes=16 * GiB - 52000000, index=1, unified=True, working_set_bytes=16 * GiB,
                       memory_kind="unified", arch="gfx1103",
                       memory_note="unified pool: GTT 16.0 GiB, bounded by GTT → 16.0 GiB; BIOS carve-out 2.0 GiB "
                                   "not counted"),
    "arc-b580": gpu(name="Intel Arc B580", vendor="intel", total_bytes=12 * GiB, free_bytes=12 * GiB, index=0,
                    driver="xe", memory_kind="dedicated",
                    memory_note="local memory (tile0/physical_vram_size_bytes); used not reported"),
    "jetson-orin": gpu(name="NVIDIA Jetson AGX Orin", vendor="nvidia", backend="cuda", total_bytes=64335836 * KB,
                       free_bytes=60000000 * KB, unified=True, working_set_bytes=64335836 * KB - 4 * GiB,
                       memory_kind="unified",
                       memory_note="unified: /proc/meminfo (device tree: tegra), RAM less 4 GiB for the OS"),
    "dgx-spark": gpu(name="NVIDIA GB10", vendor="nvidia", backend="cuda", total_bytes=127600748 * KB,
                     free_bytes=118566368 * KB, unified=True, working_set_bytes=127600748 * KB - 4 * GiB,
                     memory_kind="unified",
                     memory_note="unified: NVML has no memory info; /proc/meminfo, RAM less 4 GiB"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_machine_probed_field_by_field(name):
    prof = profile_of(name)
    assert len(prof.gpus) == 1, prof.gpus
    got, want = asdict(prof.gpus[0]), EXPECTED[name]
    assert {k: got[k] for k in want if got[k] != want[k]} == {}, {k: want[k] for k in want if got[k] != want[k]}
    assert HardwareRoundTrip(prof)


def HardwareRoundTrip(prof) -> bool:  # noqa: N802  the new fields survive JSON
    from localrun.machine.hardware import HardwareProfile

    return HardwareProfile.from_dict(json.loads(json.dumps(prof.to_dict()))) == prof


def test_gtt_rule_bounds():
    # GTT bounded by the ttm limit, then by the RAM the OS needs
    assert unified_pool(96 * GiB, 0, 127 * GiB, 120 * GiB, ttm_limit=64 * GiB)[0] == 64 * GiB
    budget, free, how = unified_pool(96 * GiB, 0, 64 * GiB, 10 * GiB)
    assert budget == 60 * GiB and free == 10 * GiB and "RAM less 4 GiB" in how


def _plan(name: str, entry: str, quant: str):
    """The catalog entry's ``quant`` planned on the recorded machine (the planner's own search)."""
    from localrun.model.catalog import load_catalog
    from localrun.model.synthetic import spec_from_entry
    from localrun.offload.search import plan_for_run

    e = next(e for e in load_catalog() if e.name == entry)
    spec = spec_from_entry(e, quant)
    return plan_for_run(spec, profile_of(name), n_ctx=8192)


def test_strix_halo_plans_a_70b_q4_on_the_gpu():
    """The case the anchors get wrong: a 512 MiB carve-out, 96 GiB GTT: the 70B at Q4_K_M goes on the GPU."""
    p = _plan("strix-halo", "llama-3.3-70b-instruct", "Q4_K_M")
    assert p.fits and p.n_gpu_layers == 81, p.reasons
    assert "unified pool" in p.reasons[0] or any("unified pool" in r for r in p.reasons)
    assert p.vram_budget_bytes > 85 * GiB


def test_780m_plans_what_fits_in_its_16gb_gtt():
    p8 = _plan("laptop-780m", "llama-3.1-8b-instruct", "Q4_K_M")
    assert p8.fits and p8.n_gpu_layers == 33, p8.reasons  # the 8B whole on the iGPU, not on 2 GiB of carve-out
    p70 = _plan("laptop-780m", "llama-3.3-70b-instruct", "Q4_K_M")
    assert 0 < p70.n_gpu_layers < 81 and p70.vram_bytes <= 16 * GiB


def test_build_advice():
    amd = GpuInfo(name="AMD Radeon RX 7900 XTX", vendor="amd", backend="vulkan", total_bytes=1, free_bytes=1,
                  arch="gfx1100")
    line = build_advice(amd, {"CPU"})
    assert "no HIP or Vulkan backend" in line and "-DGGML_VULKAN=on" in line and "AMDGPU_TARGETS=gfx1100" in line
    assert build_advice(amd, {"CPU", "Vulkan"}) == "the installed llama.cpp uses it (Vulkan)"
    nv = GpuInfo(name="NVIDIA GB10", vendor="nvidia", backend="cuda", total_bytes=1, free_bytes=1)
    assert "-DGGML_CUDA=on" in build_advice(nv, {"CPU"})


def test_hw_here_says_cpu_only():
    """This machine has no GPU: the probes find none. Their cost is printed (benches/hw_probe.py measures it:
    well under 50 ms here), not asserted."""
    from localrun.machine.hardware import probe_memory

    total, avail = probe_memory()
    t0 = time.perf_counter()
    gpus = probe_linux_gpus(total, avail)
    backends = installed_backends()
    dt = time.perf_counter() - t0
    print(f"GPU probes and installed backends: {dt * 1000:.1f} ms")
    assert gpus == [], gpus
    assert "CPU" in backends or backends == set()


def test_hw_command_cpu_only(isolated_home):
    from typer.testing import CliRunner

    from localrun.cli import app

    out = CliRunner().invoke(app, ["hw"])
    assert out.exit_code == 0, out.output
    assert "CPU only" in out.output
    from localrun.machine.hardware import llamacpp_devices

    devs = llamacpp_devices()  # this CPU build: llama.cpp's CPU device, its memory = this machine's RAM
    if devs:
        assert devs[0]["name"] == "CPU" and devs[0]["total_bytes"] > 0 and "llama.cpp sees: CPU" in out.output


@pytest.mark.parametrize("name", ["radeon-7900xtx", "strix-halo", "arc-b580", "dgx-spark"])
def test_hw_shows_each_device_and_its_build(name, isolated_home, monkeypatch):
    """`hw` on a recorded machine: vendor, memory kind and how it was computed, and which llama.cpp build would
    use the device against the installed one (here: a CPU build, so the reinstall line with the flags)."""
    from typer.testing import CliRunner

    import localrun.machine.hardware as H
    from localrun.cli import app

    prof = profile_of(name)
    monkeypatch.setattr(H, "probe_hardware", lambda *a, **k: prof)
    monkeypatch.setattr(H, "installed_backends", lambda *a, **k: {"CPU", "RPC"})
    monkeypatch.setattr(H, "llamacpp_devices", lambda *a, **k: [])
    monkeypatch.setenv("COLUMNS", "400")  # the tables' width (render.py), whatever the runner's environment
    out = CliRunner().invoke(app, ["hw"], terminal_width=400)
    assert out.exit_code == 0, out.output
    g = prof.gpus[0]
    assert g.name in out.output and f"({g.vendor})" in out.output
    assert (g.memory_note or "")[:40] in out.output
    flag = {"amd": "-DGGML_VULKAN=on", "intel": "-DGGML_VULKAN=on", "nvidia": "-DGGML_CUDA=on"}[g.vendor]
    assert "the installed llama.cpp has no" in out.output and flag in out.output
    js = CliRunner().invoke(app, ["hw", "--json"])
    d = json.loads(js.output)
    assert d["gpus"][0]["memory_kind"] == g.memory_kind and flag in d["gpus"][0]["llamacpp_build"]
