"""GPUs on Windows through DXGI: each adapter's ``DXGI_ADAPTER_DESC1`` (``CreateDXGIFactory1`` →
``IDXGIFactory1::EnumAdapters1`` → ``IDXGIAdapter1::GetDesc1``, dxgi.h), read with ctypes: no package to install.

What it reads, per adapter: ``Description`` (the driver's name), ``VendorId`` (0x10DE NVIDIA, 0x1002 AMD, 0x8086
Intel), ``DedicatedVideoMemory`` (bytes of VRAM; an iGPU's BIOS carve-out), ``SharedSystemMemory`` (bytes of
RAM the GPU may map: Windows' default is half of RAM), ``Flags`` (software adapters such as the Basic Render
Driver are skipped). What it does not read: free VRAM (``IDXGIAdapter3::QueryVideoMemoryInfo`` is not called;
a card's free memory is its total less ``DESKTOP_RESERVE_BYTES``, as the presets assume), the PCI bus order
(adapters come in DXGI's order, the primary display first), the AMD gfx target (HIP builds), compute
capability. NVML still runs on Windows and is preferred for NVIDIA cards (it gives free memory).
WMI's ``Win32_VideoController.AdapterRAM`` is not used: it is a 32-bit field, so any card over 4 GiB reads
4 GiB or less (a 24 GB RTX 4090 reports 4095 MB).

``probe_dxgi`` runs only on Windows (``sys.platform == "win32"``); the parsing (``gpu_from_desc``) is plain
Python over the structure's bytes, so tests run it anywhere on recorded structures.
"""

from __future__ import annotations

import ctypes
import sys

from localrun.machine.profile import GiB, GpuInfo

VENDORS = {0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel"}  # PCI vendor ids
DXGI_ADAPTER_FLAG_SOFTWARE = 2  # dxgi.h DXGI_ADAPTER_FLAG: the Microsoft Basic Render Driver (WARP)
DESKTOP_RESERVE_BYTES = GiB // 2  # what the desktop and driver keep on a display card (the presets' assumption)
IGPU_DEDICATED_MAX = 4 * GiB  # an iGPU's carve-out is 128 MiB-4 GiB unless the user raised it in the firmware
OS_RESERVE_BYTES = 4 * GiB  # RAM the OS keeps when the GPU shares it (as on Linux, gpus_linux.OS_RESERVE_BYTES)
DXGI_ERROR_NOT_FOUND = 0x887A0002  # EnumAdapters1 past the last adapter
# vtable slots (dxgi.h, IUnknown 0-2, IDXGIObject 3-6): IDXGIFactory1::EnumAdapters1, IDXGIAdapter1::GetDesc1
_RELEASE, _ENUM_ADAPTERS1, _GET_DESC1 = 2, 12, 10
IID_IDXGIFactory1 = (0x770AAE78, 0xF26F, 0x4DBA, (0xA8, 0x29, 0x25, 0x3C, 0x83, 0xD1, 0xB3, 0x87))


class LUID(ctypes.Structure):
    _fields_ = [("LowPart", ctypes.c_uint32), ("HighPart", ctypes.c_int32)]


class DXGI_ADAPTER_DESC1(ctypes.Structure):
    """dxgi.h's structure in its Windows x64 layout (312 bytes): WCHAR is 16-bit UTF-16 and SIZE_T 64-bit,
    so the fields are fixed-width here and the layout is the same on any 64-bit host."""

    _fields_ = [("Description", ctypes.c_uint16 * 128), ("VendorId", ctypes.c_uint32),
                ("DeviceId", ctypes.c_uint32), ("SubSysId", ctypes.c_uint32), ("Revision", ctypes.c_uint32),
                ("DedicatedVideoMemory", ctypes.c_uint64), ("DedicatedSystemMemory", ctypes.c_uint64),
                ("SharedSystemMemory", ctypes.c_uint64), ("AdapterLuid", LUID), ("Flags", ctypes.c_uint32)]

    @property
    def description(self) -> str:
        units = list(self.Description)
        n = units.index(0) if 0 in units else len(units)
        return b"".join(u.to_bytes(2, "little") for u in units[:n]).decode("utf-16-le", errors="replace")


def gpu_from_desc(desc: DXGI_ADAPTER_DESC1, position: int, ram_total: int, ram_available: int) -> GpuInfo | None:
    """The ``GpuInfo`` for one adapter's description (None: a software adapter or an unknown vendor). A card
    with ``DedicatedVideoMemory`` over ``IGPU_DEDICATED_MAX`` is dedicated VRAM (free: its total less
    ``DESKTOP_RESERVE_BYTES``); an AMD or Intel adapter with less and more shared memory is an iGPU: one pool
    with the RAM, its carve-out plus ``SharedSystemMemory``, bounded by the RAM less ``OS_RESERVE_BYTES``."""
    vendor = VENDORS.get(int(desc.VendorId))
    if vendor is None or desc.Flags & DXGI_ADAPTER_FLAG_SOFTWARE:
        return None
    name = desc.description.strip() or f"{vendor} GPU 0x{desc.DeviceId:04x}"
    dedicated, shared = int(desc.DedicatedVideoMemory), int(desc.SharedSystemMemory)
    backend = "cuda" if vendor == "nvidia" else "vulkan"
    if vendor != "nvidia" and dedicated <= IGPU_DEDICATED_MAX and shared > dedicated:
        pool = min(dedicated + shared, max(0, ram_total - OS_RESERVE_BYTES))
        note = (f"unified pool: DXGI carve-out {dedicated / GiB:.1f} GiB + shared {shared / GiB:.1f} GiB, bounded "
                f"by RAM less 4 GiB → {pool / GiB:.1f} GiB; free not read on Windows")
        return GpuInfo(name=name, vendor=vendor, backend=backend, total_bytes=pool,
                       free_bytes=min(pool, ram_available), index=position, unified=True, working_set_bytes=pool,
                       memory_kind="unified", memory_note=note)
    return GpuInfo(name=name, vendor=vendor, backend=backend, total_bytes=dedicated,
                   free_bytes=max(0, dedicated - DESKTOP_RESERVE_BYTES), index=position, memory_kind="dedicated",
                   memory_note="VRAM (DXGI DedicatedVideoMemory); free not read on Windows: total less 0.5 GiB")


def gpus_from_descs(descs: list[DXGI_ADAPTER_DESC1], ram_total: int, ram_available: int) -> list[GpuInfo]:
    """``gpu_from_desc`` over the adapters in DXGI's order, software adapters and duplicates (the same
    adapter LUID listed twice) left out."""
    out, seen = [], set()
    for i, d in enumerate(descs):
        luid = (d.AdapterLuid.LowPart, d.AdapterLuid.HighPart)
        g = gpu_from_desc(d, i, ram_total, ram_available)
        if g is not None and luid not in seen:
            seen.add(luid)
            out.append(g)
    return out


def enum_adapter_descs() -> list[DXGI_ADAPTER_DESC1]:  # pragma: no cover - Windows only
    """Every adapter's ``DXGI_ADAPTER_DESC1`` through dxgi.dll's COM interfaces. [] on failure."""
    dxgi = ctypes.WinDLL("dxgi")
    hresult, vp = ctypes.c_long, ctypes.c_void_p

    class GUID(ctypes.Structure):
        _fields_ = [("a", ctypes.c_uint32), ("b", ctypes.c_uint16), ("c", ctypes.c_uint16),
                    ("d", ctypes.c_uint8 * 8)]

    def method(obj, slot: int, *argtypes):
        table = ctypes.cast(ctypes.cast(obj, ctypes.POINTER(vp))[0], ctypes.POINTER(vp))
        return ctypes.WINFUNCTYPE(hresult, vp, *argtypes)(table[slot])

    a, b, c, d = IID_IDXGIFactory1
    iid, factory = GUID(a, b, c, (ctypes.c_uint8 * 8)(*d)), vp()
    if dxgi.CreateDXGIFactory1(ctypes.byref(iid), ctypes.byref(factory)) != 0:
        return []
    out: list[DXGI_ADAPTER_DESC1] = []
    try:
        for i in range(16):
            adapter = vp()
            hr = method(factory, _ENUM_ADAPTERS1, ctypes.c_uint, ctypes.POINTER(vp))(factory, i, ctypes.byref(adapter))
            if hr != 0:  # DXGI_ERROR_NOT_FOUND (0x887A0002): no more adapters
                break
            desc = DXGI_ADAPTER_DESC1()
            if method(adapter, _GET_DESC1, ctypes.POINTER(DXGI_ADAPTER_DESC1))(adapter, ctypes.byref(desc)) == 0:
                out.append(desc)
            method(adapter, _RELEASE)(adapter)
    finally:
        method(factory, _RELEASE)(factory)
    return out


def probe_dxgi(ram_total: int, ram_available: int) -> list[GpuInfo]:
    """Windows GPUs from DXGI (module docstring); [] off Windows or when DXGI cannot be read. Never raises."""
    if sys.platform != "win32":
        return []
    try:  # pragma: no cover - Windows only
        return gpus_from_descs(enum_adapter_descs(), ram_total, ram_available)
    except (OSError, AttributeError, ValueError):  # pragma: no cover
        return []


WINDOWS_NOT_PROBED = ("on Windows DXGI gives each adapter's total memory: free VRAM is not read (a card is "
                      "planned with its total less 0.5 GiB unless NVML reports it), nor the PCI order, an AMD "
                      "card's gfx target or an iGPU's use of shared memory")
