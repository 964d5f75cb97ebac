"""Named machines for `localrun fit --preset NAME`: common consumer GPUs, Apple Silicon Macs, a laptop.

Each is a ``HardwareProfile`` as ``probe_hardware`` would report it on an idle machine: free VRAM = total
minus what the desktop/driver keeps (≈ 0.5 GiB), available RAM = total minus ≈ 2-3 GiB for the OS,
Apple's GPU working set from ``apple_working_set_bytes``.
"""

from __future__ import annotations

from localrun.errors import ConfigError
from localrun.machine.hardware import CpuInfo, DiskInfo, GiB, GpuInfo, HardwareProfile, apple_working_set_bytes

_X86 = CpuInfo(model="x86-64 desktop CPU (8 cores)", arch="x86_64", physical_cores=8, logical_cores=16,
               simd=["AVX", "AVX2", "FMA", "F16C"])
_LAPTOP = CpuInfo(model="x86-64 laptop CPU (6 cores)", arch="x86_64", physical_cores=6, logical_cores=12,
                  simd=["AVX", "AVX2", "FMA", "F16C"])

_NVIDIA = {  # name → (card, VRAM GiB, system RAM GiB)
    "nvidia-8gb": ("NVIDIA GeForce RTX 4060", 8, 32),
    "nvidia-12gb": ("NVIDIA GeForce RTX 3060", 12, 32),
    "nvidia-16gb": ("NVIDIA GeForce RTX 4060 Ti", 16, 32),
    "nvidia-24gb": ("NVIDIA GeForce RTX 4090", 24, 64),
}
_APPLE = {"mac-16gb": ("Apple M2", 16, 8), "mac-36gb": ("Apple M3 Pro", 36, 11),
          "mac-64gb": ("Apple M2 Max", 64, 12), "mac-128gb": ("Apple M4 Max", 128, 16)}
# several GPUs in one box: name → ([(card, VRAM GiB), …], system RAM GiB)
_MULTI = {"2x24gb": ([("NVIDIA GeForce RTX 3090", 24)] * 2, 64),
          "24+12gb": ([("NVIDIA GeForce RTX 4090", 24), ("NVIDIA GeForce RTX 3060", 12)], 64),
          "3x16gb": ([("NVIDIA GeForce RTX 4060 Ti", 16)] * 3, 64)}
ALIASES = {"8gb": "nvidia-8gb", "12gb": "nvidia-12gb", "16gb": "nvidia-16gb", "24gb": "nvidia-24gb",
           "laptop": "laptop-16gb", "cpu-16gb": "laptop-16gb"}


def preset_names() -> list[str]:
    return [*_NVIDIA, *_MULTI, *_APPLE, "laptop-16gb"]


def get_preset(name: str) -> HardwareProfile:
    """The preset called ``name`` (case-insensitive; aliases such as ``12gb``). Raises ConfigError."""
    key = ALIASES.get(name.lower(), name.lower())
    disk = DiskInfo(path="~/.localrun/models", total_bytes=1024 * GiB, free_bytes=500 * GiB, kind="nvme")
    if key in _NVIDIA:
        card, vram, ram = _NVIDIA[key]
        gpu = GpuInfo(name=card, vendor="nvidia", backend="cuda", total_bytes=vram * GiB,
                      free_bytes=vram * GiB - GiB // 2, compute_capability="8.9")
        return HardwareProfile(cpu=_X86, ram_total_bytes=ram * GiB, ram_available_bytes=(ram - 3) * GiB,
                               gpus=[gpu], disk=disk, os="Linux", label=f"{key}: {card} {vram} GB + {ram} GB RAM")
    if key in _MULTI:
        cards, ram = _MULTI[key]
        gpus = [GpuInfo(name=card, vendor="nvidia", backend="cuda", total_bytes=vram * GiB,
                        free_bytes=vram * GiB - (GiB // 2 if i == 0 else GiB // 8), index=i, compute_capability="8.6")
                for i, (card, vram) in enumerate(cards)]  # the desktop's framebuffer sits on GPU 0
        what = " + ".join(f"{c} {v} GB" for c, v in cards)
        return HardwareProfile(cpu=_X86, ram_total_bytes=ram * GiB, ram_available_bytes=(ram - 3) * GiB,
                               gpus=gpus, disk=disk, os="Linux", label=f"{key}: {what} + {ram} GB RAM")
    if key in _APPLE:
        chip, ram, cores = _APPLE[key]
        cpu = CpuInfo(model=chip, arch="arm64", physical_cores=cores, logical_cores=cores, simd=["NEON", "DOTPROD"])
        avail = ram * GiB - 3 * GiB
        gpu = GpuInfo(name=chip, vendor="apple", backend="metal", total_bytes=ram * GiB, free_bytes=avail,
                      unified=True, working_set_bytes=apple_working_set_bytes(ram * GiB))
        return HardwareProfile(cpu=cpu, ram_total_bytes=ram * GiB, ram_available_bytes=avail, gpus=[gpu],
                               disk=disk, os="Darwin", label=f"{key}: {chip} {ram} GB unified memory")
    if key == "laptop-16gb":
        return HardwareProfile(cpu=_LAPTOP, ram_total_bytes=16 * GiB, ram_available_bytes=13 * GiB, gpus=[],
                               disk=DiskInfo("~/.localrun/models", 512 * GiB, 200 * GiB, "nvme"), os="Linux",
                               label="laptop-16gb: 16 GB RAM, no GPU")
    raise ConfigError(f"unknown hardware preset {name!r}", hint=f"use one of {', '.join(preset_names())}")
