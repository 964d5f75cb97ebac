"""Measured speeds of this machine, stored in ``<LOCALRUN_HOME>/measurements.json`` and reused by the
planner. Written by `localrun hw --measure` and `localrun bench --calibrate`.

Schema (version 1)::

    {"version": 1,
     "entries": {"<backend>/<device>": {            # e.g. "llamacpp/cpu", "llamacpp/cuda:0", "mlx/cpu"
         "decode_bandwidth_gbps": 38.2,              # effective bytes read per decoded token / time, GB/s
         "prefill_gflops": 410.0,                    # effective 2·params·tokens / prefill time, GFLOP/s
         "source": "bench --calibrate",              # or "hw --measure"
         "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
         "load": {"steal_frac": 0.0, "others_cpu_frac": 0.03},  # what else ran meanwhile (hw --measure)
         "when": "2026-11-29T09:40:00Z"}}}

``planner_measurement`` is the one speed source every command plans with (fit, chat, serve, bench, pull,
show): the stored entry, unless it was taken on a busy machine. ``LoadMeter`` measures how busy the
machine was during a measurement; ``forget_measurements`` deletes entries (`localrun hw --forget`).

Writes are atomic (temp file + rename), so an interrupted run never leaves a half-written file.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path


def _file() -> Path:
    from localrun.config import get_settings

    return get_settings().measurements_file


def load_measurements() -> dict:
    """All entries; {} when nothing was measured or the file is unreadable."""
    f = _file()
    try:
        data = json.loads(f.read_text())
        return data.get("entries", {}) if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def get_measurement(backend: str, device: str = "cpu") -> dict | None:
    return load_measurements().get(f"{backend}/{device}")


def planner_measurement(backend: str = "llamacpp", device: str = "cpu") -> dict | None:
    """The measured speeds the planner should use for THIS machine (None: use the spec tables).

    Entries flagged as taken under load (``under_load``) are skipped. Pass the result to
    ``plan_for_run``/``choose`` as ``measurement=``; never use it for a described machine (a preset)."""
    m = get_measurement(backend, device)
    if not m or m.get("under_load"):
        return None
    return m


def forget_measurements(key: str | None = None) -> list[str]:
    """Delete one entry (``"llamacpp/cpu"``) or all of them; returns the keys removed."""
    entries = load_measurements()
    gone = [k for k in entries if key is None or k == key]
    for k in gone:
        del entries[k]
    if gone:
        _write(entries)
    return gone


# Busy-machine thresholds for a measurement: other processes' CPU time as a share of all cores, and the
# hypervisor's steal as a share of all CPU time. Either makes a speed measurement several times too slow.
OTHERS_CPU_MAX = 0.25
STEAL_MAX = 0.10


class LoadMeter:
    """How busy the machine is while a measurement runs (psutil; steal from /proc/stat on Linux).

    ``with LoadMeter() as m: ...`` then ``m.result()`` → ``{"steal_frac", "others_cpu_frac", "busy"}``:
    ``steal_frac`` = Δsteal / Δ(all CPU time); ``others_cpu_frac`` = (Δ busy CPU time of the whole
    machine − Δ CPU time of this process and its threads) / (wall time × logical cores)."""

    def __enter__(self):
        import time

        import psutil

        self._proc = psutil.Process()
        self._t0, self._sys0, self._own0 = time.monotonic(), psutil.cpu_times(), self._own()
        return self

    def _own(self) -> float:
        t = self._proc.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def __exit__(self, *exc):
        import time

        import psutil

        self._t1, self._sys1, self._own1 = time.monotonic(), psutil.cpu_times(), self._own()
        self._ncpu = psutil.cpu_count(logical=True) or 1
        return False

    def result(self) -> dict:
        return load_fractions(self._sys0, self._sys1, self._own1 - self._own0, self._t1 - self._t0, self._ncpu)


def load_fractions(before, after, own_cpu_s: float, wall_s: float, n_cpu: int) -> dict:
    """``LoadMeter``'s arithmetic on two ``psutil.cpu_times()`` samples (fields user, system, idle, iowait,
    steal, … in seconds); pure, so tests give it a busy machine."""
    d = {f: getattr(after, f, 0.0) - getattr(before, f, 0.0) for f in after._fields}
    total = sum(v for k, v in d.items() if k not in ("guest", "guest_nice")) or 1e-9
    steal = d.get("steal", 0.0) / total
    busy = total - d.get("idle", 0.0) - d.get("iowait", 0.0) - d.get("steal", 0.0)
    others = max(0.0, busy - own_cpu_s) / max(1e-9, wall_s * n_cpu)
    return {"steal_frac": round(steal, 3), "others_cpu_frac": round(min(1.0, others), 3),
            "busy": steal > STEAL_MAX or others > OTHERS_CPU_MAX}


def save_measurement(backend: str, device: str = "cpu", **values) -> dict:
    """Merge ``values`` (decode_bandwidth_gbps, prefill_gflops, source, model, …) into one entry."""
    entries = load_measurements()
    key = f"{backend}/{device}"
    entry = dict(entries.get(key, {}))
    entry.pop("under_load", None)  # a flag describes one measurement, never the next one
    entry.pop("load", None)
    entry.update({k: v for k, v in values.items() if v is not None})
    entry["when"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    entries[key] = entry
    _write(entries)
    return entry


def _write(entries: dict) -> None:
    f = _file()
    f.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=f.parent, prefix=".measurements.", suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        json.dump({"version": 1, "entries": entries}, out, indent=2)
    os.replace(tmp, f)
