"""Speed model: decode and prefill throughput from bytes per tier, bandwidths and compute.

decode s/token = Σ_tiers (bytes read per token on the tier / effective bandwidth of the tier)
                 + the CPU's fixed costs (``cpu_decode_overhead_s``: per layer, and a compute floor for
                 8- and 16-bit weights), when the CPU tier comes from the table
    bytes read per token = the weights active per token (all dense weights; only n_expert_used/n_expert of
    the expert tensors) + the KV cache read for the context in use;
prefill tok/s = effective FLOP/s / (2 × active params) (the standard 2·N FLOPs per token, Kaplan et al.
    2020), the slowest tier weighted by its share of the parameters; the output layer is not counted (a
    prompt's logits are computed for its last token only). TTFT = prompt tokens / prefill tok/s.

Bandwidths are GB/s (10^9 B/s) peak figures from vendor specs; ``EFFICIENCY`` turns peak into what
llama.cpp reaches (≈ 0.7 GPU, 0.55 CPU DRAM). The CPU's per-core figures (``CPU_GBPS_PER_CORE``,
``CPU_GFLOPS_PER_CORE``, ``CPU_LAYER_CORE_S``, ``CPU_WIDE_GWEIGHTS_PER_CORE``) are rates llama.cpp reaches,
measured by ``benches/fit_speed.py`` (random-weight Llama 1B/3B/8B quantized by llama.cpp, 2-core Xeon with
AVX-512, 2026-12-02; docs/benchmarks.md "fit's speeds"). A ``localrun hw --measure`` / ``bench --calibrate``
entry in measurements.json (``llamacpp/cpu`` …) replaces the table value, and the plan says so; a measured
tier's effective bandwidth already folds the fixed costs in.
"""

from __future__ import annotations

from dataclasses import dataclass

# name substring (lowercase) → (memory bandwidth GB/s, dense FP16 TFLOP/s). Longest match wins.
GPU_TABLE: dict[str, tuple[float, float]] = {
    "rtx 5090": (1792, 210), "rtx 5080": (960, 113), "rtx 4090": (1008, 165), "rtx 4080": (717, 97),
    "rtx 4070 ti": (504, 80), "rtx 4070": (504, 58), "rtx 4060 ti": (288, 44), "rtx 4060": (272, 30),
    "rtx 3090": (936, 71), "rtx 3080": (760, 59), "rtx 3070": (448, 40), "rtx 3060": (360, 25),
    "rtx 2080": (448, 40), "gtx 1080": (320, 9), "a100": (1935, 312), "h100": (3350, 990), "h200": (4800, 990),
    "l4": (300, 121), "t4": (320, 65), "a10": (600, 125), "l40": (864, 181), "rx 7900 xtx": (960, 123),
    "apple m1": (68, 2.6), "apple m1 pro": (200, 5.2), "apple m1 max": (400, 10.4), "apple m1 ultra": (800, 21),
    "apple m2": (100, 3.6), "apple m2 pro": (200, 6.8), "apple m2 max": (400, 13.6), "apple m2 ultra": (800, 27),
    "apple m3": (100, 4.1), "apple m3 pro": (150, 7.4), "apple m3 max": (400, 16.4), "apple m3 ultra": (819, 28),
    "tesla p40": (347, 12), "tesla p100": (732, 19), "v100": (900, 112),
    "apple m4": (120, 4.3), "apple m4 pro": (273, 9.2), "apple m4 max": (546, 18.4),
    # AMD (amd.com product specs: memory bandwidth, peak FP16): RX 7800 XT 624 GB/s; Strix Halo's Radeon 8060S
    # on 256-bit LPDDR5X-8000 ≈ 256 GB/s; the 780M on dual-channel DDR5-5600 89.6 GB/s
    "rx 7900 xt": (800, 103), "rx 7800 xt": (624, 74), "rx 7600": (288, 43),
    "radeon 8060s": (256, 59), "radeon 780m": (89.6, 8.9), "radeon 890m": (120, 11.9),
    # Intel (intel.com Arc B580 spec: 456 GB/s, 192-bit GDDR6 19 Gbps); NVIDIA unified: DGX Spark (GB10,
    # nvidia.com: 273 GB/s LPDDR5X), Jetson AGX Orin 64GB (nvidia.com: 204.8 GB/s LPDDR5)
    "arc b580": (456, 58), "arc b570": (380, 50), "arc a770": (560, 39),
    "gb10": (273, 62), "jetson agx orin": (204.8, 21),
}
GPU_DEFAULT = (400.0, 40.0)
# host memory, GB/s
MEMORY_TABLE = {"ddr4": 51.2, "ddr5": 89.6, "lpddr5": 100.0}  # dual channel, peak
DISK_TABLE = {"nvme": 3.5, "nvme4": 7.0, "nvme5": 12.0, "ssd": 0.55, "hdd": 0.15, "unknown": 0.55}
EFFICIENCY = {"gpu": 0.7, "cpu": 0.55, "disk": 0.5, "compute_gpu": 0.35}
# One core's rate of reading quantized weights in decode, GB/s, as llama.cpp reaches it (not a peak: few
# cores cannot saturate DRAM). Measured: Q4_K_M 1B/3B/8B decode on 2 cores fit bytes / 19.0 GB/s + the
# per-layer cost below within 1% (benches/fit_speed.py)
CPU_GBPS_PER_CORE = 9.5
# One core's quantized-matmul throughput in prefill, GFLOP/s reached (llama.cpp multiplies int8 activations
# against the quantized weights: AVX2 maddubs / AVX-512 VNNI / NEON sdot). AVX-512: 1B/3B/8B Q4_K_M prefill
# on 2 cores = 248-260 GFLOP/s (benches/fit_speed.py); AVX2: llama-bench pp512 of 7B Q4_K_M ≈ 40-60 tok/s
# on a 6-8 core desktop ≈ 100 per core
CPU_GFLOPS_PER_CORE = {"AVX512F": 125.0, "AVX2": 100.0, "NEON": 60.0, "": 15.0}
# 8- and 16-bit weights are not repacked into llama.cpp's interleaved CPU layouts (ggml-cpu/repack.cpp
# covers Q4_0, Q4_K, IQ4_NL): prefill reaches 0.59 of the K-quant rate (Q8_0 1B/3B: 143-150 GFLOP/s on 2
# cores), and decode is bound by compute at 6.8 G weights/s per core (Q8_0 1B/3B) before bandwidth
WIDE_TYPES = ("Q8_0", "F16", "BF16", "F32")
CPU_WIDE_PREFILL_FACTOR = 0.59
CPU_WIDE_GWEIGHTS_PER_CORE = 6.8
# Per layer and decoded token, core-seconds that do not scale with the weights (ggml's thread barriers
# between a layer's graph nodes, norms, RoPE, the attention of a short context): 1.37 ms per layer on 2
# cores (the 1B/3B/8B fit above)
CPU_LAYER_CORE_S = 2.74e-3


@dataclass
class Tier:
    """One place weights are read from: bandwidth GB/s and compute GFLOP/s as llama.cpp achieves them."""

    name: str  # "gpu" | "cpu" | "disk"
    bandwidth_gbps: float
    gflops: float
    source: str = "table"  # "table" | "measured (hw --measure, 2026-…)"
    cores: int = 0  # the CPU tier's cores (its per-core fixed costs); 0 elsewhere


def gpu_tier(gpu) -> Tier:
    name = (gpu.name or "").lower()
    best = max((k for k in GPU_TABLE if k in name), key=len, default=None)
    bw, tf = GPU_TABLE[best] if best else GPU_DEFAULT
    return Tier("gpu", bw * EFFICIENCY["gpu"], tf * 1000 * EFFICIENCY["compute_gpu"],
                "table" if best else "table (unknown GPU: default)")


def cpu_tier(hw, measurement: dict | None = None) -> Tier:
    """CPU/DRAM tier. Apple Silicon's CPU reads the same unified memory as its GPU (≈ 60% of it); another
    unified machine's CPU reads it as fast as its cores stream (``CPU_GBPS_PER_CORE`` each).
    ``hw`` None (no machine described): 20 GB/s, 100 GFLOP/s, unless ``measurement`` gives them."""
    if hw is None:
        tier = Tier("cpu", 20.0, 100.0)
        return _measured(tier, measurement) if measurement else tier
    apple = [g for g in hw.gpus if g.unified]
    cores = max(1, hw.cpu.physical_cores)
    if apple and apple[0].vendor == "apple":
        bw = gpu_tier(apple[0]).bandwidth_gbps / EFFICIENCY["gpu"] * 0.6 * EFFICIENCY["cpu"]
    else:  # an APU / GB10 / Jetson reads its unified memory, a PC its DRAM, as fast as its cores stream
        peak = (gpu_tier(apple[0]).bandwidth_gbps / EFFICIENCY["gpu"] if apple
                else MEMORY_TABLE["ddr5" if "AVX512F" in hw.cpu.simd else "ddr4"])
        bw = min(peak * EFFICIENCY["cpu"], CPU_GBPS_PER_CORE * cores)
    simd = next((s for s in ("AVX512F", "AVX2", "NEON") if s in hw.cpu.simd), "")
    tier = Tier("cpu", bw, CPU_GFLOPS_PER_CORE[simd] * cores, cores=cores)
    return _measured(tier, measurement) if measurement else tier


def _measured(tier: Tier, measurement: dict) -> Tier:
    """``tier`` with a measurements.json entry's bandwidth and compute in place of the table's."""
    if measurement.get("decode_bandwidth_gbps"):
        tier.bandwidth_gbps = float(measurement["decode_bandwidth_gbps"])
    if measurement.get("prefill_gflops"):
        tier.gflops = float(measurement["prefill_gflops"])
    tier.source = f"measured ({measurement.get('source', 'measurements.json')}, {measurement.get('when', '?')})"
    return tier


def disk_tier(kind: str | None) -> Tier:
    return Tier("disk", DISK_TABLE.get(kind or "unknown", DISK_TABLE["unknown"]) * EFFICIENCY["disk"], 0.0)


def weights_read_per_token(spec, gpu_layers=(), output_on_gpu: bool = False, n_cpu_moe: int = 0) -> dict[str, float]:
    """Weight bytes (and parameters) one decoded token reads, per tier: ``{"gpu", "cpu", "gpu_params",
    "cpu_params"}``. The one definition of "bytes read per decoded token" (fit, bench --calibrate and
    hw --measure all use it, so a stored bandwidth reproduces the speed it was measured at).

    After llama.cpp src/llama-graph.cpp: every weight matrix once, expert tensors × n_expert_used /
    n_expert; of the token embeddings one row (``ggml_get_rows``; always on the CPU), unless the output
    layer is tied to them (no ``output.weight``: SmolLM2, Gemma), then they are read whole as the output
    matmul, on the tier of the output layer. ``gpu_layers``: repeating-layer indices on the GPU.
    """
    frac = (spec.n_expert_used / spec.n_expert) if spec.n_expert else 1.0
    gpu_set = set(gpu_layers)
    has_output = spec.has_output_weight
    out = {"gpu": 0.0, "cpu": 0.0, "gpu_params": 0.0, "cpu_params": 0.0, "gpu_out_params": 0.0,
           "cpu_out_params": 0.0}
    for g in spec.tensor_groups:  # the tensor table summed per (layer, role): same sums, fewer terms
        f = frac if g.role == "exps" else 1.0
        if g.layer is not None:
            where = "gpu" if (g.layer in gpu_set and not (g.role == "exps" and g.layer < n_cpu_moe)) else "cpu"
        elif g.role == "output":
            where = "gpu" if output_on_gpu else "cpu"
        elif g.role == "token_embd" and not has_output:  # tied: read fully as the output layer
            where = "gpu" if output_on_gpu else "cpu"
        elif g.role == "token_embd":  # one row per token, no matmul
            out["cpu"] += g.n_bytes / max(1, g.rows)
            continue
        else:
            continue
        out[where] += g.n_bytes * f
        out[where + "_params"] += g.n_elements * f
        if g.layer is None:  # the output matmul (its own matrix or the tied embeddings)
            out[where + "_out_params"] += g.n_elements * f
    return out


def prefill_params(rd: dict, where: str) -> float:
    """Parameters one prompt token multiplies on ``where`` ("gpu"/"cpu") of a ``weights_read_per_token``
    result: all but the output layer (a prompt's logits are computed for its last token only)."""
    return rd[where + "_params"] - rd[where + "_out_params"]


def cpu_decode_overhead_s(tier: Tier, n_layers_cpu: int, params_cpu: float, bytes_cpu: float,
                          quant: str) -> float:
    """Seconds per decoded token the CPU spends beyond reading ``bytes_cpu`` at the tier's bandwidth: the
    per-layer fixed cost (``CPU_LAYER_CORE_S`` / cores × layers on the CPU) and, for weights not repacked
    (``WIDE_TYPES``), the compute floor ``params / (CPU_WIDE_GWEIGHTS_PER_CORE × cores)`` where it exceeds
    the bandwidth time. 0 for a measured tier (its effective bandwidth folds these in) or no CPU layers."""
    if tier.source != "table" or not tier.cores:
        return 0.0
    extra = CPU_LAYER_CORE_S / tier.cores * max(0, n_layers_cpu)
    if quant.upper() in WIDE_TYPES and params_cpu > 0:
        floor = params_cpu / (CPU_WIDE_GWEIGHTS_PER_CORE * 1e9 * tier.cores)
        extra += max(0.0, floor - bytes_cpu / (tier.bandwidth_gbps * 1e9))
    return extra


def cpu_prefill_factor(tier: Tier, quant: str) -> float:
    """The share of ``tier.gflops`` a table CPU tier reaches in prefill on weights of type ``quant``
    (``CPU_WIDE_PREFILL_FACTOR`` for ``WIDE_TYPES``, else 1.0; 1.0 for a measured tier)."""
    return CPU_WIDE_PREFILL_FACTOR if tier.source == "table" and quant.upper() in WIDE_TYPES else 1.0


def kv_read_per_token(kv_cache_bytes: int, n_parallel: int = 1) -> float:
    """KV bytes attention reads per decoded token: half of one sequence's cache (the context half full
    on average). Bytes."""
    return kv_cache_bytes * 0.5 / max(1, n_parallel)


def decode_tok_s(bytes_per_tier: dict[str, float], tiers: dict[str, Tier], extra_s: float = 0.0) -> float:
    """Tokens/s = 1 / (Σ (bytes read per token on tier / bandwidth of tier) + ``extra_s``). Bytes, GB/s,
    seconds (``cpu_decode_overhead_s``)."""
    t = sum(b / (tiers[k].bandwidth_gbps * 1e9) for k, b in bytes_per_tier.items() if b > 0) + extra_s
    return 1.0 / t if t > 0 else 0.0


def prefill_tok_s(active_params_per_tier: dict[str, float], tiers: dict[str, Tier]) -> float:
    """Tokens/s = 1 / Σ (2 × params on tier / FLOP/s of tier) (disk pages count as CPU compute)."""
    t = 0.0
    for k, n in active_params_per_tier.items():
        if n <= 0:
            continue
        tier = tiers["cpu"] if k == "disk" else tiers[k]
        t += 2 * n / (max(tier.gflops, 1e-3) * 1e9)
    return 1.0 / t if t > 0 else 0.0


def ttft_s(prompt_tokens: int, prefill: float) -> float:
    return prompt_tokens / prefill if prefill > 0 else float("inf")
