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


# AMD, Intel, APUs and NVIDIA unified-memory machines, as the sysfs probes report them; the
# recorded trees in tests/data/machines/ give the same numbers. name → a function building the profile
_OTHER = ("amd-24gb", "amd-16gb", "intel-arc-12gb", "strix-halo-128gb", "dgx-spark-128gb", "laptop-780m-32gb",
          "jetson-orin-64gb", "nvidia-24gb+amd-16gb")


def preset_names() -> list[str]:
    return [*_NVIDIA, *_MULTI, *_APPLE, "laptop-16gb", *_OTHER]


def _dedicated(name: str, vendor: str, vram_gib: int, index: int = 0, arch: str | None = None,
               backend: str = "vulkan") -> GpuInfo:
    return GpuInfo(name=name, vendor=vendor, backend=backend, total_bytes=vram_gib * GiB,
                   free_bytes=vram_gib * GiB - GiB // 2, index=index, memory_kind="dedicated",
                   memory_note="VRAM", arch=arch)


def _unified(name: str, vendor: str, ram: int, pool: int, backend: str, note: str, arch: str | None = None
             ) -> GpuInfo:
    """A GPU sharing ``ram`` bytes of RAM, its budget ``pool`` (the GTT rule, or RAM less the OS)."""
    return GpuInfo(name=name, vendor=vendor, backend=backend, total_bytes=pool, free_bytes=min(pool, ram - 3 * GiB),
                   unified=True, working_set_bytes=pool, memory_kind="unified", memory_note=note, arch=arch)


def _other_preset(key: str, disk: DiskInfo) -> HardwareProfile:
    from localrun.machine.gpus_linux import OS_RESERVE_BYTES, unified_pool

    zen = CpuInfo(model="AMD Ryzen (16 cores)", arch="x86_64", physical_cores=16, logical_cores=32,
                  simd=["AVX", "AVX2", "FMA", "F16C", "AVX512F"])
    arm = CpuInfo(model="Arm (20 cores)", arch="aarch64", physical_cores=20, logical_cores=20,
                  simd=["NEON", "DOTPROD", "SVE"])
    if key in ("amd-24gb", "amd-16gb", "intel-arc-12gb"):
        gpu, ram = {"amd-24gb": (_dedicated("AMD Radeon RX 7900 XTX", "amd", 24, arch="gfx1100"), 64),
                    "amd-16gb": (_dedicated("AMD Radeon RX 7800 XT", "amd", 16, arch="gfx1101"), 32),
                    "intel-arc-12gb": (_dedicated("Intel Arc B580", "intel", 12), 32)}[key]
        return HardwareProfile(cpu=_X86, ram_total_bytes=ram * GiB, ram_available_bytes=(ram - 3) * GiB, gpus=[gpu],
                               disk=disk, os="Linux", label=f"{key}: {gpu.name} {gpu.total_bytes // GiB} GB "
                               f"(Vulkan) + {ram} GB RAM")
    if key == "nvidia-24gb+amd-16gb":
        gpus = [_dedicated("NVIDIA GeForce RTX 4090", "nvidia", 24), _dedicated("AMD Radeon RX 7800 XT", "amd", 16,
                                                                                 index=1, arch="gfx1101")]
        gpus[1].free_bytes = 16 * GiB - GiB // 8  # the desktop's framebuffer sits on GPU 0
        return HardwareProfile(cpu=_X86, ram_total_bytes=64 * GiB, ram_available_bytes=61 * GiB, gpus=gpus,
                               disk=disk, os="Linux", label=f"{key}: RTX 4090 24 GB + RX 7800 XT 16 GB over Vulkan "
                               "+ 64 GB RAM")
    if key in ("strix-halo-128gb", "laptop-780m-32gb"):
        # BIOS carve-out 512 MiB + GTT 96 GiB (ttm.pages_limit=25165824), or a 2 GiB carve-out + 16 GiB GTT:
        # the OS sees RAM less the carve-out
        ram_gib, carve, gtt, name, arch, cpu = {
            "strix-halo-128gb": (128, GiB // 2, 96 * GiB, "AMD Radeon 8060S (Strix Halo)", "gfx1151", zen),
            "laptop-780m-32gb": (32, 2 * GiB, 16 * GiB, "AMD Radeon 780M (Phoenix)", "gfx1103", _LAPTOP)}[key]
        ram = ram_gib * GiB - carve
        pool, _, how = unified_pool(gtt, 0, ram, ram - 3 * GiB)
        gpu = _unified(name, "amd", ram, pool, "vulkan", how + f"; BIOS carve-out {carve / GiB:.1f} GiB not counted",
                       arch=arch)
        return HardwareProfile(cpu=cpu, ram_total_bytes=ram, ram_available_bytes=ram - 3 * GiB, gpus=[gpu], disk=disk,
                               os="Linux", label=f"{key}: {name}, {ram_gib} GB shared (GTT {gtt // GiB} GB)")
    if key in ("dgx-spark-128gb", "jetson-orin-64gb"):
        # RAM the OS reports (MemTotal): GB10 127600748 kB (a DGX Spark owner's /proc/meminfo), Orin 64335836 kB
        # (approximate: 64 GB less firmware carve-outs); tests/data/machines/SOURCES.md
        ram, name = {"dgx-spark-128gb": (127600748 * 1024, "NVIDIA GB10"),
                     "jetson-orin-64gb": (64335836 * 1024, "NVIDIA Jetson AGX Orin")}[key]
        gpu = _unified(name, "nvidia", ram, ram - OS_RESERVE_BYTES, "cuda", "unified: /proc/meminfo, RAM less 4 GiB")
        gpu.compute_capability = "12.1" if "GB10" in name else "8.7"
        cpu = arm if "GB10" in name else CpuInfo(model="Arm Cortex-A78AE (12 cores)", arch="aarch64",
                                                 physical_cores=12, logical_cores=12, simd=["NEON", "DOTPROD"])
        return HardwareProfile(cpu=cpu, ram_total_bytes=ram, ram_available_bytes=ram - 3 * GiB, gpus=[gpu], disk=disk,
                               os="Linux", label=f"{key}: {name}, {ram // GiB} GB unified memory")
    raise AssertionError(key)


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
    if key in _OTHER:
        return _other_preset(key, disk)
    if key == "laptop-16gb":
        return HardwareProfile(cpu=_LAPTOP, ram_total_bytes=16 * GiB, ram_available_bytes=13 * GiB, gpus=[],
                               disk=DiskInfo("~/.localrun/models", 512 * GiB, 200 * GiB, "nvme"), os="Linux",
                               label="laptop-16gb: 16 GB RAM, no GPU")
    raise ConfigError(f"unknown hardware preset {name!r}", hint=f"use one of {', '.join(preset_names())}")
