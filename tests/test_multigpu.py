"""Several GPUs in one box, and RPC devices, in the planner (issue 18): injected hardware profiles and
catalog models (synthetic specs from models.toml), no model file, no GPU. Fast tier."""

from __future__ import annotations

import json

import pytest
from helpers import localrun_inprocess

from localrun.errors import ConfigError
from localrun.machine.hardware import GiB, GpuInfo, HardwareProfile
from localrun.machine.presets import get_preset
from localrun.model.catalog import get_entry
from localrun.model.synthetic import spec_from_entry
from localrun.offload import devices as D
from localrun.offload import links as L
from localrun.offload.choose import Candidate, choose
from localrun.offload.memory import CUDA_CONTEXT_VRAM_BYTES
from localrun.offload.plan import evaluate
from localrun.offload.search import plan_for_run


def _spec(name: str, quant: str = "Q4_K_M"):
    return spec_from_entry(get_entry(name), quant)


def _check_layout(p, spec):
    """The plan's devices hold consecutive layers, the last used one the output, and llama.cpp's own
    assignment rule (upper_bound over tensor_split) puts every offloaded slot on the device that counts it."""
    used = [d for d in p.devices if d["n_layers"] or d["output"]]
    layers = [il for d in used for il in range(*d["layers"])] if used else []
    assert layers == list(range(spec.n_layer + 1 - p.n_gpu_layers, spec.n_layer))
    assert used[-1]["output"] and not any(d["output"] for d in used[:-1])
    assert sum(p.tensor_split) == p.n_gpu_layers
    j = 0
    for d in p.devices:
        for _ in range(d["n_layers"] + int(d["output"])):
            assert D.device_of_slot(j, p.tensor_split, p.n_gpu_layers) == d["index"], (j, p.tensor_split)
            j += 1
    assert all(d["fits"] for d in p.devices)
    assert p.vram_bytes == sum(d["total_bytes"] for d in p.devices)


def _one_big_gpu(hw, vram_gib: int = 400) -> HardwareProfile:
    g = hw.gpus[0]
    big = GpuInfo(name=g.name, vendor=g.vendor, backend=g.backend, total_bytes=vram_gib * GiB,
                  free_bytes=vram_gib * GiB)
    return HardwareProfile(cpu=hw.cpu, ram_total_bytes=hw.ram_total_bytes, ram_available_bytes=hw.ram_available_bytes,
                           gpus=[big], disk=hw.disk, os=hw.os)


def test_70b_q4_k_m_on_two_24gb_cards_splits_by_layer():
    spec = _spec("llama-3.3-70b-instruct")
    p = plan_for_run(spec, get_preset("2x24gb"))
    assert p.fits and p.split_mode == "layer" and p.n_gpu_layers == spec.n_layer + 1  # everything on the GPUs
    assert len(p.devices) == 2 and all(d["n_layers"] > 30 for d in p.devices)
    _check_layout(p, spec)
    assert p.reasons[0].startswith(f"{spec.n_layer} of {spec.n_layer} layers split over 2 GPUs by layer")
    # 2.5 GiB of f16 KV at 8192 tokens: each layer's KV on its own layer's device
    assert sum(d["kv_bytes"] for d in p.devices) == p.kv_gpu_bytes == p.kv_cache_bytes


@pytest.mark.parametrize("preset,name,quant", [("2x24gb", "llama-3.3-70b-instruct", "Q4_K_M"),
                                               ("3x16gb", "llama-3.3-70b-instruct", "Q4_K_M"),
                                               ("24+12gb", "qwen3-32b", "Q6_K"),
                                               ("24+12gb", "llama-3.3-70b-instruct", "Q4_K_M")])
def test_device_bytes_sum_to_the_single_device_figure_plus_per_device_overheads(preset, name, quant):
    spec = _spec(name, quant)
    hw = get_preset(preset)
    p = plan_for_run(spec, hw, n_ctx=8192, kv_type="f16")
    assert p.fits and len([d for d in p.devices if d["n_layers"]]) == len(hw.gpus)
    _check_layout(p, spec)
    # the same configuration on ONE GPU big enough for it: weights + KV + full compute buffer + one CUDA context
    one = evaluate(spec, _one_big_gpu(hw), n_ctx=8192, kv_type="f16", n_gpu_layers=p.n_gpu_layers,
                   flash_attn=p.flash_attn)
    assert one.weights_gpu_bytes == p.weights_gpu_bytes and one.kv_gpu_bytes == p.kv_gpu_bytes
    extra = [d["compute_bytes"] + d["overhead_bytes"] for d in p.devices if not d["output"]]
    assert all(d["overhead_bytes"] == CUDA_CONTEXT_VRAM_BYTES for d in p.devices)
    assert sum(d["total_bytes"] for d in p.devices) == one.vram_bytes + sum(extra)
    out = next(d for d in p.devices if d["output"])
    assert out["compute_bytes"] == one.compute_bytes  # the logits' buffer lives with the output layer


def test_mixed_sizes_split_in_proportion_to_what_each_card_holds():
    spec = _spec("qwen3-32b", "Q6_K")  # ≈ 25 GiB: too big for the 24 GB card alone
    hw = get_preset("24+12gb")
    p = plan_for_run(spec, hw, n_ctx=8192)
    assert p.fits and p.split_mode == "layer" and p.n_gpu_layers == spec.n_layer + 1
    _check_layout(p, spec)
    big, small = p.devices
    cap = [d["budget_bytes"] - d["overhead_bytes"] - d["compute_bytes"] for d in p.devices]
    share = big["n_layers"] / (big["n_layers"] + small["n_layers"])
    assert abs(share - cap[0] / sum(cap)) < 2 / spec.n_layer  # within a layer or two of the capacity ratio
    assert big["n_layers"] > 1.5 * small["n_layers"]


def test_a_model_that_fits_on_one_card_stays_on_one_card():
    """A layer split runs its cards one after another, so two cards read the same bytes no faster than one
    and add a hop per token: one card decodes faster and leaves the other free."""
    spec = _spec("qwen3-32b")  # Q4_K_M ≈ 18.5 GiB
    hw = get_preset("2x24gb")
    p = plan_for_run(spec, hw, n_ctx=4096)
    assert p.fits and p.split_mode == "none" and p.tensor_split is None
    assert p.main_gpu == 1  # GPU 0 carries the desktop (0.5 GiB less free): the other card
    assert len(p.devices) == 1 and p.devices[0]["index"] == 1
    assert any(r.startswith("one card: it fits on GPU 1 alone") for r in p.reasons)
    split = evaluate(spec, hw, n_ctx=4096, kv_type=p.kv_type, n_gpu_layers=spec.n_layer + 1)
    assert split.split_mode == "layer" and split.fits
    assert p.decode_tok_s > split.decode_tok_s and p.vram_bytes < split.vram_bytes
    # a mixed box keeps it on the faster (and bigger) card
    m = plan_for_run(spec, get_preset("24+12gb"), n_ctx=4096)
    assert m.split_mode == "none" and m.main_gpu == 0 and "4090" in m.devices[0]["name"]
    # the longer context the planner chooses by itself keeps the one-card choice
    auto = plan_for_run(spec, hw)
    assert auto.split_mode == "none" and auto.n_ctx > 4096


def test_row_split_only_on_slow_cards():
    spec = _spec("llama-3.3-70b-instruct")
    p40 = get_preset("2x24gb")
    for g in p40.gpus:
        g.name = "Tesla P40"  # 347 GB/s: reading a layer takes longer than its matmuls' synchronisation
    row = plan_for_run(spec, p40, n_ctx=8192)
    layer = plan_for_run(spec, get_preset("2x24gb"), n_ctx=8192)  # RTX 3090: 936 GB/s
    assert row.split_mode == "row" and any(r.startswith("split_mode row:") for r in row.reasons)
    assert layer.split_mode == "layer" and not any("split_mode row" in r for r in layer.reasons)
    forced_layer = evaluate(spec, p40, n_ctx=8192, kv_type=row.kv_type, n_gpu_layers=row.n_gpu_layers)
    assert forced_layer.split_mode == "row"  # evaluate makes the same call for the same configuration
    assert row.vram_bytes == forced_layer.vram_bytes


def test_fit_prints_devices_and_json_lists_them(isolated_home):
    r = localrun_inprocess("fit", "llama-3.3-70b-instruct:Q4_K_M", "--preset", "2x24gb", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["split_mode"] == "layer" and d["tensor_split"] == [41.0, 40.0]
    assert [x["index"] for x in d["devices"]] == [0, 1]
    assert {"weights_bytes", "kv_bytes", "compute_bytes", "overhead_bytes", "total_bytes", "budget_bytes",
            "layers", "n_layers", "output", "fits"} <= set(d["devices"][0])
    assert sum(x["total_bytes"] for x in d["devices"]) == d["vram_bytes"]
    t = localrun_inprocess("fit", "llama-3.3-70b-instruct:Q4_K_M", "--preset", "3x16gb", env={"COLUMNS": "200"})
    assert t.returncode == 0, t.stderr
    assert "per device (split by rows, tensor_split 27,28,26)" in t.stdout  # 288 GB/s cards: rows pay
    assert t.stdout.count("RTX 4060 Ti") >= 3 and "+ output" in t.stdout


# ------------------------------------------------------------------------------------------------
# the network: hops, RPC devices, "slower than a smaller quant on one machine"
# ------------------------------------------------------------------------------------------------

def test_hop_arithmetic_and_link_flag():
    lk = L.parse_link("0.5,0.1")
    assert lk.latency_s == pytest.approx(0.5e-3) and lk.bandwidth_gbps == 0.1 and lk.source == "--rpc-link"
    # one decoded token of an 8192-wide model crosses with 32 KiB: 2 round trips + 32768 B / 0.1 GB/s
    assert L.activation_bytes(8192) == 32768
    assert L.hop_s(lk, L.activation_bytes(8192)) == pytest.approx(2 * 0.5e-3 + 32768 / 0.1e9)
    assert L.split_decode_tok_s([0.02, 0.03], [lk], 8192) == pytest.approx(1 / (0.05 + 1e-3 + 32768 / 0.1e9))
    # prefill: a 512-token ubatch pays the latency once
    assert L.prefill_hops_s_per_token([lk], 8192, 512) == pytest.approx((1e-3 + 512 * 32768 / 0.1e9) / 512)
    for bad in ("", "1", "x,2", "1,0", "-1,2", "1,2,3"):
        with pytest.raises(ConfigError):
            L.parse_link(bad)


def _with_worker(hw, vram_gib: int, link: dict | None):
    w = GpuInfo(name="NVIDIA GeForce RTX 3090", vendor="nvidia", backend="rpc", total_bytes=vram_gib * GiB,
                free_bytes=vram_gib * GiB - GiB // 2, endpoint="192.0.2.10:50052", link=link)
    hw.gpus = [w, *hw.gpus]
    return hw


def test_rpc_worker_joins_the_split_and_the_network_costs_speed():
    spec = _spec("llama-3.3-70b-instruct")
    fast = {"latency_s": 50e-6, "bandwidth_gbps": 1.2, "source": "test"}  # 10 GbE
    slow = {"latency_s": 2e-3, "bandwidth_gbps": 0.01, "source": "test"}  # congested Wi-Fi
    p_fast = plan_for_run(spec, _with_worker(get_preset("nvidia-24gb"), 24, fast), n_ctx=8192, kv_type="f16")
    p_slow = plan_for_run(spec, _with_worker(get_preset("nvidia-24gb"), 24, slow), n_ctx=8192, kv_type="f16")
    for p in (p_fast, p_slow):
        assert p.fits and p.split_mode == "layer"
        assert p.devices[0]["backend"] == "rpc" and p.devices[0]["endpoint"] == "192.0.2.10:50052"
        assert p.devices[0]["overhead_bytes"] == 0  # the worker's CUDA context is the worker's business
        assert p.devices[0]["n_layers"] > 0 and p.devices[1]["output"]  # RPC first, as llama.cpp orders them
    # two network hops per token (this host's token embeddings → the worker → the local GPU), 32 KiB each
    dt = 1 / p_slow.decode_tok_s - 1 / p_fast.decode_tok_s
    expect = L.hop_s(L.Link("", 2e-3, 0.01, L.RPC_ROUND_TRIPS), 32768) - L.hop_s(L.Link("", 50e-6, 1.2, 2), 32768)
    assert dt == pytest.approx(2 * expect, rel=1e-6)
    # a worker alone (this host has no GPU): the logits come back too, n_vocab × 4 bytes per token
    cpu = get_preset("laptop-16gb")
    alone = plan_for_run(_spec("qwen3-32b"), _with_worker(cpu, 24, slow), n_ctx=4096, kv_type="f16")
    assert alone.fits and alone.devices[0]["backend"] == "rpc" and alone.n_gpu_layers == 65
    lk = L.Link("", 2e-3, 0.01, L.RPC_ROUND_TRIPS)
    net_s = L.hop_s(lk, 5120 * 4) + L.hop_s(lk, 151936 * 4)
    assert net_s > 0.06 and 1 / alone.decode_tok_s > net_s  # 60 ms of network per token at 10 MB/s


def test_split_slower_than_a_smaller_quant_on_one_machine_is_said():
    e = get_entry("qwen3-32b")
    cands = [Candidate(q, spec_from_entry(e, q), "catalog") for q in ("Q8_0", "Q6_K", "Q4_K_M")]
    slow = {"latency_s": 5e-3, "bandwidth_gbps": 0.005, "source": "test"}
    hw = _with_worker(get_preset("nvidia-24gb"), 24, slow)
    chosen, plans = choose(cands, hw, goal="quality", n_ctx=4096)
    assert chosen.quant == "Q8_0" and chosen.devices[0]["backend"] == "rpc"
    why = next(r for r in chosen.reasons if "on one machine" in r)
    assert "Q4_K_M on this machine alone" in why and "slower than" in why
    # with no worker nothing is compared
    local, _ = choose(cands, get_preset("nvidia-24gb"), goal="quality", n_ctx=4096)
    assert not any("on one machine" in r for r in local.reasons)
