"""Turn measured speeds into this machine's effective bandwidth and compute (``--calibrate``).

The planner predicts (docs/fit.md, ``localrun/offload/``)::

    decode s/token  = bytes read per decoded token / effective bandwidth
    prefill s/token = 2 × active params / effective compute

so bench inverts the same two formulas on what it measured at concurrency 1 and stores the result with
``save_measurement(backend, device, decode_bandwidth_gbps=…, prefill_gflops=…, source="bench --calibrate")``
(schema in ``localrun/machine/measurements.py``). "Effective" means everything per token is folded in (kernel
efficiency, sampling, Python), so a later prediction for a similar model lands close to what runs.

Bytes read per decoded token and active parameters are the planner's own functions
(``localrun.offload.speed.weights_read_per_token`` and ``kv_read_per_token``): one definition, so the
stored bandwidth reproduces the measured speed when ``fit`` plans the same model and context again, and
`localrun hw --measure` (which calls ``calibration_values`` too) stores the same quantity under the same key.
"""

from __future__ import annotations


def decode_bytes_per_token(spec, plan) -> float:
    """Bytes one decoded token reads on a CPU-only plan: weights + half of one sequence's KV cache."""
    from localrun.offload.speed import kv_read_per_token, weights_read_per_token

    rd = weights_read_per_token(spec)
    return rd["cpu"] + kv_read_per_token(plan.kv_cache_bytes, plan.n_parallel)


def active_params(spec) -> float:
    """Parameters one prompt token multiplies (the planner's prefill count: every matmul but the output
    layer, ``offload.speed.prefill_params``)."""
    from localrun.offload.speed import prefill_params, weights_read_per_token

    return prefill_params(weights_read_per_token(spec), "cpu")


def calibration_values(spec, plan, *, decode_tok_s: float | None, prefill_tok_s: float | None) -> dict:
    """{'decode_bandwidth_gbps', 'prefill_gflops', 'bytes_per_token', 'active_params', 'n_ctx'} from measured rates.

    bandwidth GB/s = bytes per decoded token × decode tok/s / 1e9; compute GFLOP/s = 2 × params ×
    prefill tok/s / 1e9.
    """
    bpt = decode_bytes_per_token(spec, plan)
    params = active_params(spec)
    return {
        "decode_bandwidth_gbps": bpt * decode_tok_s / 1e9 if decode_tok_s else None,
        "prefill_gflops": 2.0 * params * prefill_tok_s / 1e9 if prefill_tok_s else None,
        "bytes_per_token": bpt,
        "active_params": params,
        "n_ctx": plan.n_ctx,
    }


def device_of(plan, hardware=None) -> str:
    """The measurements.json device key of a plan: 'cpu', or e.g. 'cuda:0' / 'metal:0' with layers on a GPU."""
    if getattr(plan, "n_gpu_layers", 0) and hardware is not None and hardware.gpus:
        i = getattr(plan, "main_gpu", 0)
        gpu = hardware.gpus[i] if i < len(hardware.gpus) else hardware.gpus[0]
        return f"{gpu.backend}:{i}"
    return "cpu"


def save_calibration(plan, values: dict, model_name: str, hardware=None) -> dict:
    """Store ``values`` for ``plan.backend``/``device_of(plan)``; returns the stored entry."""
    from localrun.machine.measurements import save_measurement

    return save_measurement(plan.backend, device_of(plan, hardware),
                            decode_bandwidth_gbps=values["decode_bandwidth_gbps"],
                            prefill_gflops=values["prefill_gflops"], source="bench --calibrate",
                            model=model_name)
