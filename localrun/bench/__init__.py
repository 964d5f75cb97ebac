"""`localrun bench`: serving metrics (TTFT, ITL, TPOT, throughput, P50/P95/P99, goodput) in-process or
against any OpenAI-compatible server, the planner's prediction against what was measured, and
``--calibrate``. Modules: workload (what is sent), clients (how), metrics (the numbers), monitor
(memory, energy), calibrate (measured speeds → measurements.json), runner (one run), report (display).
"""

from localrun.bench.runner import SCHEMA, BenchOptions, run_bench
from localrun.bench.workload import SCENARIOS, Workload, scenario

__all__ = ["SCHEMA", "SCENARIOS", "BenchOptions", "Workload", "run_bench", "scenario"]
