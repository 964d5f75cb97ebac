"""Measured speeds of this machine, stored in ``<LOCALRUN_HOME>/measurements.json`` and reused by the
planner. Written by `localrun hw --measure` and `localrun bench --calibrate`.

Schema (version 1)::

    {"version": 1,
     "entries": {"<backend>/<device>": {            # e.g. "llamacpp/cpu", "llamacpp/cuda:0", "mlx/cpu"
         "decode_bandwidth_gbps": 38.2,              # effective bytes read per decoded token / time, GB/s
         "prefill_gflops": 410.0,                    # effective 2·params·tokens / prefill time, GFLOP/s
         "source": "bench --calibrate",              # or "hw --measure"
         "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
         "when": "2026-11-29T09:40:00Z"}}}

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


def save_measurement(backend: str, device: str = "cpu", **values) -> dict:
    """Merge ``values`` (decode_bandwidth_gbps, prefill_gflops, source, model, …) into one entry."""
    entries = load_measurements()
    key = f"{backend}/{device}"
    entry = dict(entries.get(key, {}))
    entry.update({k: v for k, v in values.items() if v is not None})
    entry["when"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    entries[key] = entry
    f = _file()
    f.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=f.parent, prefix=".measurements.", suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        json.dump({"version": 1, "entries": entries}, out, indent=2)
    os.replace(tmp, f)
    return entry
