"""fit's CPU speed model across sizes: which weights are bound by reading them and which by multiplying them,
and a per-layer cost small enough that a 135M model is not charged a 8B model's overheads.

Header-only reads of the two real models (no model is loaded); the measured side of these numbers is
benches/fit_speed.py (docs/fit.md, "Speed model")."""

from __future__ import annotations

import dataclasses

import pytest

from localrun.machine.hardware import CpuInfo
from localrun.model.gguf_info import read_gguf
from localrun.offload import speed as S
from localrun.offload.search import plan_for_run


def _cpu_only(cores: int):
    from localrun.machine.presets import get_preset

    hw = get_preset("laptop-16gb")
    return dataclasses.replace(hw, gpus=[], cpu=CpuInfo(model="test", arch="x86_64", physical_cores=cores,
                                                        logical_cores=cores, simd=["AVX2", "AVX512F"]))


def test_type_classes_follow_llamacpp_repacking():
    assert [S.type_class(t) for t in ("Q4_K", "q4_0", "IQ4_NL")] == ["repacked"] * 3
    assert [S.type_class(t) for t in ("Q8_0", "F16", "BF16")] == ["wide"] * 3
    assert [S.type_class(t) for t in ("Q4_1", "Q5_0", "Q6_K", "Q5_K")] == ["unpacked"] * 4


def test_small_widths_are_read_as_their_real_types(smollm_path, gemma_path):
    """SmolLM2 (Q4_1, 576 wide) and Gemma-3-270M ("Q4_K_M", 640 wide: K-quant rows are 256-element blocks, so
    most of it is Q5_0) hold almost no repacked weights: the file type alone would misclassify Gemma."""
    for path in (smollm_path, gemma_path):
        sh = S.weight_shares(read_gguf(path))
        assert sum(v for k, v in sh["decode"].items() if k.endswith("_w")) == pytest.approx(1.0)
        assert sh["decode"].get("repacked_w", 0.0) < 0.1
        assert sh["prefill"].get("repacked_w", 0.0) < 0.25


def test_a_small_models_fixed_costs_are_a_part_of_its_time_not_most(smollm_path):
    """The per-layer cost once fitted on 1B-8B (2.74 ms·core per layer) made SmolLM2's 30 layers cost 3× its
    weights (≈ 21 tok/s on 2 cores against 83 measured); now the layers' fixed cost is a part of the per-token
    time, not most of it, and two cores are faster than one."""
    spec = read_gguf(smollm_path)
    one, two = (plan_for_run(spec, _cpu_only(c), n_ctx=1024) for c in (1, 2))
    assert two.decode_tok_s > one.decode_tok_s and two.prefill_tok_s > one.prefill_tok_s
    layers_s = S.CPU_TENSOR_S * S.weight_shares(spec)["tensors_per_layer"] * spec.n_layer
    assert layers_s < 0.6 / two.decode_tok_s
    assert two.decode_tok_s > 3 * 21.4  # the old estimate on this 2-core machine shape


def test_without_a_tensor_table_the_file_type_stands_for_every_weight():
    tier = S.Tier("cpu", 19.0, 250.0, cores=2)
    q4k = S.cpu_decode_overhead_s(tier, 16, 1e9, 0.56e9, "Q4_K_M")
    q8 = S.cpu_decode_overhead_s(tier, 16, 1e9, 1.06e9, "Q8_0")
    assert q4k == pytest.approx(S.CPU_TENSOR_S * 9 * 16)  # repacked: no compute floor, a Llama layer's tensors
    assert q8 > q4k
    assert S.cpu_prefill_factor(tier, "Q8_0") == pytest.approx(S.CPU_WIDE_PREFILL_FACTOR)
    assert S.cpu_prefill_factor(tier, "Q4_K_M") == 1.0


def test_a_recurrent_layers_state_is_read_and_written_once_per_token(tmp_path, smollm_path):
    """A delta-net hybrid pays its R/S state twice a token at one core's rate (no share for a second thread);
    an attention-only model pays nothing for it."""
    from tiny_layouts import write_qwen35

    from localrun.offload.memory import recurrent_state

    spec = read_gguf(write_qwen35(tmp_path / "q.gguf", tokenizer_from=False))
    state = S.weight_shares(spec)["state_bytes"]
    assert state == recurrent_state(spec, 1).bytes > 0
    assert S.weight_shares(read_gguf(smollm_path))["state_bytes"] == 0
    tier = S.Tier("cpu", 19.0, 320.0, cores=2)
    with_state = S.cpu_decode_overhead_s(tier, spec.n_layer, 0, 0, "F32", spec)
    per_tensor = S.CPU_TENSOR_S * S.weight_shares(spec)["tensors_per_layer"] * spec.n_layer
    assert with_state - per_tensor == pytest.approx(2 * state / (S.CPU_GBPS_PER_CORE * 1e9))


@pytest.mark.model  # llama.cpp's quantizer
def test_an_amx_cpu_repacks_only_the_named_weights(tmp_path, deepseek_header_path, monkeypatch):
    """On a CPU that advertises AMX localrun names CPU_REPACK for attention and dense-FFN matrices alone
    (backends/llamacpp/lib.py ``repack_patterns``): an MoE's Q4_K experts and shared expert stay plain and are
    charged the vec_dot rate (``CPU_UNREPACKED_GWEIGHTS_PER_CORE``), a Qwen2-7B's weights are all named and
    cost the same either way. A tiny qwen35moe, 256 wide so its matrices take K-quants, quantized to Q4_K_M by
    llama.cpp's own quantizer."""
    from tiny_layouts import write_qwen35moe

    from localrun.backends.llamacpp.lib import import_llama

    monkeypatch.delenv("LOCALRUN_ALLOW_AMX", raising=False)
    monkeypatch.delenv("LOCALRUN_NO_REPACK", raising=False)
    _, C = import_llama()
    f32 = write_qwen35moe(tmp_path / "moe-f32.gguf", n_embd=256, n_ff_exp=256, n_ff_shexp=256, tokenizer_from=False)
    q = tmp_path / "moe-q4km.gguf"
    p = C.llama_model_quantize_default_params()
    p.ftype, p.nthread = 15, 1  # LLAMA_FTYPE_MOSTLY_Q4_K_M (llama.h)
    assert C.llama_model_quantize(str(f32).encode(), str(q).encode(), p) == 0
    spec = read_gguf(q)
    assert any(t.type_name == "Q4_K" and "_exps" in t.name for t in spec.tensors)
    named, every = S.weight_shares(spec, "named")["decode"], S.weight_shares(spec, "all")["decode"]
    assert not any(k.startswith("unrepacked_") for k in every)
    assert named["unrepacked_Q4_K_w"] > 0.3  # experts, shared expert, attn_gate, ssm_out
    assert named["repacked_w"] + named["unrepacked_Q4_K_w"] == pytest.approx(every["repacked_w"])
    amx = CpuInfo(model="test", arch="x86_64", physical_cores=1, logical_cores=1, simd=["AVX2", "AVX512F", "AMX"])
    hw = dataclasses.replace(_cpu_only(1), cpu=amx)
    tier = S.cpu_tier(hw)
    assert tier.repack == "named" and S.cpu_tier(_cpu_only(1)).repack == "all"
    rd = S.weights_read_per_token(spec)
    args = (spec.n_layer, rd["cpu_params"], rd["cpu"], "Q4_K_M", spec)
    assert S.cpu_decode_overhead_s(tier, *args) > S.cpu_decode_overhead_s(S.cpu_tier(_cpu_only(1)), *args)
    big = read_gguf(deepseek_header_path)
    assert S.weight_shares(big, "named")["decode"] == S.weight_shares(big, "all")["decode"]
