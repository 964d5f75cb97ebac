"""Peak memory and energy while a bench level runs.

``Monitor`` samples in a background thread (every ``interval_s``): the RSS of the process running the
model (this one in-process; the server's when its PID is known) with psutil, and the GPU memory used on
NVIDIA devices through NVML. Energy, best source first:

1. ``nvml`` — ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load, Volta and newer), summed
   over GPUs, plus the CPU's share below;
2. ``rapl`` — Linux ``/sys/class/powercap/intel-rapl:N/energy_uj`` package counters (µJ, wrapping at
   ``max_energy_range_uj``);
3. ``tdp-estimate`` — no meter: TDP of the device (``TDP_W`` table by model name, else 10 W per physical
   core) × the CPU utilisation measured over the level. An estimate, and labelled so.

Cost per 1M output tokens = kWh per 1M tokens × ``price_kwh`` (the user's price; none assumed).
"""

from __future__ import annotations

import glob
import os
import threading
import time

# Package TDP in watts by a substring of the CPU or GPU model name (vendor spec sheets). First match wins.
TDP_W: list[tuple[str, float]] = [
    ("H200", 700), ("H100", 700), ("A100", 400), ("L40S", 350), ("L4", 72), ("A10G", 150),
    ("RTX 4090", 450), ("RTX 4080", 320), ("RTX 4070", 200), ("RTX 4060", 115), ("RTX 3090", 350),
    ("RTX 3080", 320), ("RTX 3070", 220), ("RTX 3060", 170), ("T4", 70),
    ("M1 Max", 60), ("M1 Pro", 30), ("M1", 20), ("M2 Max", 60), ("M2 Pro", 30), ("M2", 22),
    ("M3 Max", 78), ("M3 Pro", 35), ("M3", 22), ("M4 Max", 80), ("M4 Pro", 40), ("M4", 22),
    ("Ryzen 9 7950X", 170), ("Ryzen 9 5950X", 105), ("Ryzen 7", 105), ("Ryzen 5", 65),
    ("i9-14900K", 125), ("i9-13900K", 125), ("i7-", 65), ("i5-", 65), ("EPYC", 200), ("Xeon", 150),
]
WATTS_PER_CORE = 10.0


def tdp_watts(model: str, physical_cores: int) -> tuple[float, str]:
    """(watts, how) for a device model name: the ``TDP_W`` entry, else 10 W per physical core."""
    for key, w in TDP_W:
        if key.lower() in model.lower():
            if key == "Xeon":  # server parts span 65–350 W; scale by the cores this machine has
                w = min(350.0, max(65.0, WATTS_PER_CORE * physical_cores))
            return float(w), f"TDP of {key}"
    return WATTS_PER_CORE * max(1, physical_cores), f"{WATTS_PER_CORE:.0f} W per core"


def _rapl_domains() -> list[str]:
    return sorted(d for d in glob.glob("/sys/class/powercap/intel-rapl:*") if d.count(":") == 1)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


class _Nvml:
    def __init__(self) -> None:
        self.handles = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:
            self.nv = None

    def energy_mj(self) -> float | None:
        if not self.handles:
            return None
        try:
            return float(sum(self.nv.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles))
        except Exception:
            return None

    def used_bytes(self, pids: set[int]) -> int | None:
        """GPU memory of ``pids`` (all processes' when none of them is listed) on every GPU."""
        if not self.handles:
            return None
        total_pid, total_dev = 0, 0
        for h in self.handles:
            try:
                total_dev += int(self.nv.nvmlDeviceGetMemoryInfo(h).used)
                for p in self.nv.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.pid in pids and p.usedGpuMemory:
                        total_pid += int(p.usedGpuMemory)
            except Exception:
                pass
        return total_pid or total_dev

    def names(self) -> list[str]:
        out = []
        for h in self.handles:
            try:
                n = self.nv.nvmlDeviceGetName(h)
                out.append(n.decode() if isinstance(n, bytes) else str(n))
            except Exception:
                pass
        return out

    def close(self) -> None:
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:
                pass


class Monitor:
    """Context manager sampling peak RSS/VRAM and metering energy over a block.

    ``pid``: the process whose RSS counts (default: this one). After exit, ``result()`` gives
    {'peak_rss_bytes', 'peak_vram_bytes', 'energy_j', 'energy_source', 'energy_note'}.
    """

    def __init__(self, pid: int | None = None, interval_s: float = 0.05) -> None:
        import psutil

        self.pid = pid or os.getpid()
        try:
            self.proc = psutil.Process(self.pid)
        except psutil.Error:
            self.proc = None
        self.interval_s = interval_s
        self.peak_rss = 0
        self.peak_vram: int | None = None
        self._stop = threading.Event()
        self._nvml = _Nvml()

    def _sample(self) -> None:
        if self.proc is not None:
            try:
                self.peak_rss = max(self.peak_rss, int(self.proc.memory_info().rss))
            except Exception:
                pass
        v = self._nvml.used_bytes({self.pid})
        if v is not None:
            self.peak_vram = max(self.peak_vram or 0, v)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> "Monitor":
        import psutil

        self._sample()
        self._t0 = time.perf_counter()
        self._cpu0 = psutil.cpu_times()
        self._gpu_mj0 = self._nvml.energy_mj()
        self._rapl0 = {d: _read_int(d + "/energy_uj") for d in _rapl_domains()}
        self._thread = threading.Thread(target=self._loop, name="bench-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        import psutil

        self._stop.set()
        self._thread.join()
        self._sample()
        self.wall_s = time.perf_counter() - self._t0
        cpu1 = psutil.cpu_times()
        busy = lambda t: sum(t) - t.idle - getattr(t, "iowait", 0.0)  # noqa: E731
        total = sum(cpu1) - sum(self._cpu0)
        self.cpu_util = max(0.0, min(1.0, (busy(cpu1) - busy(self._cpu0)) / total)) if total > 0 else 0.0
        self._gpu_mj1 = self._nvml.energy_mj()
        self._rapl1 = {d: _read_int(d + "/energy_uj") for d in self._rapl0}
        self._gpu_names = self._nvml.names()
        self._nvml.close()

    def _rapl_j(self) -> float | None:
        total, seen = 0.0, False
        for d, e0 in self._rapl0.items():
            e1 = self._rapl1.get(d)
            if e0 is None or e1 is None:
                continue
            if e1 < e0:
                e1 += _read_int(d + "/max_energy_range_uj") or 0
            total += (e1 - e0) / 1e6
            seen = True
        return total if seen else None

    def _cpu_estimate_j(self) -> tuple[float, str]:
        from localrun.machine.hardware import probe_cpu

        cpu = probe_cpu()
        watts, how = tdp_watts(cpu.model, cpu.physical_cores)
        return watts * self.cpu_util * self.wall_s, (f"estimate: {how} ({watts:.0f} W) × CPU busy "
                                                      f"{self.cpu_util:.0%} × {self.wall_s:.1f} s")

    def result(self) -> dict:
        have_gpu = self._gpu_mj0 is not None and self._gpu_mj1 is not None
        gpu_j = (self._gpu_mj1 - self._gpu_mj0) / 1e3 if have_gpu else None
        rapl_j = self._rapl_j()
        if rapl_j is not None:
            cpu_j, cpu_src, note = rapl_j, "rapl", "RAPL package counters"
        else:
            cpu_j, note = self._cpu_estimate_j()
            cpu_src = "tdp-estimate"
        if gpu_j is not None:
            src = "nvml" if cpu_src == "rapl" else "nvml+tdp-estimate"
            energy, note = gpu_j + cpu_j, f"NVML energy of {', '.join(self._gpu_names)}; CPU: {note}"
        else:
            src, energy = cpu_src, cpu_j
        return {
            "peak_rss_bytes": self.peak_rss or None,
            "peak_vram_bytes": self.peak_vram,
            "energy_j": energy,
            "energy_source": src,
            "energy_note": note,
            "cpu_utilization": self.cpu_util,
        }


def energy_summary(energy_j: float | None, output_tokens: int, price_kwh: float | None, source: str, note: str) -> dict:
    """Energy and cost per 1M output tokens. kWh = J / 3.6e6."""
    per_tok = energy_j / output_tokens if energy_j is not None and output_tokens else None
    kwh_per_m = per_tok * 1e6 / 3.6e6 if per_tok is not None else None
    return {
        "joules": energy_j,
        "source": source,
        "note": note,
        "j_per_output_token": per_tok,
        "kwh_per_1m_output_tokens": kwh_per_m,
        "price_kwh": price_kwh,
        "cost_per_1m_output_tokens": kwh_per_m * price_kwh if kwh_per_m is not None and price_kwh is not None else None,
    }


def server_pid(url: str) -> int | None:
    """PID of the process listening on ``url``'s port when it is on this machine (loopback), else None."""
    from urllib.parse import urlparse

    import psutil

    u = urlparse(url if "://" in url else "http://" + url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return None
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
    except (psutil.Error, OSError):
        pass
    return None
