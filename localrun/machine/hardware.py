"""What this machine has: CPU, RAM, GPUs (NVIDIA through NVML, AMD/Intel/Jetson from sysfs on Linux, DXGI on
Windows, Apple unified memory), and the model disk.

``probe_hardware()`` assembles a ``HardwareProfile`` from small probe functions. Each probe is a
parameter, so tests (and ``localrun fit --vram 24GiB``) describe machines this box is not. Profiles
round-trip through ``to_dict``/``from_dict`` (JSON). Sizes are bytes, bandwidths GB/s (10^9 B/s).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

from localrun.machine.gpus_linux import (  # noqa: F401  (re-exported: the probes have one import point)
    build_advice,
    installed_backends,
    llamacpp_devices,
    meminfo,
    probe_amd,
    probe_intel,
    probe_linux_gpus,
    probe_nvidia_unified,
    unified_pool,
)
from localrun.machine.gpus_windows import WINDOWS_NOT_PROBED, probe_dxgi  # noqa: F401  (re-exported)
from localrun.machine.profile import CpuInfo, DiskInfo, GiB, GpuInfo, HardwareProfile  # noqa: F401
from localrun.units import fmt_bytes, parse_bytes  # noqa: F401  (re-exported for existing importers)

# ---------------------------------------------------------------------------------------------------
# probes (each returns plain data and never raises for a missing device)
# ---------------------------------------------------------------------------------------------------

def probe_cpu() -> CpuInfo:
    import psutil

    arch = platform.machine().lower()
    model = platform.processor() or arch
    simd: list[str] = []
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        text = cpuinfo.read_text(errors="replace")
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        if m:
            model = m.group(1).strip()
        fm = re.search(r"^(flags|Features)\s*:\s*(.+)$", text, re.M)
        flags = set(fm.group(2).split()) if fm else set()
        for flag, label in (("avx", "AVX"), ("avx2", "AVX2"), ("fma", "FMA"), ("f16c", "F16C"),
                            ("avx512f", "AVX512F"), ("avx512_bf16", "AVX512_BF16"),
                            ("avx512_vnni", "AVX512_VNNI"), ("avx_vnni", "AVX_VNNI"), ("amx_tile", "AMX"),
                            ("asimd", "NEON"), ("sve", "SVE"), ("asimddp", "DOTPROD")):
            if flag in flags:
                simd.append(label)
    elif platform.system() == "Darwin":
        model = _sysctl("machdep.cpu.brand_string") or model
        if arch in ("arm64", "aarch64"):
            simd = ["NEON", "DOTPROD"]
    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    logical = psutil.cpu_count(logical=True) or physical
    return CpuInfo(model=model, arch=arch, physical_cores=physical, logical_cores=logical, simd=simd)


def probe_memory() -> tuple[int, int]:
    """(total, available) RAM in bytes."""
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


def probe_nvidia() -> list[GpuInfo]:
    """NVIDIA GPUs through NVML (nvidia-ml-py). [] when there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    gpus = []
    try:
        driver = _s(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            except pynvml.NVMLError:  # NOT_SUPPORTED on coherent unified memory (DGX Spark's GB10)
                total, avail = probe_memory()
                gpus += probe_nvidia_unified(total, avail, nvml=[(_s(pynvml.nvmlDeviceGetName(h)), None)])
                gpus[-1].index, gpus[-1].driver = i, driver
                continue
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                cc = f"{major}.{minor}"
            except Exception:
                cc = None
            gpus.append(GpuInfo(name=_s(pynvml.nvmlDeviceGetName(h)), vendor="nvidia", backend="cuda",
                                total_bytes=int(mem.total), free_bytes=int(mem.free), index=i,
                                compute_capability=cc, driver=driver))
    except Exception:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return gpus


def apple_working_set_bytes(ram_bytes: int, wired_limit_mb: int | None = None) -> int:
    """Metal's GPU working-set budget on Apple Silicon.

    ``iogpu.wired_limit_mb`` when the user set it (sysctl), else macOS's default
    recommendedMaxWorkingSetSize: about 2/3 of RAM up to 32 GiB (inclusive), 3/4 above
    (as measured by llama.cpp and mlx-lm users; ggml-metal reports the same value).
    """
    if wired_limit_mb:
        return int(wired_limit_mb) << 20
    return ram_bytes * 2 // 3 if ram_bytes <= 32 * GiB else ram_bytes * 3 // 4


def probe_apple(ram_total: int, ram_available: int) -> list[GpuInfo]:
    """Apple Silicon's GPU (Mac only; [] elsewhere). Lines below run only on macOS arm64."""
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return []
    chip = _sysctl("machdep.cpu.brand_string") or "Apple Silicon"
    wired = _sysctl("iogpu.wired_limit_mb")
    ws = apple_working_set_bytes(ram_total, int(wired) if wired and wired.isdigit() else None)
    return [GpuInfo(name=chip, vendor="apple", backend="metal", total_bytes=ram_total,
                    free_bytes=ram_available, unified=True, working_set_bytes=ws)]


def probe_disk(path: str | os.PathLike) -> DiskInfo:
    """Free space and kind (nvme/ssd/hdd) of the filesystem holding ``path`` (created if missing)."""
    import psutil

    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    usage = psutil.disk_usage(str(p))
    return DiskInfo(path=str(path), total_bytes=int(usage.total), free_bytes=int(usage.free),
                    kind=_disk_kind(p))


def _disk_kind(p: Path) -> str:
    if platform.system() == "Darwin":
        return "nvme"  # every Apple Silicon Mac boots from NVMe
    try:
        import psutil

        best = None
        for part in psutil.disk_partitions(all=False):
            longer = best is None or len(part.mountpoint) > len(best.mountpoint)
            if str(p.resolve()).startswith(part.mountpoint) and longer:
                best = part
        if best is None:
            return "unknown"
        dev = Path(best.device).name
        if dev.startswith("nvme"):
            return "nvme"
        base = re.sub(r"p?\d+$", "", dev) if not dev.startswith("nvme") else dev
        rot = Path(f"/sys/block/{base}/queue/rotational")
        if rot.exists():
            return "hdd" if rot.read_text().strip() == "1" else "ssd"
    except Exception:
        pass
    return "unknown"


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except Exception:
        return None


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def probe_hardware(
    models_dir: str | os.PathLike | None = None,
    *,
    cpu: Callable[[], CpuInfo] = probe_cpu,
    memory: Callable[[], tuple[int, int]] = probe_memory,
    nvidia: Callable[[], list[GpuInfo]] = probe_nvidia,
    apple: Callable[[int, int], list[GpuInfo]] = probe_apple,
    disk: Callable[[str], DiskInfo] = probe_disk,
    linux_gpus: Callable[[int, int], list[GpuInfo]] = probe_linux_gpus,
    windows: Callable[[int, int], list[GpuInfo]] = probe_dxgi,
) -> HardwareProfile:
    """Detect this machine. Every probe is replaceable (tests inject a 24 GB GPU or a 16 GB Mac, or point
    ``probe_linux_gpus`` at a recorded sysfs tree). ``windows`` (DXGI) is called only on Windows; its NVIDIA
    adapters are left out when NVML reported NVIDIA cards (NVML gives their free memory)."""
    total, avail = memory()
    gpus = nvidia()
    if sys.platform == "win32":
        gpus += [g for g in windows(total, avail) if not (g.vendor == "nvidia" and any(n.vendor == "nvidia"
                                                                                        for n in gpus))]
    gpus += [g for g in linux_gpus(total, avail)
             if not (g.vendor == "nvidia" and any(n.vendor == "nvidia" and n.unified for n in gpus))]
    gpus += apple(total, avail)
    # discrete GPUs first, integrated ones (unified memory) after: llama.cpp's device order (src/llama.cpp
    # llama_model_load_from_file_impl adds iGPUs only when no other GPU is there), so a discrete card's
    # position here is the main_gpu llama.cpp takes (offload/devices.py gpu_list_of)
    gpus.sort(key=lambda g: g.unified)
    if models_dir is None:
        from localrun.config import get_settings

        models_dir = get_settings().models_dir
    return HardwareProfile(
        cpu=cpu(), ram_total_bytes=total, ram_available_bytes=avail, gpus=gpus, disk=disk(str(models_dir))
    )
