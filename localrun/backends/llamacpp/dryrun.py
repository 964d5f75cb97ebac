"""llama.cpp's own dry run of a plan: the compute buffer each device reserves, without loading weights.

``llama_model_params.no_alloc`` ("only load metadata and simulate memory allocations", include/llama.h)
makes llama.cpp read the GGUF header, place every tensor on its device and reserve the prefill and decode
graphs with zero-byte dummy buffers (src/llama-context.cpp ``graph_reserve`` with ``no_alloc``), then log
the compute buffer each backend would allocate. llama-server's ``--fit`` measures the same way
(common/fit.cpp ``common_get_device_memory_data``). The compute buffer is what ggml-alloc's graph
allocator makes of the whole graph (tensor lifetimes, in-place ops, the split between devices), which a
formula does not reproduce; weights and KV the planner computes exactly (``offload/devices.py``).

Cost: the header read and two graph reservations (≈ 0.1–0.5 s); with RPC workers a few small round trips
(alignment, maximum size) and no tensor data.
"""

from __future__ import annotations

import re

from localrun.backends.llamacpp.lib import LlamaLog, import_llama, last_errors
from localrun.backends.llamacpp.params import LOAD_NONE, context_params, load_model, model_params, new_context
from localrun.errors import BackendError

# src/llama-context.cpp: "%10s compute buffer size = %8.2f MiB" (the buffer type's name)
_COMPUTE = re.compile(r"(\S+)\s+compute buffer size\s*=\s*([\d.]+) MiB")
MIB = 1024 * 1024


def compute_buffers(lines: list[str]) -> dict[str, int]:
    """llama.cpp's log lines → {buffer type name: compute buffer bytes} ("CPU", "CUDA0",
    "RPC0[host:port]", …). The log rounds to 0.01 MiB (10 KiB)."""
    out: dict[str, int] = {}
    for ln in lines:
        m = _COMPUTE.search(ln)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + round(float(m.group(2)) * MIB)
    return out


def measure_compute(model_path: str, plan, spec=None) -> dict[str, int]:
    """The compute buffer bytes llama.cpp would reserve per buffer type for ``plan`` on ``model_path``,
    from its dry run (see the module doc), with the engine's own parameters (``llamacpp.params``).

    Returns {buffer type name: bytes}. Raises BackendUnavailableError (no llama_cpp), BackendError when
    llama.cpp cannot read the file or create the context."""
    from localrun.model.gguf_info import read_gguf

    _, C = import_llama()
    C.llama_backend_init()
    spec = spec or read_gguf(model_path)
    mark = LlamaLog.mark()
    mparams = model_params(C, plan, spec)
    mp = mparams.params
    mp.no_alloc = True
    mp.load_mode = LOAD_NONE  # as common/fit.cpp: nothing mapped
    model = load_model(C, model_path, mparams)
    if not model:
        raise BackendError(f"llama.cpp could not read {model_path}: " + last_errors(LlamaLog.since(mark)))
    try:
        ctx = new_context(C, model, context_params(C, plan))
        if not ctx:
            raise BackendError("llama.cpp could not plan the context: " + last_errors(LlamaLog.since(mark)),
                               hint="lower --ctx or use --kv-type q8_0")
        C.llama_free(ctx)
    finally:
        C.llama_model_free(model)
        del mparams  # the arrays the struct pointed into live until here
    return compute_buffers(LlamaLog.since(mark))


def apply_measured_compute(plan, measured: dict[str, int]) -> bool:
    """Put llama.cpp's measured compute buffers into ``plan.devices`` (and ``plan.vram_bytes``): an RPC
    device by its endpoint (``RPC<n>[host:port]``), local GPUs in llama.cpp's order among the other
    non-host buffer types. Returns whether every used device got a measurement; marks each
    measured device ``compute_source = "llama.cpp dry run"``."""
    remote = {name: b for name, b in measured.items() if name.startswith("RPC")}
    local = [b for name, b in measured.items() if not name.startswith("RPC") and not _is_host(name)]
    all_found = True
    for d in plan.devices:
        if d.get("endpoint"):
            got = next((b for name, b in remote.items() if f"[{d['endpoint']}]" in name), None)
        else:
            got = local.pop(0) if local else None
        if got is None:
            all_found = all_found and not (d["n_layers"] or d["output"])
            continue
        delta = got - d["compute_bytes"]
        d["compute_bytes"] = got
        d["total_bytes"] += delta
        d["fits"] = d["total_bytes"] <= d["budget_bytes"]
        d["compute_source"] = "llama.cpp dry run"
        plan.vram_bytes += delta
    if plan.devices:
        plan.fits = plan.fits and all(d["fits"] for d in plan.devices)
    return all_found


def _is_host(name: str) -> bool:
    return name == "CPU" or name.endswith("_Host") or name.startswith("CPU_")
