"""Speed model: decode and prefill throughput from bytes per tier, bandwidths and compute.

decode s/token = Σ_tiers (bytes read per token on the tier / effective bandwidth of the tier)
                 + the CPU's fixed costs (``cpu_decode_overhead_s``: per layer tensor, and a compute floor for
                 the weights llama.cpp does not repack: by type, and on a CPU that advertises AMX the ones
                 localrun leaves out of CPU_REPACK), when the CPU tier comes from the table
    bytes read per token = the weights active per token (all dense weights; only n_expert_used/n_expert of
    the expert tensors) + the KV cache read for the context in use;
prefill tok/s = effective FLOP/s / (2 × active params) (the standard 2·N FLOPs per token, Kaplan et al.
    2020), the slowest tier weighted by its share of the parameters; the output layer is not counted (a
    prompt's logits are computed for its last token only). TTFT = prompt tokens / prefill tok/s.

Bandwidths are GB/s (10^9 B/s) peak figures from vendor specs; ``EFFICIENCY`` turns peak into what
llama.cpp reaches (≈ 0.7 GPU, 0.55 CPU DRAM). The CPU's per-core figures (``CPU_GBPS_PER_CORE``,
``CPU_GFLOPS_PER_CORE``, ``CPU_TENSOR_S``, ``CPU_*_GWEIGHTS_PER_CORE``, the prefill factors) are rates llama.cpp
reaches, measured by ``benches/fit_speed.py`` (SmolLM2-135M, Gemma-3-270M, random-weight LFM2-350M, Qwen3.5-0.8B-
sized and Qwen2-7B layouts, 1 and 2 threads, 2-core Xeon with AVX-512, 2026-12-05; the Q8_0 rates from its earlier
Llama 1B/3B/8B run, 2026-12-02; docs/fit.md "Speed model"). A ``localrun hw --measure`` / ``bench --calibrate``
entry in measurements.json (``llamacpp/cpu`` …) replaces the table value, and the plan says so; a measured
tier's effective bandwidth already folds the fixed costs in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from localrun.model.repack import repack_mode, repack_patterns

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
# cores cannot saturate DRAM). Fitted with the constants below on SmolLM2-135M, Gemma-3-270M and random-weight
# LFM2-350M, Qwen3.5-0.8B-sized and Qwen2-7B layouts at 1 and 2 threads (benches/fit_speed.py, 2026-12-05)
CPU_GBPS_PER_CORE = 9.5
# One core's quantized-matmul throughput in prefill, GFLOP/s reached (llama.cpp multiplies int8 activations
# against the quantized weights: AVX2 maddubs / AVX-512 VNNI / NEON sdot). AVX-512: the repacked (Q4_K) rate
# fitted on the 135M-7B rows with the factors below (benches/fit_speed.py); AVX2: llama-bench pp512 of 7B
# Q4_K_M ≈ 40-60 tok/s on a 6-8 core desktop ≈ 100 per core
CPU_GFLOPS_PER_CORE = {"AVX512F": 160.0, "AVX2": 100.0, "NEON": 60.0, "": 15.0}
# Weight types llama.cpp repacks into interleaved rows for the CPU (ggml-cpu/repack.cpp: Q4_0, Q4_K, IQ4_NL on
# AVX2/AVX-512/NEON). Every other type is multiplied block by block (ggml-cpu/quants.c ``ggml_vec_dot_*``: unpack
# the bits, then int8 dot products), bound by that compute where it is slower than reading the bytes: at most
# ``CPU_UNPACKED_GWEIGHTS_PER_CORE`` G weights/s a core, which binds below ~4.2 bits a weight (Q3_K, Q2_K…); the
# 4-6-bit types measured (SmolLM2-135M's Q4_1, Gemma-3-270M's Q5_0, the Q6_K tensors of Q4_K_M files) decode at
# their bytes' rate (benches/fit_speed.py). 8- and 16-bit weights: ``CPU_WIDE_GWEIGHTS_PER_CORE`` (Q8_0 1B/3B).
REPACKED_TYPES = ("Q4_0", "Q4_K", "IQ4_NL")
WIDE_TYPES = ("Q8_0", "F16", "BF16", "F32")
CPU_UNPACKED_GWEIGHTS_PER_CORE = 18.0
CPU_WIDE_GWEIGHTS_PER_CORE = 6.8
# Which weights of a ``REPACKED_TYPES`` type are repacked depends on how localrun loads them (backends/llamacpp/lib.py
# ``weight_placement``; ``Tier.repack``): "all", llama.cpp's own choice (every such matmul weight, an MoE's 3-D experts
# included: repack.cpp ``forward_mul_mat_id``), unless the CPU advertises AMX; then localrun turns the extra buffer
# types off and names CPU_REPACK for model/repack.py ``repack_patterns``' kinds alone ("named": attention and dense FFN
# matrices). The rest (a gated delta-net's attn_gate and ssm_out, an MoE's ``*_exps`` and ``*_shexp``, a short-conv's
# projections) stay plain and are multiplied row by row with ``ggml_vec_dot_q4_K_q8_K`` (ggml-cpu.c
# ``ggml_compute_forward_mul_mat`` / ``_mul_mat_id_one_chunk``), which is compute-bound below their bytes' rate: this
# many G weights/s a core (Q4_K: perf on the qwen35moe layout of benches/fit_speed.py at 1 thread, 25.4 ms of vec_dot
# for 265 M weights a token, 10.4; 10.6 on the dense qwen35. Not fitted. Check: the same file decoded 8.3-12.8 ms a
# token faster at 1 thread, 4.4 ms at 2, with every Q4_K matrix named to CPU_REPACK; this rate charges 9.5 and 4.8 ms.
# 2-core Xeon, 2026-12-05; docs/fit.md). Other types: ``CPU_UNPACKED_GWEIGHTS_PER_CORE`` (not measured unrepacked).
CPU_UNREPACKED_GWEIGHTS_PER_CORE = {"Q4_K": 10.5}
# Prefill: weights not repacked reach this share of the repacked GFLOP/s, per type (Q8_0 1B/3B: 143-150 GFLOP/s on
# 2 cores against 248-260; Q4_1: SmolLM2-135M; Q5_0: Gemma-3-270M; other types, e.g. the Q6_K tensors of Q4_K_M
# files: ``CPU_UNPACKED_PREFILL_FACTOR``)
CPU_WIDE_PREFILL_FACTOR = 0.59
CPU_UNPACKED_PREFILL_FACTOR = 0.45
CPU_PREFILL_FACTOR_BY_TYPE = {"Q4_1": 0.25, "Q5_0": 0.55}
# Routed experts of a repacked type (an MoE's ``*_exps`` tensors, multiplied by GGML_OP_MUL_MAT_ID): the repacked
# MUL_MAT_ID takes the prompt's rows one at a time with a GEMV (ggml-cpu/repack.cpp ``forward_mul_mat_id``),
# not the GEMM its MUL_MAT uses, so they reach this share of the repacked GFLOP/s in prefill. Experts of other
# types go block by block either way (ggml-cpu.c ``ggml_compute_forward_mul_mat_id``): their type's factor.
# Taken as the unpacked types' factor (the same row-at-a-time kind of work), not fitted. (On the AMX Xeon of that
# row the experts are not repacked at all, ``CPU_UNREPACKED_GWEIGHTS_PER_CORE``: they take ggml-cpu.c's
# vec_dot path, row-at-a-time work too.) benches/fit_speed.py's
# qwen35moe row (32 experts, 4 used, Q4_K_M) then estimates prefill at 1.06/1.12 of measured at 1/2 threads
# (1.30/1.39 while the experts counted as repacked GEMM), 2026-12-05; one MoE layout only.
CPU_REPACKED_EXPERT_PREFILL_FACTOR = CPU_UNPACKED_PREFILL_FACTOR
CPU_TENSOR_PREFILL_CORE_S = 4e-6
# Per layer and decoded token, beyond its matrices: ``CPU_TENSOR_S`` seconds per tensor of the layer, which more
# threads do not shorten (a tensor is roughly one graph node, with its small ops: norms, RoPE, activations, a short
# context's attention; every node ends in a barrier all threads wait at: ggml-cpu/ggml-cpu.c
# ``ggml_graph_compute_thread``). It scales a layer's fixed cost with what the layer holds: a 9-tensor Llama layer
# costs 0.23 ms, a 14-tensor delta-net layer 0.35 ms, at any width (the 2.74 ms·core per layer once fitted on 1B-8B
# alone, with a 9.5 GB/s rate, was 3-6× too high for 135M-1B models).
# Fitted with the rates above on the 135M-7B rows at 1 and 2 threads (benches/fit_speed.py, 2026-12-05).
CPU_TENSOR_S = 25e-6
# A recurrent layer's state (R/S, F32: offload/memory.py ``recurrent_state``) is read and written once per decoded
# token; a gated delta-net's S is 1 MiB a layer at Qwen3.5-0.8B's widths. Charged at one core's
# ``CPU_GBPS_PER_CORE`` in decode: the qwen35 layout's time at 2 threads fell short of half its 1-thread time
# by about this (benches/fit_speed.py; presumably the recurrent ops split poorly across threads). In prefill the state
# stays in cache between a batch's tokens: ``CPU_STATE_PREFILL_GBPS`` (fitted on the same rows). Short-conv R
# (LFM2: 8 KiB a layer) costs next to nothing either way.
CPU_STATE_PREFILL_GBPS = 40.0


@dataclass
class Tier:
    """One place weights are read from: bandwidth GB/s and compute GFLOP/s as llama.cpp achieves them."""

    name: str  # "gpu" | "cpu" | "disk"
    bandwidth_gbps: float
    gflops: float
    source: str = "table"  # "table" | "measured (hw --measure, 2026-…)"
    cores: int = 0  # the CPU tier's cores (its per-core fixed costs); 0 elsewhere
    repack: str = "all"  # the CPU's repacked weights: "all" | "named" | "none" (``cpu_repack_mode``)


def cpu_repack_mode(simd) -> str:
    """``model/repack.py`` ``repack_mode`` for a CPU with these ``simd`` labels (machine/hardware.py
    ``probe_cpu``): the same rule the loader applies."""
    return repack_mode("AMX" in (simd or ()))


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
    tier = Tier("cpu", bw, CPU_GFLOPS_PER_CORE[simd] * cores, cores=cores, repack=cpu_repack_mode(hw.cpu.simd))
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


def type_class(type_name: str) -> str:
    """"repacked" (``REPACKED_TYPES``), "wide" (``WIDE_TYPES``) or "unpacked" (every other quantized type)."""
    t = type_name.upper()
    return "repacked" if t in REPACKED_TYPES else "wide" if t in WIDE_TYPES else "unpacked"


def weight_shares(spec, repack: str = "all") -> dict:
    """Shares of the weights one decoded token reads (``"decode"``: the repeating layers and the output matmul)
    and one prompt token multiplies (``"prefill"``: the layers alone), per type class (``type_class``):
    ``{"decode": {"repacked_w", "repacked_b", "unpacked_w", …}, "prefill": {…}}``, ``_w`` of the weights,
    ``_b`` of the bytes, ``"type:Q4_1"``… of the prefill weights per ggml type, each set summing to 1 (1-D
    tensors, norms and biases, left out); and
    ``"tensors_per_layer"``: tensors of ``blk.N``, all kinds, per layer. ``repack`` (``cpu_repack_mode``):
    "named" or "none" moves the decode weights of a repackable type that stay plain to
    ``"unrepacked_<TYPE>_w"``/``_b`` (``CPU_UNREPACKED_GWEIGHTS_PER_CORE``); prefill keeps the type classes (its
    factors were fitted so). Cached on ``spec`` per ``repack``."""
    cache = spec.__dict__.setdefault("_weight_shares", {})
    if repack in cache:
        return cache[repack]
    frac = (spec.n_expert_used / spec.n_expert) if spec.n_expert else 1.0
    tied = not spec.has_output_weight
    named = _repacked_by_name(spec) if repack == "named" else None
    acc = {"decode": {}, "prefill": {}}
    for t in spec.tensors:
        if len(t.shape) < 2:
            continue
        output = t.layer is None and (t.name.startswith("output.") or (tied and t.name == "token_embd.weight"))
        if t.layer is None and not output:
            continue
        f = frac if "_exps" in t.name else 1.0
        c = type_class(t.type_name)
        plain = c == "repacked" and repack != "all" and not (named and named.search(t.name))
        for phase in ("decode",) if output else ("decode", "prefill"):
            k = f"unrepacked_{t.type_name.upper()}" if plain and phase == "decode" else c
            acc[phase][k + "_w"] = acc[phase].get(k + "_w", 0.0) + t.n_elements * f
            acc[phase][k + "_b"] = acc[phase].get(k + "_b", 0.0) + t.n_bytes * f
        if not output:
            experts = "_exps" in t.name and c == "repacked"  # a GEMV per prompt row (CPU_REPACKED_EXPERT_…)
            key = "type:" + (EXPERT_GEMV if experts else t.type_name.upper())
            acc["prefill"][key] = acc["prefill"].get(key, 0.0) + t.n_elements * f
    for d in acc.values():
        for unit in ("_w", "_b", "type:"):
            keys = [k for k in d if k.endswith(unit) or k.startswith(unit)]
            total = sum(d[k] for k in keys) or 1.0
            for k in keys:
                d[k] /= total
    acc["tensors_per_layer"] = sum(1 for t in spec.tensors if t.layer is not None) / max(1, spec.n_layer)
    acc["state_bytes"] = _state_bytes(spec)
    cache[repack] = acc
    return acc


def _repacked_by_name(spec):
    """One regex matching the weights localrun names to CPU_REPACK on a CPU that advertises AMX
    (model/repack.py ``repack_patterns``, every layer on the CPU; AMX implies AVX2 and AVX-512)."""
    pats = repack_patterns(spec, 0, has={"avx2": True, "avx512": True})
    return re.compile("|".join(f"(?:{p})" for p in pats)) if pats else None


def _state_bytes(spec) -> float:
    """One sequence's recurrent state (R + S over the recurrent layers), bytes; 0 for an attention-only model."""
    try:
        from localrun.offload.memory import recurrent_state

        return float(recurrent_state(spec, 1).bytes)
    except (AttributeError, TypeError, ValueError, KeyError):  # a spec without the per-layer facts
        return 0.0


def _shares(spec, quant: str, phase: str, repack: str = "all") -> dict[str, float]:
    if spec is not None and getattr(spec, "tensors", None):
        return weight_shares(spec, repack)[phase]
    main = _main_type(quant)  # no tensor table: the file type's main type for every weight
    c = type_class(main)
    return {c + "_w": 1.0, c + "_b": 1.0, "type:" + main: 1.0}


def _main_type(quant: str) -> str:
    """A file type's main tensor type: Q4_K_M → Q4_K, Q5_K_S → Q5_K (llama.h's LLAMA_FTYPE_MOSTLY_*)."""
    q = (quant or "").upper()
    return q[:-2] if re.search(r"_K_(S|M|L)$", q) else q


def cpu_decode_overhead_s(tier: Tier, n_layers_cpu: int, params_cpu: float, bytes_cpu: float,
                          quant: str, spec=None) -> float:
    """Seconds per decoded token the CPU spends beyond reading ``bytes_cpu`` at the tier's bandwidth: the
    per-layer cost (``CPU_TENSOR_S`` × tensors per layer × layers on the CPU; 9 tensors, a Llama layer's,
    without a tensor table), the recurrent state read and written at one core's rate (``CPU_GBPS_PER_CORE``)
    and, for weights llama.cpp does not
    repack (ggml-cpu/repack.cpp), their compute floor where it exceeds their bandwidth time:
    ``max(0, weights / (rate × cores) - bytes / bandwidth)``, rate ``CPU_UNPACKED_GWEIGHTS_PER_CORE`` or
    ``CPU_WIDE_GWEIGHTS_PER_CORE`` G weights/s; weights of a repackable type the tier's ``repack`` mode leaves
    plain (an AMX CPU: MoE experts, shared experts, delta-net gates; ``weight_shares``) at
    ``CPU_UNREPACKED_GWEIGHTS_PER_CORE``. The type of each weight comes from ``spec``'s tensor table
    (``weight_shares``; a Q4_K_M file holds Q6_K tensors, a 576- or 640-wide model's "Q4_K_M" is mostly
    Q5_0 since K-quant rows are 256-element blocks), else ``quant`` stands for all. 0 for a measured tier
    (its effective bandwidth folds these in) or no CPU layers."""
    if tier.source != "table" or not tier.cores:
        return 0.0
    table = spec is not None and getattr(spec, "tensors", None)
    per_layer = weight_shares(spec)["tensors_per_layer"] if table else 9
    extra = CPU_TENSOR_S * per_layer * max(0, n_layers_cpu)
    if table and spec.n_layer:
        state = weight_shares(spec)["state_bytes"] * min(1.0, max(0, n_layers_cpu) / spec.n_layer)
        extra += 2 * state / (CPU_GBPS_PER_CORE * 1e9)
    if params_cpu <= 0:
        return extra
    sh = _shares(spec, quant, "decode", tier.repack)
    rates = [("unpacked", CPU_UNPACKED_GWEIGHTS_PER_CORE), ("wide", CPU_WIDE_GWEIGHTS_PER_CORE)]
    rates += [(k[:-2], CPU_UNREPACKED_GWEIGHTS_PER_CORE.get(k[11:-2], CPU_UNPACKED_GWEIGHTS_PER_CORE))
              for k in sh if k.startswith("unrepacked_") and k.endswith("_w")]
    for c, rate in rates:
        w, b = params_cpu * sh.get(c + "_w", 0.0), bytes_cpu * sh.get(c + "_b", 0.0)
        extra += max(0.0, w / (rate * 1e9 * tier.cores) - b / (tier.bandwidth_gbps * 1e9))
    return extra


EXPERT_GEMV = "EXPERTS(GEMV)"  # weight_shares' prefill key for routed experts of a repacked type


def _prefill_factor(type_name: str) -> float:
    if type_name == EXPERT_GEMV:
        return CPU_REPACKED_EXPERT_PREFILL_FACTOR
    c = type_class(type_name)
    if c == "repacked":
        return 1.0
    return CPU_WIDE_PREFILL_FACTOR if c == "wide" else CPU_PREFILL_FACTOR_BY_TYPE.get(type_name,
                                                                                      CPU_UNPACKED_PREFILL_FACTOR)


def cpu_prefill_factor(tier: Tier, quant: str, spec=None) -> float:
    """The share of ``tier.gflops`` a table CPU tier reaches in prefill: 1 / (Σ_class share of the layers'
    weights / the type's factor + the fixed part), factors ``CPU_WIDE_PREFILL_FACTOR`` for ``WIDE_TYPES``,
    ``CPU_PREFILL_FACTOR_BY_TYPE`` or ``CPU_UNPACKED_PREFILL_FACTOR`` for other types not repacked, 1.0 for
    repacked ones (types from ``spec``'s tensor table, else ``quant`` for all; a file type such as Q4_K_M
    counts as its main type's class). The fixed part: ``CPU_TENSOR_PREFILL_CORE_S`` core-seconds per prompt
    token and layer tensor (the non-matmul nodes: norms, RoPE, attention, a delta-net's scan) and the recurrent
    state once per token at ``CPU_STATE_PREFILL_GBPS``, as shares of the matmul time 2 × layer params / FLOP/s.
    1.0 for a measured tier."""
    if tier.source != "table":
        return 1.0
    sh = _shares(spec, quant, "prefill")
    types = {k[5:]: v for k, v in sh.items() if k.startswith("type:")}
    t = sum(share / _prefill_factor(name) for name, share in types.items())
    if spec is not None and getattr(spec, "tensors", None) and tier.cores:
        params = sum(x.n_elements for x in spec.tensors if x.layer is not None and len(x.shape) > 1)
        n_tensors = weight_shares(spec)["tensors_per_layer"] * spec.n_layer
        if params:
            t += CPU_TENSOR_PREFILL_CORE_S * n_tensors / (2 * params / (tier.gflops / tier.cores * 1e9))
            state_s = 2 * weight_shares(spec)["state_bytes"] / (CPU_STATE_PREFILL_GBPS * 1e9)  # not shared by cores
            t += state_s / (2 * params / (tier.gflops * 1e9))
    return 1.0 / t if t > 0 else 1.0


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
