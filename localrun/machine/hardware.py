"""What this machine has: CPU, RAM, GPUs (NVIDIA through NVML, Apple unified memory), and the model disk.

``probe_hardware()`` assembles a ``HardwareProfile`` from small probe functions. Each probe is a
parameter, so tests (and ``localrun fit --vram 24GiB``) describe machines this box is not. Profiles
round-trip through ``to_dict``/``from_dict`` (JSON). Sizes are bytes, bandwidths GB/s (10^9 B/s).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

GiB = 1 << 30


@dataclass
class CpuInfo:
    model: str
    arch: str  # x86_64, arm64, aarch64
    physical_cores: int
    logical_cores: int
    simd: list[str] = field(default_factory=list)  # AVX, AVX2, AVX512F, FMA, F16C, NEON, …


@dataclass
class GpuInfo:
    """One accelerator. ``unified`` GPUs (Apple) share RAM; their budget is ``working_set_bytes``."""

    name: str
    vendor: str  # nvidia | apple | amd | intel
    backend: str  # cuda | metal | vulkan | rocm
    total_bytes: int
    free_bytes: int
    index: int = 0
    compute_capability: str | None = None
    driver: str | None = None
    unified: bool = False
    working_set_bytes: int | None = None  # Apple: recommendedMaxWorkingSetSize or iogpu.wired_limit_mb
    endpoint: str | None = None  # backend "rpc": the worker's host:port (llama.cpp's RPC backend)
    link: dict | None = None  # backend "rpc": {"latency_s", "bandwidth_gbps", "source"} to that worker

    @property
    def usable_bytes(self) -> int:
        """What a model may use on this GPU: free VRAM, or the Metal working-set budget on Apple."""
        if self.unified and self.working_set_bytes:
            return min(self.working_set_bytes, self.free_bytes)
        return self.free_bytes


@dataclass
class DiskInfo:
    path: str
    total_bytes: int
    free_bytes: int
    kind: str = "unknown"  # nvme | ssd | hdd | unknown


@dataclass
class HardwareProfile:
    cpu: CpuInfo
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: list[GpuInfo] = field(default_factory=list)
    disk: DiskInfo | None = None
    os: str = field(default_factory=platform.system)
    label: str | None = None  # a preset's name, or None for the detected machine

    @property
    def is_apple_silicon(self) -> bool:
        return any(g.unified and g.vendor == "apple" for g in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HardwareProfile":
        return cls(
            cpu=CpuInfo(**d["cpu"]),
            ram_total_bytes=int(d["ram_total_bytes"]),
            ram_available_bytes=int(d["ram_available_bytes"]),
            gpus=[GpuInfo(**g) for g in d.get("gpus", [])],
            disk=DiskInfo(**d["disk"]) if d.get("disk") else None,
            os=d.get("os", platform.system()),
            label=d.get("label"),
        )

    def __rich__(self):
        from rich.table import Table

        t = Table(title=self.label or "This machine", show_header=True, header_style="bold")
        t.add_column("component")
        t.add_column("details")
        c = self.cpu
        t.add_row("CPU", f"{c.model} ({c.arch}), {c.physical_cores} cores / {c.logical_cores} threads"
                  + (f", {' '.join(c.simd)}" if c.simd else ""))
        t.add_row("RAM", f"{fmt_bytes(self.ram_total_bytes)} total, {fmt_bytes(self.ram_available_bytes)} available")
        if not self.gpus:
            t.add_row("GPU", "none detected (CPU inference)")
        for g in self.gpus:
            extra = []
            if g.compute_capability:
                extra.append(f"compute {g.compute_capability}")
            if g.driver:
                extra.append(f"driver {g.driver}")
            if g.unified:
                extra.append(f"unified memory; GPU working set {fmt_bytes(g.working_set_bytes or 0)}")
            t.add_row(f"GPU {g.index}", f"{g.name} [{g.backend}] {fmt_bytes(g.total_bytes)} total, "
                      f"{fmt_bytes(g.free_bytes)} free" + (f" ({', '.join(extra)})" if extra else ""))
        if self.disk:
            d = self.disk
            t.add_row("Disk", f"{d.path}: {fmt_bytes(d.free_bytes)} free of {fmt_bytes(d.total_bytes)} ({d.kind})")
        return t


# byte formatting and parsing live in localrun.units; re-exported for existing importers
from localrun.units import fmt_bytes, parse_bytes  # noqa: E402,F401

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
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
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
) -> HardwareProfile:
    """Detect this machine. Every probe is replaceable (tests inject a 24 GB GPU or a 16 GB Mac)."""
    total, avail = memory()
    gpus = nvidia() + apple(total, avail)
    if models_dir is None:
        from localrun.config import get_settings

        models_dir = get_settings().models_dir
    return HardwareProfile(
        cpu=cpu(), ram_total_bytes=total, ram_available_bytes=avail, gpus=gpus, disk=disk(str(models_dir))
    )
