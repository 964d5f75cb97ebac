"""Speed model: decode and prefill throughput from bytes per tier, bandwidths and compute.

decode s/token = Σ_tiers (bytes read per token on the tier / effective bandwidth of the tier)
    bytes read per token = the weights active per token (all dense weights; only n_expert_used/n_expert of
    the expert tensors) + the KV cache read for the context in use;
prefill tok/s = effective FLOP/s / (2 × active params) (the standard 2·N FLOPs per token, Kaplan et al.
    2020), the slowest tier weighted by its share of the parameters. TTFT = prompt tokens / prefill tok/s.

Bandwidths are GB/s (10^9 B/s) peak figures from vendor specs; ``EFFICIENCY`` turns peak into what
llama.cpp reaches (≈ 0.7 GPU, 0.55 CPU DRAM). A ``localrun hw --measure`` / ``bench --calibrate`` entry in
measurements.json (``llamacpp/cpu`` …) replaces the table value, and the plan says so.
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
EFFICIENCY = {"gpu": 0.7, "cpu": 0.55, "disk": 0.5, "compute_gpu": 0.35, "compute_cpu": 0.5}
CPU_GBPS_PER_CORE = 6.0  # one core's streaming read rate: few cores cannot saturate DRAM
# one core's quantized-matmul throughput in prefill (llama.cpp multiplies int8 activations against the
# quantized weights: AVX2 maddubs / AVX-512 VNNI / NEON sdot); llama-bench pp512 on 7B Q4_K_M reaches
# ≈ 40-60 tok/s on a 6-8 core AVX2 desktop, i.e. ≈ 100-150 GFLOP/s per core before the efficiency factor
CPU_GFLOPS_PER_CORE = {"AVX512F": 120.0, "AVX2": 80.0, "NEON": 60.0, "": 15.0}


@dataclass
class Tier:
    """One place weights are read from: bandwidth GB/s and compute GFLOP/s as llama.cpp achieves them."""

    name: str  # "gpu" | "cpu" | "disk"
    bandwidth_gbps: float
    gflops: float
    source: str = "table"  # "table" | "measured (hw --measure, 2026-…)"


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
    if apple and apple[0].vendor == "apple":
        bw = gpu_tier(apple[0]).bandwidth_gbps / EFFICIENCY["gpu"] * 0.6
    elif apple:  # an APU / GB10 / Jetson: the CPU reads the same memory, as fast as its cores stream it
        bw = min(gpu_tier(apple[0]).bandwidth_gbps / EFFICIENCY["gpu"],
                 CPU_GBPS_PER_CORE * max(1, hw.cpu.physical_cores))
    else:
        bw = min(MEMORY_TABLE["ddr5" if "AVX512F" in hw.cpu.simd else "ddr4"],
                 CPU_GBPS_PER_CORE * max(1, hw.cpu.physical_cores))
    simd = next((s for s in ("AVX512F", "AVX2", "NEON") if s in hw.cpu.simd), "")
    tier = Tier("cpu", bw * EFFICIENCY["cpu"],
                CPU_GFLOPS_PER_CORE[simd] * max(1, hw.cpu.physical_cores) * EFFICIENCY["compute_cpu"])
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
    out = {"gpu": 0.0, "cpu": 0.0, "gpu_params": 0.0, "cpu_params": 0.0}
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
    return out


def kv_read_per_token(kv_cache_bytes: int, n_parallel: int = 1) -> float:
    """KV bytes attention reads per decoded token: half of one sequence's cache (the context half full
    on average). Bytes."""
    return kv_cache_bytes * 0.5 / max(1, n_parallel)


def decode_tok_s(bytes_per_tier: dict[str, float], tiers: dict[str, Tier]) -> float:
    """Tokens/s = 1 / Σ (bytes read per token on tier / bandwidth of tier). Bytes, GB/s."""
    t = sum(b / (tiers[k].bandwidth_gbps * 1e9) for k, b in bytes_per_tier.items() if b > 0)
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
