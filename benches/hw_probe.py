"""What `localrun hw` and every plan pay to look at the machine: the GPU probes (NVIDIA through NVML, AMD and
Intel through sysfs, unified-memory NVIDIA through /proc/device-tree) and the installed llama.cpp backends,
each timed alone and all together (``probe_hardware``), median and max of ``--repeat`` runs in this process
after one warm-up. The goal on a machine without a GPU: the whole probe well under 50 ms.

The peer is `nvidia-smi -L` where it exists (the usual way to ask the same question), timed the same way.

    python benches/hw_probe.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn, repeat: int) -> tuple[float, float]:
    """(median, max) seconds of ``fn()`` over ``repeat`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)

    from localrun.machine import hardware as H

    total, avail = H.probe_memory()
    cases = {
        "NVML (probe_nvidia)": H.probe_nvidia,
        "AMD/Intel sysfs (probe_linux_gpus)": lambda: H.probe_linux_gpus(total, avail),
        "NVIDIA unified (probe_nvidia_unified)": lambda: H.probe_nvidia_unified(total, avail),
        "llama.cpp backends (installed_backends)": H.installed_backends,
        "everything (probe_hardware)": H.probe_hardware,
    }
    if shutil.which("nvidia-smi"):
        cases["peer: nvidia-smi -L"] = lambda: subprocess.run(["nvidia-smi", "-L"], capture_output=True)
    print(f"hw_probe: {args.repeat} runs each, after one warm-up")
    for name, fn in cases.items():
        med, worst = timed(fn, args.repeat)
        print(f"  {name:42s} median {med * 1000:8.2f} ms   max {worst * 1000:8.2f} ms")
    med, _ = timed(H.probe_hardware, args.repeat)
    print(f"goal: probe_hardware well under 50 ms: {med * 1000:.1f} ms ({'met' if med < 0.05 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
