"""AMD, Intel and NVIDIA unified-memory GPUs on Linux, from sysfs and procfs under a ``root``, and which
llama.cpp build would use each (see the comment block below for the sources)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from localrun.machine.profile import GiB, GpuInfo


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)

# ---------------------------------------------------------------------------------------------------
# AMD, Intel and NVIDIA unified-memory GPUs on Linux (sysfs/procfs under a root), and llama.cpp builds
# ---------------------------------------------------------------------------------------------------
# AMD, Intel and NVIDIA unified-memory GPUs on Linux from sysfs / procfs, and the llama.cpp build each needs.
#
# Every probe reads files under a ``root`` (default ``/``), so tests point it at a recorded tree
# (``tests/data/machines/<name>/``). Nothing here imports a vendor library; none of it raises for a missing
# device.
#
# * AMD (``amdgpu``): ``/sys/class/drm/card*/device/`` with ``vendor`` 0x1002: ``mem_info_vram_total/used``,
#   ``mem_info_gtt_total/used``; the name from ``product_name`` when the driver has one, else the PCI id
#   table below. An **APU** (a known APU device id, or a VRAM carve-out under 4 GiB next to a larger GTT)
#   gets the GTT rule (``unified_pool``); a discrete card its VRAM.
# * Intel (``xe`` / ``i915``, vendor 0x8086): discrete Arc reports its local memory in
#   ``tile0/physical_vram_size_bytes`` (xe, drivers/gpu/drm/xe/xe_tile_sysfs.c); an iGPU shares RAM and is
#   reported as a unified pool (half of RAM: the Level Zero / Vulkan default heap on Linux).
# * NVIDIA unified memory: Jetson from ``/proc/device-tree/model`` (``tegra`` in ``compatible``), DGX Spark
#   (GB10) from NVML's answer, whose memory queries return NOT_SUPPORTED there: both count ``/proc/meminfo``
#   once, as the one pool the CPU and GPU share.
# * Windows: not here: DXGI adapter memory in gpus_windows.py (NVML still runs).

# what the OS and the desktop keep when the GPU shares RAM (the GTT rule's floor for the host)
OS_RESERVE_BYTES = 4 * GiB
APU_CARVEOUT_MAX = 4 * GiB  # a BIOS UMA carve-out is 512 MiB-4 GiB unless the user raised it
TTM_PAGE = 4096

# PCI device id → marketing name (AMD: revision matters for Navi 31). Sources: the PCI ID repository
# (pci-ids.ucw.cz) and amdgpu's amdgpu_drv.c / xe's xe_pci.c tables.
AMD_IDS: dict[int, str] = {0x744C: "AMD Radeon RX 7900 XT/XTX/GRE (Navi 31)", 0x747E: "AMD Radeon RX 7800 XT",
                           0x7480: "AMD Radeon RX 7600", 0x73BF: "AMD Radeon RX 6800/6900 XT",
                           0x1586: "AMD Radeon 8060S (Strix Halo)", 0x15BF: "AMD Radeon 780M (Phoenix)",
                           0x15C8: "AMD Radeon 740M (Phoenix2)", 0x150E: "AMD Radeon 890M (Strix Point)",
                           0x1681: "AMD Radeon 680M (Rembrandt)", 0x1114: "AMD Radeon 860M (Krackan)"}
AMD_NAVI31_REV = {0xC8: "AMD Radeon RX 7900 XTX", 0xCC: "AMD Radeon RX 7900 XT", 0xCE: "AMD Radeon RX 7900 GRE"}
AMD_APU_IDS = {0x1586, 0x15BF, 0x15C8, 0x150E, 0x1681, 0x1114, 0x164E, 0x1636, 0x1638, 0x163F, 0x13C0}
INTEL_IDS: dict[int, str] = {0xE20B: "Intel Arc B580", 0xE20C: "Intel Arc B570", 0x56A0: "Intel Arc A770",
                             0x56A1: "Intel Arc A750", 0x7D55: "Intel Arc Graphics (Meteor Lake)",
                             0x64A0: "Intel Arc 140V (Lunar Lake)"}

# GPU kind → the llama.cpp build that uses it (ggml backend, CMake flags for llama-cpp-python)
BUILDS: dict[str, tuple[tuple[str, str], ...]] = {
    "nvidia": (("CUDA", "-DGGML_CUDA=on"), ("Vulkan", "-DGGML_VULKAN=on")),
    "amd": (("HIP", "-DGGML_HIP=on -DAMDGPU_TARGETS={target}"), ("Vulkan", "-DGGML_VULKAN=on")),
    "intel": (("SYCL", "-DGGML_SYCL=on -DCMAKE_C_COMPILER=icx -DCMAKE_CXX_COMPILER=icpx"),
              ("Vulkan", "-DGGML_VULKAN=on")),
    "apple": (("Metal", "-DGGML_METAL=on"),),
}
# ggml backend library names in llama_cpp/lib (ggml's GGML_BACKEND_DL layout: libggml-<name>.so)
BACKEND_LIBS = {"CUDA": "cuda", "HIP": "hip", "Vulkan": "vulkan", "SYCL": "sycl", "Metal": "metal", "RPC": "rpc"}
AMD_TARGETS = {0x744C: "gfx1100", 0x747E: "gfx1101", 0x7480: "gfx1102", 0x1586: "gfx1151", 0x15BF: "gfx1103",
               0x15C8: "gfx1103", 0x150E: "gfx1150", 0x73BF: "gfx1030"}


def _read(p: Path) -> str | None:
    try:
        return p.read_text(errors="replace").strip()
    except OSError:
        return None


def _int(p: Path) -> int | None:
    s = _read(p)
    if s is None:
        return None
    try:
        return int(s, 0)
    except ValueError:
        return None


def meminfo(root: str | Path = "/") -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) bytes from ``<root>/proc/meminfo``, or None."""
    text = _read(Path(root) / "proc/meminfo")
    if not text:
        return None
    vals = {m.group(1): int(m.group(2)) * 1024 for m in re.finditer(r"^(\w+):\s+(\d+) kB", text, re.M)}
    if "MemTotal" not in vals:
        return None
    return vals["MemTotal"], vals.get("MemAvailable", vals["MemTotal"])


def unified_pool(gtt_total: int, gtt_used: int, ram_total: int, ram_available: int,
                 ttm_limit: int | None = None) -> tuple[int, int, str]:
    """The GTT rule: (budget, free, how) for an APU's GPU. The GPU may map GTT up to ``gtt_total`` (amdgpu
    sizes it from ``amdgpu.gttsize`` or ttm's ``pages_limit``, by default half of RAM), never more than the
    ``ttm`` limit, and never the RAM the OS needs (``OS_RESERVE_BYTES``). Free: the budget less what is
    mapped, bounded by the RAM available now."""
    budget = min(gtt_total, ttm_limit or gtt_total, max(0, ram_total - OS_RESERVE_BYTES))
    free = max(0, min(budget - gtt_used, ram_available))
    bound = "GTT" if budget == gtt_total else ("ttm pages_limit" if ttm_limit and budget == ttm_limit
                                                else "RAM less 4 GiB for the OS")
    how = (f"unified pool: GTT {gtt_total / GiB:.1f} GiB, bounded by {bound} → {budget / GiB:.1f} GiB")
    return budget, free, how


def _cards(root: Path):
    for card in sorted((root / "sys/class/drm").glob("card*")):
        if re.fullmatch(r"card\d+", card.name) and (card / "device").is_dir():
            yield int(card.name[4:]), card / "device"


def probe_amd(ram_total: int, ram_available: int, root: str | Path = "/") -> list[GpuInfo]:
    """AMD GPUs (amdgpu sysfs). APUs get the GTT pool as a unified budget (``unified_pool``)."""
    root = Path(root)
    ttm_pages = _int(root / "sys/module/ttm/parameters/pages_limit")
    ttm_limit = ttm_pages * TTM_PAGE if ttm_pages else None
    out = []
    for n, dev in _cards(root):
        if _int(dev / "vendor") != 0x1002:
            continue
        did, rev = _int(dev / "device") or 0, _int(dev / "revision")
        vram, vram_used = _int(dev / "mem_info_vram_total") or 0, _int(dev / "mem_info_vram_used") or 0
        gtt, gtt_used = _int(dev / "mem_info_gtt_total") or 0, _int(dev / "mem_info_gtt_used") or 0
        name = _read(dev / "product_name") or (AMD_NAVI31_REV.get(rev or -1) if did == 0x744C else None) \
            or AMD_IDS.get(did) or f"AMD GPU 0x{did:04x}"
        apu = did in AMD_APU_IDS or (0 < vram < APU_CARVEOUT_MAX and gtt > vram)
        target = AMD_TARGETS.get(did)
        if apu:
            budget, free, how = unified_pool(gtt, gtt_used, ram_total, ram_available, ttm_limit)
            how += f"; BIOS carve-out {vram / GiB:.1f} GiB not counted"
            out.append(GpuInfo(name=name, vendor="amd", backend="vulkan", total_bytes=gtt, free_bytes=free,
                               index=n, unified=True, working_set_bytes=budget, memory_kind="unified",
                               memory_note=how, arch=target))
        else:
            out.append(GpuInfo(name=name, vendor="amd", backend="vulkan", total_bytes=vram,
                               free_bytes=max(0, vram - vram_used), index=n, memory_kind="dedicated",
                               memory_note="VRAM (mem_info_vram_total − mem_info_vram_used)", arch=target))
    return out


def probe_intel(ram_total: int, ram_available: int, root: str | Path = "/") -> list[GpuInfo]:
    """Intel GPUs (xe / i915). Discrete Arc: local memory from ``tile0/physical_vram_size_bytes`` (xe) or
    ``lmem_total_bytes``; otherwise an iGPU sharing RAM (half of it, Level Zero's default heap)."""
    out = []
    for n, dev in _cards(Path(root)):
        if _int(dev / "vendor") != 0x8086:
            continue
        did = _int(dev / "device") or 0
        driver = _read(dev / "driver_name")  # a recorded tree names it; live sysfs has the driver link
        if driver is None and (dev / "driver").is_symlink():
            driver = Path(os.readlink(dev / "driver")).name
        name = INTEL_IDS.get(did) or f"Intel GPU 0x{did:04x}"
        lmem = _int(dev / "tile0/physical_vram_size_bytes") or _int(dev / "lmem_total_bytes")
        if lmem:
            out.append(GpuInfo(name=name, vendor="intel", backend="vulkan", total_bytes=lmem,
                               free_bytes=lmem, index=n, driver=driver, memory_kind="dedicated",
                               memory_note="local memory (tile0/physical_vram_size_bytes); used not reported"))
        else:
            budget = ram_total // 2
            out.append(GpuInfo(name=name, vendor="intel", backend="vulkan", total_bytes=budget,
                               free_bytes=min(budget, ram_available), index=n, driver=driver, unified=True,
                               working_set_bytes=budget, memory_kind="unified",
                               memory_note="shared RAM: half of it (the driver's default heap)"))
    return out


def probe_nvidia_unified(ram_total: int, ram_available: int, root: str | Path = "/",
                         nvml: list[tuple[str, int | None]] | None = None) -> list[GpuInfo]:
    """Jetson (``/proc/device-tree``) or an NVML device without memory info (DGX Spark's GB10): one unified
    pool, the RAM counted once (``/proc/meminfo`` under ``root`` when present, else the given RAM)."""
    root = Path(root)
    mi = meminfo(root)
    total, avail = mi if mi else (ram_total, ram_available)
    budget = max(0, total - OS_RESERVE_BYTES)
    model = (_read(root / "proc/device-tree/model") or "").strip("\x00 ")
    compat = _read(root / "proc/device-tree/compatible") or ""
    out = []
    if "tegra" in compat and "nvidia" in model.lower():
        name = model.replace(" Developer Kit", "")
        out.append(GpuInfo(name=name, vendor="nvidia", backend="cuda", total_bytes=total, free_bytes=avail,
                           unified=True, working_set_bytes=budget, memory_kind="unified",
                           memory_note="unified: /proc/meminfo (device tree: tegra), RAM less 4 GiB for the OS"))
    for i, (name, mem) in enumerate(nvml or []):
        if mem is None:  # NVML_ERROR_NOT_SUPPORTED: a coherent unified-memory device (GB10)
            out.append(GpuInfo(name=name, vendor="nvidia", backend="cuda", total_bytes=total, free_bytes=avail,
                               index=i, unified=True, working_set_bytes=budget, memory_kind="unified",
                               memory_note="unified: NVML has no memory info; /proc/meminfo, RAM less 4 GiB"))
    return out


def probe_linux_gpus(ram_total: int, ram_available: int, root: str | Path = "/") -> list[GpuInfo]:
    """AMD, Intel and Jetson GPUs under ``root`` (sysfs/procfs). [] off Linux or with none."""
    if not (Path(root) / "sys/class/drm").is_dir() and not (Path(root) / "proc/device-tree").is_dir():
        return []
    return (probe_amd(ram_total, ram_available, root) + probe_intel(ram_total, ram_available, root)
            + probe_nvidia_unified(ram_total, ram_available, root))


def installed_backends(lib_dir: str | Path | None = None) -> set[str]:
    """The ggml backends the installed llama-cpp-python ships, by library file (libggml-cuda …): {"CPU",
    "CUDA", "HIP", "Vulkan", "SYCL", "Metal", "RPC"} ∩ what is there. A static build that links them into
    libllama is read by exported symbol (``ggml_backend_<name>_reg``). Never loads a model."""
    import ctypes

    from localrun.machine.rpc import llama_cpp_lib_dir

    d = Path(lib_dir) if lib_dir is not None else llama_cpp_lib_dir()
    if d is None or not d.is_dir():
        return set()
    found = {"CPU"}
    libs = [p for p in d.iterdir() if p.suffix in (".so", ".dylib", ".dll")]
    for label, key in BACKEND_LIBS.items():
        if any(f"ggml-{key}" in p.name for p in libs):
            found.add(label)
    if len(found) == 1:  # no per-backend files: look for the registration functions in the core libraries
        for p in libs:
            if not p.name.startswith(("libggml", "libllama")):
                continue
            try:
                lib = ctypes.CDLL(str(p))
            except OSError:
                continue
            for label, key in BACKEND_LIBS.items():
                if hasattr(lib, f"ggml_backend_{key}_reg"):
                    found.add(label)
    return found


def llamacpp_devices(lib_dir: str | Path | None = None) -> list[dict]:
    """The devices the installed llama.cpp's ggml backends see, with their free/total memory: the ground truth
    when present (``ggml_backend_dev_count/get/name/description/memory``, ggml/include/ggml-backend.h). Loads
    libggml (≈ 15 ms for a CPU build; a CUDA build initialises its driver), so only `localrun hw` calls it.
    [] when llama-cpp-python is missing or the library cannot be read; never raises."""
    import ctypes

    from localrun.machine.rpc import llama_cpp_lib_dir

    d = Path(lib_dir) if lib_dir is not None else llama_cpp_lib_dir()
    if d is None:
        return []
    lib = next((p for p in (d / "libggml.so", d / "libggml.dylib", d / "ggml.dll") if p.exists()), None)
    if lib is None:
        return []
    try:
        for dep in ("libggml-base.so", "libggml-base.dylib"):
            if (d / dep).exists():
                ctypes.CDLL(str(d / dep), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
        g = ctypes.CDLL(str(lib), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
        g.ggml_backend_dev_count.restype = ctypes.c_size_t
        g.ggml_backend_dev_get.restype, g.ggml_backend_dev_get.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        for f in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(g, f).restype, getattr(g, f).argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        size_p = ctypes.POINTER(ctypes.c_size_t)
        g.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
        out = []
        for i in range(g.ggml_backend_dev_count()):
            dev = g.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            out.append({"name": _s(g.ggml_backend_dev_name(dev) or b""),
                        "description": _s(g.ggml_backend_dev_description(dev) or b""),
                        "free_bytes": int(free.value), "total_bytes": int(total.value)})
        return out
    except (OSError, AttributeError):
        return []


def build_advice(gpu: GpuInfo, installed: set[str]) -> str:
    """Which llama.cpp build would use ``gpu``, against the installed one: "uses CUDA (installed)", or the
    reinstall line with the CMake flags."""
    builds = BUILDS.get(gpu.vendor, ())
    if gpu.backend == "rpc" or not builds:
        return ""
    have = [b for b, _ in builds if b in installed]
    if have:
        return f"the installed llama.cpp uses it ({have[0]})"
    wanted = " or ".join(b for b, _ in builds)
    flags = builds[-1][1] if gpu.vendor in ("amd", "intel") else builds[0][1]  # Vulkan: no SDK to install
    flags = flags.replace("{target}", gpu.arch or "gfx1100")
    also = ""
    if gpu.vendor == "amd":
        also = f" (or HIP: -DGGML_HIP=on -DAMDGPU_TARGETS={gpu.arch or '<gfx target>'}, with ROCm)"
    return (f"the installed llama.cpp has no {wanted} backend: reinstall with "
            f'CMAKE_ARGS="{flags} -DGGML_RPC=on" pip install --no-cache-dir --force-reinstall llama-cpp-python'
            + also)


