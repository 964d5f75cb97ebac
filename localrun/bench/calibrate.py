"""Turn measured speeds into this machine's effective bandwidth and compute (``--calibrate``).

The planner predicts (issue 3, ``localrun/offload/``)::

    decode s/token  = bytes read per decoded token / effective bandwidth
    prefill s/token = 2 × active params / effective compute

so bench inverts the same two formulas on what it measured at concurrency 1 and stores the result with
``save_measurement(backend, device, decode_bandwidth_gbps=…, prefill_gflops=…, source="bench --calibrate")``
(schema in ``localrun/measurements.py``). "Effective" means everything per token is folded in (kernel
efficiency, sampling, Python), so a later prediction for a similar model lands close to what runs.

Bytes read per decoded token, counted as the planner counts them (``offload/plan.py: evaluate``, after
llama.cpp ``src/llama-graph.cpp``): every weight matrix once (expert tensors × n_expert_used/n_expert),
of the token-embedding table only one row (``ggml_get_rows``) unless the output layer is tied to it (no
``output.weight``: SmolLM2, Gemma), then it is read whole as the output matmul; plus the KV cache read
by attention, which the planner takes as half of one sequence's cache (``kv_cache_bytes × 0.5 /
n_parallel``: the context half full on average). Using the planner's own count is what makes the stored
bandwidth reproduce the measured speed when ``fit`` plans the same model and context again.
"""

from __future__ import annotations


def _expert_frac(spec, name: str) -> float:
    return spec.n_expert_used / spec.n_expert if spec.n_expert and "_exps" in name else 1.0


def weight_bytes_per_token(spec) -> float:
    """Weight bytes one decoded token reads (see module docstring)."""
    tied = spec.tensor("output.weight") is None
    total = 0.0
    for t in spec.tensors:
        if t.name == "token_embd.weight" and not tied:
            rows = t.shape[-1] if len(t.shape) > 1 else 1
            total += t.n_bytes / max(1, rows)
        else:
            total += t.n_bytes * _expert_frac(spec, t.name)
    return total


def active_params(spec) -> float:
    """Parameters in the matmuls of one token (the embedding lookup excluded unless tied to the output)."""
    tied = spec.tensor("output.weight") is None
    return sum(t.n_elements * _expert_frac(spec, t.name) for t in spec.tensors
               if t.name != "token_embd.weight" or tied)


def kv_bytes_read_per_token(plan) -> float:
    """KV bytes attention reads per decoded token, as the planner models it: half of one sequence's cache."""
    return plan.kv_cache_bytes * 0.5 / max(1, plan.n_parallel)


def decode_bytes_per_token(spec, plan) -> float:
    return weight_bytes_per_token(spec) + kv_bytes_read_per_token(plan)


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
    from localrun.measurements import save_measurement

    return save_measurement(plan.backend, device_of(plan, hardware),
                            decode_bandwidth_gbps=values["decode_bandwidth_gbps"],
                            prefill_gflops=values["prefill_gflops"], source="bench --calibrate",
                            model=model_name)
