"""The memory model against llama.cpp's own report (real loads) and hand-computed synthetic GGUFs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from localrun.model.gguf_info import read_gguf
from localrun.offload.memory import (
    MiB,
    compute_buffer_bytes,
    kv_cache,
    model_buffer_bytes,
    output_buffer_bytes,
    split_weights,
)
from localrun.offload.search import plan_for_run

KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
                     r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB")
MODEL_LINE = re.compile(r"CPU_Mapped model buffer size = +([\d.]+) MiB")


def _mib(n: int) -> str:
    return f"{n / MiB:.2f}"


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_kv_and_model_buffer_equal_llamacpp_report(which, smollm_path, gemma_path):
    """KV bytes per cache (cells, layers, seqs, K and V MiB as llama.cpp prints them, i.e. to 0.01 MiB). Each
    context size and each KV type twice, not every pair (4 loads, not 6): 512 cells (Gemma-3: the SWA cache as
    big as the context) with f16 on two sequences and with q8_0; 4096 and 8192 (the SWA cache capped at its
    window: the same arithmetic) once with each type."""
    from localrun.backends import load_engine

    path = smollm_path if which == "smollm" else gemma_path
    spec = read_gguf(path)
    for n_ctx, kv_type in ((512, "f16"), (512, "q8_0"), (4096, "q8_0"), (8192, "f16")):
        par = 2 if (n_ctx == 512 and kv_type == "f16") else 1
        plan = plan_for_run(spec, None, n_ctx=n_ctx, kv_type=kv_type, n_parallel=par)
        eng = load_engine(path, plan)
        try:
            log = eng.load_log
        finally:
            eng.close()
        got = [m.groups() for m in map(KV_LINE.search, log) if m]
        kv = kv_cache(spec, n_ctx, kv_type=kv_type, n_parallel=par, kv_unified=plan.kv_unified)
        want = [
            (
                _mib(p.bytes),
                str(p.cells),
                str(p.n_layers),
                str(par),
                str(1 if plan.kv_unified else par),
                kv_type,
                _mib(p.k_bytes),
                kv_type,
                _mib(p.v_bytes),
            )
            for p in kv.parts
        ]
        assert [tuple(g) for g in got] == want, (n_ctx, kv_type)
        assert plan.kv_cache_bytes == kv.bytes
        mb = [m.group(1) for m in map(MODEL_LINE.search, log) if m]
        assert mb == [_mib(model_buffer_bytes(spec))] and model_buffer_bytes(spec) == plan.weights_bytes


COMPUTE_LINE = re.compile(r"CPU compute buffer size = +([\d.]+) MiB")
OUTPUT_LINE = re.compile(r"CPU +output buffer size = +([\d.]+) MiB")


@pytest.mark.parametrize("n_parallel", [1, 4, 8])
def test_every_buffer_against_llamacpp_log_per_parallel(n_parallel, smollm_path):
    """SmolLM2 at 8192 tokens per sequence, as chat/serve plan it on the CPU (no flash attention): KV per
    stream, compute buffer (not × sequences: it was planned 692 MB at 4 sequences, llama.cpp reserves
    166 MiB), logits buffer (× sequences) and the mmapped weights, each against llama.cpp's own line."""
    from localrun.backends import load_engine

    spec = read_gguf(smollm_path)
    plan = plan_for_run(spec, None, n_ctx=8192, n_parallel=n_parallel)
    assert plan.flash_attn is False and not plan.kv_unified
    eng = load_engine(smollm_path, plan)
    try:
        log = eng.load_log
    finally:
        eng.close()
    compute = [float(m.group(1)) for m in map(COMPUTE_LINE.search, log) if m]
    output = [float(m.group(1)) for m in map(OUTPUT_LINE.search, log) if m]
    kv = [m.groups() for m in map(KV_LINE.search, log) if m]
    assert len(compute) == 1 and abs(plan.compute_bytes / 1.02 / MiB - compute[0]) / compute[0] < 0.01, compute
    assert plan.compute_bytes >= compute[0] * MiB  # the margin is on the safe side
    assert output == [float(_mib(output_buffer_bytes(spec, n_parallel)))]
    assert kv and float(kv[0][0]) == float(_mib(plan.kv_cache_bytes)) and kv[0][3] == str(n_parallel)
    assert [m.group(1) for m in map(MODEL_LINE.search, log) if m] == [_mib(plan.weights_bytes)]


def test_compute_buffer_does_not_grow_with_sequences(smollm_path, gemma_path):
    for path in (smollm_path, gemma_path):
        spec = read_gguf(path)
        one = plan_for_run(spec, None, n_ctx=8192, n_parallel=1)
        for par in (4, 8):
            p = plan_for_run(spec, None, n_ctx=8192, n_parallel=par)
            assert p.compute_bytes == one.compute_bytes and p.kv_cache_bytes == par * one.kv_cache_bytes
    spec = read_gguf(smollm_path)  # a unified cache: attention spans every cell, so it does grow
    assert compute_buffer_bytes(spec, 4 * 8192, flash_attn=False) > 3 * compute_buffer_bytes(
        spec, 8192, flash_attn=False
    )


def test_llamacpp_refuses_a_quantized_v_cache_without_flash_attention(smollm_path):
    """Why the planner refuses --kv-type q8_0 --no-flash-attn: llama.cpp's llama_init_from_model returns
    NULL for it (it would otherwise have been loaded with flash attention silently on)."""
    from localrun.backends import load_engine
    from localrun.backends.llamacpp.lib import LlamaLog
    from localrun.errors import BackendError
    from localrun.offload.plan import Plan

    mark = LlamaLog.mark()
    with pytest.raises(BackendError):
        load_engine(smollm_path, Plan(n_ctx=512, kv_type="q8_0", flash_attn=False))
    assert any("quantized V cache requires flash_attn" in ln for ln in LlamaLog.since(mark))


_RSS = r"""
import json, sys
from localrun.backends import load_engine
from localrun.model.gguf_info import read_gguf
from localrun.offload.search import plan_for_run
path, n_ctx = sys.argv[1], int(sys.argv[2])
plan = plan_for_run(read_gguf(path), None, n_ctx=n_ctx)
eng = load_engine(path, plan)
rss = int(open("/proc/self/statm").read().split()[1]) * 4096
print(json.dumps({"rss": rss, "plan": plan.rss_bytes}))
"""


@pytest.mark.parametrize("which,n_ctx", [("smollm", 8192), ("gemma", 4096)])
def test_process_rss_after_load_within_5_percent(which, n_ctx, smollm_path, gemma_path):
    path = smollm_path if which == "smollm" else gemma_path
    r = subprocess.run([sys.executable, "-c", _RSS, str(path), str(n_ctx)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert abs(d["rss"] / d["plan"] - 1) < 0.05, d


# --------------------------------------------------------------------------------------------------
# synthetic GGUFs: header + tensor table only (GGUFWriter.add_tensor_info with the real shapes, no data
# written), so a 70B model is a few hundred KB on disk. read_gguf never reads tensor data.
# --------------------------------------------------------------------------------------------------


def _write(path, arch, meta: dict, tensors: list[tuple[str, tuple[int, ...], str]], vocab: int = 32000):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for k, v in meta.items():
        key = f"{arch}.{k}"
        if isinstance(v, list):
            w.add_array(key, v)
        else:
            w.add_uint32(key, v)
    w.add_uint32(f"{arch}.vocab_size", vocab)
    for name, shape, tname in tensors:
        qt = gguf.GGMLQuantizationType[tname]
        block, tbytes = gguf.GGML_QUANT_SIZES[qt]
        n = int(np.prod(shape))
        w.add_tensor_info(name, list(reversed(shape)), np.dtype(np.float32), n // block * tbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return read_gguf(path)


def _dense_tensors(n_layer, n_embd, n_ff, n_head, n_kv, hd, vocab, t="Q4_K"):
    out = [
        ("token_embd.weight", (n_embd, vocab), t),
        ("output_norm.weight", (n_embd,), "F32"),
        ("output.weight", (n_embd, vocab), "Q6_K"),
    ]
    for il in range(n_layer):
        p = f"blk.{il}."
        out += [
            (p + "attn_norm.weight", (n_embd,), "F32"),
            (p + "attn_q.weight", (n_embd, n_head * hd), t),
            (p + "attn_k.weight", (n_embd, n_kv * hd), t),
            (p + "attn_v.weight", (n_embd, n_kv * hd), "Q6_K"),
            (p + "attn_output.weight", (n_head * hd, n_embd), t),
            (p + "ffn_norm.weight", (n_embd,), "F32"),
            (p + "ffn_gate.weight", (n_embd, n_ff), t),
            (p + "ffn_up.weight", (n_embd, n_ff), t),
            (p + "ffn_down.weight", (n_ff, n_embd), "Q6_K"),
        ]
    return out


def test_synthetic_70b_dense(tmp_path):
    # Llama-3-70B shapes: 80 layers, n_embd 8192, n_ff 28672, 64 heads, 8 KV heads of 128
    spec = _write(
        tmp_path / "70b.gguf",
        "llama",
        {
            "block_count": 80,
            "context_length": 131072,
            "embedding_length": 8192,
            "feed_forward_length": 28672,
            "attention.head_count": 64,
            "attention.head_count_kv": 8,
        },
        _dense_tensors(80, 8192, 28672, 64, 8, 128, 128256),
        vocab=128256,
    )
    assert (tmp_path / "70b.gguf").stat().st_size < 2_000_000
    # by hand: K = V = n_ctx × 8 heads × 128 × 2 B per layer; 80 layers; 8192 cells
    assert kv_cache(spec, 8192).bytes == 2 * 8192 * 8 * 128 * 2 * 80  # 2.5 GiB
    assert kv_cache(spec, 8192, kv_type="q8_0").bytes == 2 * 8192 * (8 * 128 // 32 * 34) * 80
    q4k, q6k = 144 / 256, 210 / 256
    # q, o, k, gate, up in Q4_K; v, down in Q6_K; two F32 norms
    layer = (2 * 8192 * 8192 + 8192 * 1024 + 2 * 8192 * 28672) * q4k + (8192 * 1024 + 28672 * 8192) * q6k + 2 * 8192 * 4
    assert spec.layer_bytes[0] == int(layer)
    # 40 of 80 layers on the GPU: those layers, plus the output layer (n_gpu_layers counts it)
    ws = split_weights(spec, 41)
    assert ws.gpu_bytes == 40 * int(layer) + int(8192 * 128256 * q6k) + 8192 * 4
    from localrun.machine.presets import get_preset

    p = plan_for_run(spec, get_preset("nvidia-24gb"), n_ctx=8192)
    assert p.fits and 0 < p.n_gpu_layers < 81 and p.vram_bytes <= p.vram_budget_bytes


def test_synthetic_moe_experts_go_to_cpu_first(tmp_path):
    # Mixtral-8x7B-like: 32 layers, 8 experts (2 used), n_ff_exp 14336
    n_layer, n_embd, ff, ne = 32, 4096, 14336, 8
    tensors = [("token_embd.weight", (n_embd, 32000), "Q4_K"), ("output.weight", (n_embd, 32000), "Q6_K")]
    for il in range(n_layer):
        p = f"blk.{il}."
        tensors += [
            (p + "attn_q.weight", (n_embd, 4096), "Q4_K"),
            (p + "attn_k.weight", (n_embd, 1024), "Q4_K"),
            (p + "attn_v.weight", (n_embd, 1024), "Q6_K"),
            (p + "attn_output.weight", (4096, n_embd), "Q4_K"),
            (p + "ffn_gate_inp.weight", (n_embd, ne), "F32"),
            (p + "ffn_gate_exps.weight", (n_embd, ff, ne), "Q4_K"),
            (p + "ffn_up_exps.weight", (n_embd, ff, ne), "Q4_K"),
            (p + "ffn_down_exps.weight", (ff, n_embd, ne), "Q6_K"),
        ]
    spec = _write(
        tmp_path / "moe.gguf",
        "llama",
        {
            "block_count": n_layer,
            "context_length": 32768,
            "embedding_length": n_embd,
            "feed_forward_length": ff,
            "attention.head_count": 32,
            "attention.head_count_kv": 8,
            "expert_count": ne,
            "expert_used_count": 2,
        },
        tensors,
    )
    expert_layer = int(n_embd * ff * ne * (144 / 256) * 2 + ff * n_embd * ne * 210 / 256)
    ws = split_weights(spec, n_layer + 1, n_cpu_moe=10)
    assert ws.cpu_expert_bytes == 10 * expert_layer
    from localrun.machine.presets import get_preset

    p = plan_for_run(spec, get_preset("nvidia-16gb"), n_ctx=4096)
    assert p.fits and p.n_gpu_layers == n_layer + 1 and 0 < p.n_cpu_moe <= n_layer  # experts moved, layers not
    assert any("MoE experts" in r for r in p.reasons)


def test_synthetic_mla_latent_kv(tmp_path):
    # DeepSeek-V3-like MLA: K-only latent cache of kv_lora_rank 512 + 64 rope dims, one "head"
    n_layer = 61
    spec = _write(
        tmp_path / "mla.gguf",
        "deepseek2",
        {
            "block_count": n_layer,
            "context_length": 163840,
            "embedding_length": 7168,
            "feed_forward_length": 18432,
            "attention.head_count": 128,
            "attention.head_count_kv": 1,
            "attention.key_length": 576,
            "attention.value_length": 512,
            "attention.key_length_mla": 192,
            "attention.value_length_mla": 128,
            "attention.kv_lora_rank": 512,
        },
        [("token_embd.weight", (7168, 1024), "Q8_0")],
    )
    kv = kv_cache(spec, 4096)
    assert kv.bytes == 4096 * 576 * 2 * n_layer  # llama-kv-cache.cpp: has_v = !is_mla
    assert kv.parts[0].v_bytes == 0


def test_synthetic_sliding_window(tmp_path):
    # Gemma-3-27B-like: 62 layers, pattern 6 (5 local, 1 global), window 1024, 16 KV heads of 128
    n_layer = 62
    spec = _write(
        tmp_path / "swa.gguf",
        "gemma3",
        {
            "block_count": n_layer,
            "context_length": 131072,
            "embedding_length": 5376,
            "feed_forward_length": 21504,
            "attention.head_count": 32,
            "attention.head_count_kv": 16,
            "attention.key_length": 128,
            "attention.value_length": 128,
            "attention.sliding_window": 1024,
        },
        [("token_embd.weight", (5376, 1024), "Q8_0")],
    )
    n_global = sum(1 for il in range(n_layer) if il % 6 == 5)  # 10
    per_cell = 16 * 128 * 2 * 2  # K + V, f16
    kv = kv_cache(spec, 32768)
    # global layers: 32768 cells; SWA layers: GGML_PAD(min(32768, 1024 + 512), 256) = 1536 cells
    assert [p.cells for p in kv.parts] == [32768, 1536]
    assert kv.bytes == per_cell * (32768 * n_global + 1536 * (n_layer - n_global))
    assert kv_cache(spec, 32768, swa_full=True).bytes == per_cell * 32768 * n_layer
    # two sequences, not unified: each stream has its own cells
    assert kv_cache(spec, 4096, n_parallel=2).bytes == 2 * per_cell * (4096 * n_global + 1536 * 52)
