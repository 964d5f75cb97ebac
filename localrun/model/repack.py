"""Which weights llama.cpp's CPU_REPACK buffer type takes, by name: a fact about a model's tensors and a
CPU's features that the loader (backends/llamacpp/lib.py, which names them to CPU_REPACK on a CPU that
advertises AMX) and the speed model (offload/speed.py) both need."""

from __future__ import annotations

import os
import re

# ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type, its x86 branches: weight type → the CPU feature
# its interleaved GEMM kernel needs (the row count ne[1] must be a multiple of 8)
REPACK_X86 = {"Q4_0": "avx2", "Q4_K": "avx2", "IQ4_NL": "avx2", "MXFP4": "avx2", "Q2_K": "avx512"}
MATMUL_WEIGHT = re.compile(r"^blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_up|ffn_down|ffn_gate"
                            r"|ffn_gate_up)\.weight$")


def repack_patterns(spec, n_gpu_layers: int, has: dict[str, bool]) -> list[str]:
    """Regexes naming the weights llama.cpp's CPU_REPACK buffer type would take (the ones it repacks into
    interleaved blocks for its x86 GEMM kernels: Q4_0, Q4_K, IQ4_NL, MXFP4 with AVX2, Q2_K with AVX-512),
    for the layers that stay on the CPU: the first ``n_layer - n_gpu_layers`` (llama.cpp offloads the
    last ones; the output matrix goes to the GPU when ``n_gpu_layers > n_layer``). One anchored pattern
    per weight kind, the layer numbers as an alternation. ``has`` = {"avx2": …, "avx512": …}: the CPU's
    features (backends/llamacpp/lib.py asks ggml; the planner assumes an AMX CPU's)."""
    n_layer = int(spec.n_layer)
    ngl = n_layer + 1 if n_gpu_layers < 0 else int(n_gpu_layers)
    first_gpu = max(0, n_layer - ngl)
    by_kind: dict[str, list[int]] = {}
    output = False
    for t in spec.tensors:
        need = REPACK_X86.get(t.type_name)
        if not need or not has.get(need) or len(t.shape) != 2 or t.shape[1] % 8:
            continue
        m = MATMUL_WEIGHT.match(t.name)
        if m and int(m.group(1)) < first_gpu:
            by_kind.setdefault(m.group(2), []).append(int(m.group(1)))
        elif t.name == "output.weight" and ngl <= n_layer:
            output = True
    pats = [f"^blk\\.({'|'.join(str(i) for i in sorted(ids))})\\.{kind}\\.weight$"
            for kind, ids in sorted(by_kind.items())]
    return pats + (["^output\\.weight$"] if output else [])


def repack_mode(amx_advertised: bool) -> str:
    """Which weights of a repackable type llama.cpp repacks as localrun loads a model (backends/llamacpp/lib.py
    ``weight_placement``): "all" (llama.cpp's own choice, its extra buffer types on), "named" (the CPU
    advertises AMX: the extra buffer types off, only ``repack_patterns``' kinds named to CPU_REPACK), "none"
    (AMX and ``LOCALRUN_NO_REPACK``). ``LOCALRUN_ALLOW_AMX`` (a fixed llama.cpp) restores "all"."""
    if not amx_advertised or os.environ.get("LOCALRUN_ALLOW_AMX"):
        return "all"
    return "none" if os.environ.get("LOCALRUN_NO_REPACK") else "named"
