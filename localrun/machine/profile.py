"""A machine's description: ``HardwareProfile`` (CPU, RAM, GPUs, the model disk) and its parts, as the probes
(``hardware.py``, ``gpus_linux.py``) and the presets (``presets.py``) build it. Sizes are bytes, bandwidths
GB/s (10^9 B/s). Profiles round-trip through ``to_dict``/``from_dict`` (JSON).
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from typing import Any

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
    memory_kind: str | None = None  # "dedicated" | "unified" (None: not said, e.g. an older profile)
    memory_note: str | None = None  # how the budget was computed (the GTT rule, /proc/meminfo, …)
    arch: str | None = None  # AMD: the gfx target HIP builds for (AMDGPU_TARGETS)

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
            t.add_row("GPU", "none detected: CPU only (AMD, Intel, NVIDIA and Apple probed)")
        for g in self.gpus:
            extra = []
            if g.compute_capability:
                extra.append(f"compute {g.compute_capability}")
            if g.driver:
                extra.append(f"driver {g.driver}")
            if g.unified:
                extra.append(f"unified memory; GPU working set {fmt_bytes(g.working_set_bytes or 0)}")
            if g.memory_note:
                extra.append(g.memory_note)
            t.add_row(f"GPU {g.index}", f"{g.name} ({g.vendor}) [{g.backend}] {fmt_bytes(g.total_bytes)} total, "
                      f"{fmt_bytes(g.free_bytes)} free" + (f" ({', '.join(extra)})" if extra else ""))
        if self.disk:
            d = self.disk
            t.add_row("Disk", f"{d.path}: {fmt_bytes(d.free_bytes)} free of {fmt_bytes(d.total_bytes)} ({d.kind})")
        return t


from localrun.units import fmt_bytes  # noqa: E402
