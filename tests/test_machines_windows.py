"""Windows GPUs from DXGI (localrun/machine/gpus_windows.py), tested here on Linux: recorded
``DXGI_ADAPTER_DESC1`` structures, built with ctypes in the real Windows x64 layout and read back from their
bytes by the real parsing code, compared field by field; the DXGI probe runs only on Windows.

The recorded adapters, from public reports:
* Radeon RX 7900 XTX: PCI ids 0x1002:0x744C rev 0xC8, subsystem 0x148C:0x2422 (PowerColor) and 24560 MiB of
  VRAM, from ``lact cli info`` in ilya-zlobintsev/LACT pull request #533; shared memory 16340 MB, the
  "Shared Memory" dxdiag (DXGI) reports next to a Radeon on a 32 GB machine
  (Tharylia/Blish-HUD-Module-Releases issue #16).
* GeForce RTX 4090: PCI ids 0x10DE:0x2684 rev 0xA1, subsystem 0x1458:0x40BF (Gigabyte), from ``lspci -vvvv``
  in geerlingguy/raspberry-pi-pcie-devices issue #504; 24 GiB of VRAM, NVIDIA's specification (DXGI may
  report a few MiB less: 12282 of 12288 MiB on an RTX 4080 Laptop GPU, jp7677/dxvk-nvapi pull request #198).
* Radeon 860M (iGPU): 512 MiB dedicated, 15,932 MiB shared; Intel Arc 140V: 128 MiB dedicated, 18,376 MiB
  shared: the DXCore values in microsoft/winml-cli pull request #1421.
* Microsoft Basic Render Driver: vendor 0x1414, the software adapter every Windows lists (skipped).
"""

from __future__ import annotations

import ctypes

import pytest

from localrun.machine import hardware
from localrun.machine.gpus_windows import (
    DXGI_ADAPTER_DESC1,
    WINDOWS_NOT_PROBED,
    gpu_from_desc,
    gpus_from_descs,
    probe_dxgi,
)
from localrun.machine.hardware import CpuInfo, DiskInfo, GiB, GpuInfo, probe_hardware

MiB = 1 << 20


def desc(name: str, vendor: int, device: int, subsys: int, rev: int, dedicated: int, shared: int, luid: int,
         flags: int = 0) -> bytes:
    """A DXGI_ADAPTER_DESC1 as GetDesc1 fills it, as raw bytes (what a recorded structure is)."""
    d = DXGI_ADAPTER_DESC1()
    units = name.encode("utf-16-le")
    for i in range(0, len(units), 2):
        d.Description[i // 2] = int.from_bytes(units[i:i + 2], "little")
    d.VendorId, d.DeviceId, d.SubSysId, d.Revision = vendor, device, subsys, rev
    d.DedicatedVideoMemory, d.DedicatedSystemMemory, d.SharedSystemMemory = dedicated, 0, shared
    d.AdapterLuid.LowPart, d.Flags = luid, flags
    return bytes(d)


XTX = desc("AMD Radeon RX 7900 XTX", 0x1002, 0x744C, 0x2422148C, 0xC8, 24560 * MiB, 16340 * MiB, 0x1001)
RTX4090 = desc("NVIDIA GeForce RTX 4090", 0x10DE, 0x2684, 0x40BF1458, 0xA1, 24 * GiB, 16340 * MiB, 0x1002)
R860M = desc("AMD Radeon 860M", 0x1002, 0x1114, 0, 0, 512 * MiB, 15932 * MiB, 0x1003)
ARC140V = desc("Intel Arc 140V GPU (16GB)", 0x8086, 0x64A0, 0, 0, 128 * MiB, 18376 * MiB, 0x1004)
WARP = desc("Microsoft Basic Render Driver", 0x1414, 0x8C, 0, 0, 0, 15932 * MiB, 0x1005, flags=2)
RAM_32, RAM_64 = 31864 * MiB, 64 * GiB  # the 860M's box (shared = half of it), a desktop


def parsed(raw: bytes) -> DXGI_ADAPTER_DESC1:
    return DXGI_ADAPTER_DESC1.from_buffer_copy(raw)


def test_the_structure_has_the_windows_x64_layout():
    assert ctypes.sizeof(DXGI_ADAPTER_DESC1) == 312 and len(XTX) == 312
    offsets = {name: getattr(DXGI_ADAPTER_DESC1, name).offset for name, _ in DXGI_ADAPTER_DESC1._fields_}
    assert offsets == {"Description": 0, "VendorId": 256, "DeviceId": 260, "SubSysId": 264, "Revision": 268,
                       "DedicatedVideoMemory": 272, "DedicatedSystemMemory": 280, "SharedSystemMemory": 288,
                       "AdapterLuid": 296, "Flags": 304}
    d = parsed(XTX)
    assert (d.description, d.VendorId, d.DeviceId, d.Revision) == ("AMD Radeon RX 7900 XTX", 0x1002, 0x744C, 0xC8)
    assert XTX[256:260] == (0x1002).to_bytes(4, "little") and XTX[272:280] == (24560 * MiB).to_bytes(8, "little")


EXPECTED = {
    "xtx": GpuInfo(name="AMD Radeon RX 7900 XTX", vendor="amd", backend="vulkan", total_bytes=25753026560,
                   free_bytes=25753026560 - GiB // 2, index=0, memory_kind="dedicated",
                   memory_note="VRAM (DXGI DedicatedVideoMemory); free not read on Windows: total less 0.5 GiB"),
    "4090": GpuInfo(name="NVIDIA GeForce RTX 4090", vendor="nvidia", backend="cuda", total_bytes=24 * GiB,
                    free_bytes=24 * GiB - GiB // 2, index=0, memory_kind="dedicated",
                    memory_note="VRAM (DXGI DedicatedVideoMemory); free not read on Windows: total less 0.5 GiB"),
    "860m": GpuInfo(name="AMD Radeon 860M", vendor="amd", backend="vulkan", total_bytes=16444 * MiB,
                    free_bytes=16444 * MiB, index=0, unified=True, working_set_bytes=16444 * MiB,
                    memory_kind="unified",
                    memory_note="unified pool: DXGI carve-out 0.5 GiB + shared 15.6 GiB, bounded by RAM less 4 GiB "
                                "→ 16.1 GiB; free not read on Windows"),
    "140v": GpuInfo(name="Intel Arc 140V GPU (16GB)", vendor="intel", backend="vulkan", total_bytes=18504 * MiB,
                    free_bytes=18504 * MiB, index=0, unified=True, working_set_bytes=18504 * MiB,
                    memory_kind="unified",
                    memory_note="unified pool: DXGI carve-out 0.1 GiB + shared 17.9 GiB, bounded by RAM less 4 GiB "
                                "→ 18.1 GiB; free not read on Windows"),
}


@pytest.mark.parametrize("key, raw, ram", [("xtx", XTX, RAM_64), ("4090", RTX4090, RAM_64), ("860m", R860M, RAM_32),
                                           ("140v", ARC140V, 36 * GiB)])
def test_each_recorded_adapter_is_read_field_by_field(key, raw, ram):
    g = gpu_from_desc(parsed(raw), 0, ram, ram)
    assert g == EXPECTED[key]


def test_software_adapters_and_duplicates_are_left_out():
    descs = [parsed(r) for r in (RTX4090, XTX, WARP, XTX)]  # the same LUID twice: one adapter
    gpus = gpus_from_descs(descs, RAM_64, RAM_64 - 4 * GiB)
    assert [(g.name, g.index) for g in gpus] == [("NVIDIA GeForce RTX 4090", 0), ("AMD Radeon RX 7900 XTX", 1)]
    assert gpu_from_desc(parsed(WARP), 0, RAM_64, RAM_64) is None


def machine(monkeypatch, platform: str, nvml: list[GpuInfo], descs: list[bytes]):
    monkeypatch.setattr(hardware.sys, "platform", platform)
    called = []

    def windows(total, avail):
        called.append(platform)
        return gpus_from_descs([parsed(r) for r in descs], total, avail)

    hw = probe_hardware("/tmp", cpu=lambda: CpuInfo("test", "x86_64", 8, 16), memory=lambda: (RAM_64, RAM_64 - 4 * GiB),
                        nvidia=lambda: list(nvml), apple=lambda t, a: [], linux_gpus=lambda t, a: [],
                        disk=lambda p: DiskInfo(p, 1 << 40, 1 << 39, "nvme"), windows=windows)
    return hw, called


def test_dxgi_runs_on_windows_only_and_nvml_keeps_the_nvidia_cards(monkeypatch):
    nvml = [GpuInfo(name="NVIDIA GeForce RTX 4090", vendor="nvidia", backend="cuda", total_bytes=24 * GiB,
                    free_bytes=23 * GiB, compute_capability="8.9")]
    hw, called = machine(monkeypatch, "win32", nvml, [RTX4090, XTX, WARP])
    assert called == ["win32"]
    assert [(g.vendor, g.free_bytes) for g in hw.gpus] == [("nvidia", 23 * GiB), ("amd", 25753026560 - GiB // 2)]
    hw, called = machine(monkeypatch, "win32", [], [RTX4090, R860M])  # no NVML: DXGI's NVIDIA card
    assert [(g.vendor, g.unified) for g in hw.gpus] == [("nvidia", False), ("amd", True)]  # the iGPU after the card
    hw, called = machine(monkeypatch, "linux", [], [RTX4090, XTX])
    assert called == [] and hw.gpus == []


def test_dxgi_probe_is_empty_off_windows_and_says_what_it_does_not_read():
    assert probe_dxgi(RAM_64, RAM_64) == []
    assert "free VRAM is not read" in WINDOWS_NOT_PROBED
