"""`localrun fit` and the planner on the real header, presets, synthetic GGUFs, and import isolation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from localrun.catalog import get_entry
from localrun.gguf_info import read_gguf
from localrun.offload.plan import check_fits, plan_for_run, simple_plan
from localrun.offload.synthetic import requantize, spec_from_entry
from localrun.presets import get_preset, preset_names
from localrun.errors import InsufficientMemoryError, ConfigError


def test_7b_header_on_12gb_gpu(deepseek_header_path):
    spec = read_gguf(deepseek_header_path)
    assert spec.truncated
    hw = get_preset("nvidia-12gb")
    p = plan_for_run(spec, hw, n_ctx=8192)
    assert p.fits and p.n_gpu_layers == spec.n_layer + 1  # 4.4 GiB Q4_K_M + 0.4 GiB KV: all on the GPU
    assert any("all 28 layers" in r for r in p.reasons)
    # 128k context in f16 needs 7 GiB of KV: only some layers fit, and the reasons say why
    p = plan_for_run(spec, hw, n_ctx=131072, kv_type="f16")
    assert p.fits and 5 < p.n_gpu_layers < spec.n_layer + 1
    assert p.vram_bytes <= p.vram_budget_bytes
    assert any("layers on the GPU" in r for r in p.reasons) and any("one more layer" in r for r in p.reasons)
    # letting the planner pick the KV type moves to q8_0 to keep more layers on the GPU
    auto = plan_for_run(spec, hw, n_ctx=131072)
    assert auto.n_gpu_layers >= p.n_gpu_layers and auto.kv_type in ("f16", "q8_0")


def test_7b_header_on_16gb_laptop(deepseek_header_path):
    spec = read_gguf(deepseek_header_path)
    p = plan_for_run(spec, get_preset("laptop-16gb"), n_ctx=8192)
    assert p.fits and p.n_gpu_layers == 0 and p.vram_bytes == 0
    assert p.page_cache_bytes == spec.tensor_bytes and p.disk_backed_bytes == 0
    assert 2 < p.decode_tok_s < 15  # 4.4 GiB read per token from dual-channel DDR4
    assert p.reasons[0].startswith("CPU only")
    # 8 GB of RAM: the weights no longer fit and are paged from disk, and the plan says so
    small = get_preset("laptop-16gb")
    small.ram_available_bytes = 3 << 30
    q = plan_for_run(spec, small, n_ctx=4096)
    assert q.disk_backed_bytes > 0 and q.decode_tok_s < p.decode_tok_s / 3
    assert any("disk-backed" in r for r in q.reasons)


def test_check_fits_refuses_with_numbers(deepseek_header_path):
    spec = read_gguf(deepseek_header_path)
    hw = get_preset("laptop-16gb")
    hw.ram_available_bytes = 1 << 30
    p = plan_for_run(spec, hw, n_ctx=131072, kv_type="f16")
    assert not p.fits
    with pytest.raises(InsufficientMemoryError) as ei:
        check_fits(p)
    assert ei.value.needed_bytes > ei.value.available_bytes and "--force" in ei.value.hint
    check_fits(p, force=True)
    assert simple_plan(spec, hw).n_gpu_layers == 0


def test_apple_working_set_budget():
    e = get_entry("deepseek-r1-distill-qwen-7b")
    spec = spec_from_entry(e, "Q8_0")
    p = plan_for_run(spec, get_preset("mac-16gb"), n_ctx=4096)
    assert p.vram_budget_bytes < (16 << 30) * 2 // 3  # 2/3 of RAM minus margin
    assert p.fits
    assert all(get_preset(n).label for n in preset_names())
    with pytest.raises(ConfigError):
        get_preset("nope")


def test_synthetic_matches_real_quant_mix(deepseek_header_path, gemma_path):
    real = read_gguf(deepseek_header_path)
    syn = spec_from_entry(get_entry("deepseek-r1-distill-qwen-7b"), "Q4_K_M")
    assert abs(syn.tensor_bytes / real.tensor_bytes - 1) < 0.001
    assert syn.bytes_by_type["Q6_K"] == real.bytes_by_type["Q6_K"]  # output + attn_v/ffn_down bumps
    assert requantize(real, "Q4_K_M").tensor_bytes == real.tensor_bytes
    g = read_gguf(gemma_path)
    assert requantize(g, "Q4_K_M").tensor_bytes == g.tensor_bytes  # incl. Q5_0/Q8_0 fallbacks


def _fit(*args):
    return subprocess.run([sys.executable, "-m", "localrun", "fit", *args], capture_output=True, text=True,
                          timeout=120)


def test_fit_json_catalog_and_exit_codes(deepseek_header_path, tmp_path):
    r = _fit("deepseek-r1-distill-qwen-7b", "--preset", "nvidia-8gb", "--ctx", "16384", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for k in ("model", "backend", "quant", "n_ctx", "n_gpu_layers", "n_layers", "kv_type", "kv_cache_bytes",
              "weights_bytes", "vram_bytes", "ram_bytes", "disk_backed_bytes", "prefill_tok_s", "decode_tok_s",
              "fits", "reasons"):
        assert k in d
    assert d["fits"] is True and d["n_ctx"] == 16384 and isinstance(d["reasons"], list)
    assert {a["quant"] for a in d["alternatives"]} >= {"Q4_K_M", "Q8_0"}
    r = _fit(str(deepseek_header_path), "--vram", "2GiB", "--ram", "2GiB", "--ctx", "131072", "--kv-type", "f16",
             "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["fits"] is False
    r = _fit("--preset", "mac-36gb", "--goal", "context")
    assert r.returncode == 0 and "alternatives" in r.stdout
    r = _fit("--kv-type", "q3")
    assert r.returncode == 9 and "KV-cache type" in r.stderr


def test_fit_never_imports_backends():
    code = ("import sys; from localrun.cli import main\n"
            "try:\n    main(['fit', '--json'])\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('llama_cpp', 'mlx', 'mlx_lm', 'numpy')]\n"
            "print('BAD', bad, file=sys.stderr); sys.exit(3 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_hw_measure_is_stored_and_used(smollm_path):
    from localrun.commands.hw import measure_llamacpp_cpu
    from localrun.measurements import get_measurement

    m = measure_llamacpp_cpu(n_prompt=32, n_decode=8)
    assert m["decode_bandwidth_gbps"] > 0 and m["prefill_gflops"] > 0
    assert get_measurement("llamacpp", "cpu")["source"] == "hw --measure"
    p = plan_for_run(read_gguf(smollm_path), get_preset("laptop-16gb"))
    assert p.speed_source.startswith("measured") and any("measurement" in r for r in p.reasons)
