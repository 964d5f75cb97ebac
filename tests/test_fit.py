"""`localrun fit` and the planner on the real header, presets, synthetic GGUFs, and import isolation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import localrun_inprocess

from localrun.errors import ConfigError, InsufficientMemoryError
from localrun.machine.presets import get_preset, preset_names
from localrun.model.catalog import get_entry
from localrun.model.gguf_info import read_gguf
from localrun.model.synthetic import requantize, spec_from_entry
from localrun.offload.plan import check_fits, simple_plan
from localrun.offload.search import plan_for_run


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
    return localrun_inprocess("fit", *args)


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


class _Meter:
    """A LoadMeter stand-in reporting a given load (this shared box is never reliably idle or busy)."""

    def __init__(self, busy: bool):
        self.busy = busy

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def result(self):
        return {"steal_frac": 0.3 if self.busy else 0.0, "others_cpu_frac": 0.6 if self.busy else 0.0,
                "busy": self.busy}


def test_hw_measure_is_stored_and_used(smollm_path):
    from localrun.bench.calibrate import decode_bytes_per_token
    from localrun.commands.hw import measure_llamacpp_cpu
    from localrun.errors import LocalrunError
    from localrun.machine.measurements import get_measurement, planner_measurement

    with pytest.raises(LocalrunError) as ei:  # a busy machine: nothing stored, and the numbers said
        measure_llamacpp_cpu(n_prompt=32, n_decode=8, meter=_Meter(busy=True))
    assert "busy" in str(ei.value) and "60%" in str(ei.value) and get_measurement("llamacpp", "cpu") is None
    m = measure_llamacpp_cpu(n_prompt=32, n_decode=8, meter=_Meter(busy=False))
    assert m["decode_bandwidth_gbps"] > 0 and m["prefill_gflops"] > 0 and m["load"]["others_cpu_frac"] == 0.0
    assert get_measurement("llamacpp", "cpu")["source"] == "hw --measure"
    spec = read_gguf(smollm_path)
    p = plan_for_run(spec, get_preset("laptop-16gb"), measurement=planner_measurement())
    assert p.speed_source.startswith("measured") and any("measurement" in r for r in p.reasons)
    # the stored bandwidth means what bench --calibrate's means: same bytes per token, so re-planning the
    # measured configuration (1024 tokens, CPU) predicts the measured rate back
    again = plan_for_run(spec, None, n_ctx=1024, measurement=planner_measurement())
    bpt = decode_bytes_per_token(spec, again)
    assert again.decode_tok_s == pytest.approx(m["decode_bandwidth_gbps"] * 1e9 / bpt, rel=0.01)
    assert plan_for_run(spec, None, n_ctx=1024).speed_source == "table"  # the planner reads no file itself


# ------------------------------------------------------------------------------------------------
# the context the planner chooses (issue 19.4)
# ------------------------------------------------------------------------------------------------

def _cpu_box(ram_gib: float):
    """A CPU-only machine like this one (2 cores) with ``ram_gib`` available."""
    hw = get_preset("laptop-16gb")
    hw.cpu.physical_cores = 2
    hw.ram_total_bytes = int(max(ram_gib + 2, 4) * (1 << 30))
    hw.ram_available_bytes = int(ram_gib * (1 << 30))
    return hw


def test_default_context_is_the_training_context_when_it_fits(smollm_path, gemma_path):
    g = plan_for_run(read_gguf(gemma_path), _cpu_box(20))
    assert g.n_ctx == 32768 and g.n_ctx_requested is None  # was min(4096, trained): a 5,000-token prompt refused
    assert any(r.startswith("context 32768 tokens") and "training context" in r for r in g.reasons)
    s = plan_for_run(read_gguf(smollm_path), _cpu_box(20), n_parallel=4)
    assert s.n_ctx == 8192 and s.n_parallel == 4
    assert plan_for_run(read_gguf(gemma_path), _cpu_box(20), n_ctx=2048).n_ctx == 2048  # --ctx is kept


def test_default_context_caps_and_small_machines():
    e = get_entry("llama-3.1-8b-instruct")  # trained for 131072, 128 KiB of f16 KV per token
    spec = spec_from_entry(e, "Q4_K_M")
    cpu = plan_for_run(spec, _cpu_box(60))
    assert cpu.n_ctx == 32768 and any("capped at 32768 of 131072" in r for r in cpu.reasons)
    small = plan_for_run(spec, _cpu_box(7))  # 25% of 7 GiB for the KV cache: 8192 tokens (1 GiB)
    assert small.n_ctx == 8192 and small.kv_cache_bytes <= 0.25 * small.ram_budget_bytes
    assert any("stays within 25%" in r for r in small.reasons)
    tiny = plan_for_run(spec, _cpu_box(5.5))
    assert tiny.n_ctx == 4096 and any("a longer one would cost" in r for r in tiny.reasons)
    gpu = plan_for_run(spec, get_preset("nvidia-24gb"))  # the longer context never costs GPU layers
    at_floor = plan_for_run(spec, get_preset("nvidia-24gb"), n_ctx=4096)
    assert gpu.n_ctx > 4096 and gpu.n_gpu_layers == at_floor.n_gpu_layers and gpu.fits
    assert gpu.kv_cache_bytes <= 0.25 * gpu.vram_budget_bytes


# ------------------------------------------------------------------------------------------------
# what the plan must say: flash attention, context beyond training, rounding, incomplete files
# ------------------------------------------------------------------------------------------------

def test_quantized_v_cache_without_flash_attention_is_refused(smollm_path):
    spec = read_gguf(smollm_path)
    with pytest.raises(ConfigError) as ei:
        plan_for_run(spec, None, kv_type="q8_0", flash_attn=False)
    assert "flash attention" in str(ei.value) and "--kv-type f16" in ei.value.hint
    # left to the planner with flash attention off, the KV type is never a quantized one
    tight = _cpu_box(1.5)  # f16 KV (1.4 GiB) + its attention scores do not fit at 65536 tokens; q8_0 does
    off = plan_for_run(spec, tight, flash_attn=False, n_ctx=65536)
    assert off.kv_type == "f16" and not off.fits
    assert plan_for_run(spec, tight, n_ctx=65536).kv_type == "q8_0"  # (with it allowed, q8_0 is chosen)
    p = plan_for_run(spec, None, kv_type="q8_0")  # AUTO on the CPU: turned on, and said
    assert p.flash_attn is True and any("flash attention on" in r for r in p.reasons)
    r = _fit(str(smollm_path), "--kv-type", "q8_0", "--no-flash-attn")
    assert r.returncode == 9 and "flash attention" in r.stderr and "Traceback" not in r.stderr


def test_context_above_training_and_rounding_are_said(smollm_path):
    spec = read_gguf(smollm_path)
    p = plan_for_run(spec, None, n_ctx=999999)
    w = " ".join(p.warnings)
    assert "training context (8192 tokens)" in w and "122" in w and "--ctx 8192" in w  # 999999 / 8192 = 122.07
    assert plan_for_run(spec, None, n_ctx=8192).warnings == []
    q = plan_for_run(spec, None, n_ctx=128)
    assert q.n_ctx == 256 and any("128 rounded up to 256" in x for x in q.warnings)
    d = json.loads(_fit(str(smollm_path), "--ctx", "999999", "--json").stdout)
    assert any("rope" in x.lower() for x in d["warnings"])


def test_truncated_file_is_said_by_fit_and_ls(gemma_path, tmp_path, isolated_home):
    data = gemma_path.read_bytes()
    cut = isolated_home / "models" / "cut" / "gemma-cut.gguf"
    cut.parent.mkdir(parents=True)
    cut.write_bytes(data[: len(data) // 2])
    r = _fit(str(cut), "--json")
    d = json.loads(r.stdout)
    assert d["weights_complete"] is False and any("incomplete" in w for w in d["warnings"])
    assert json.loads(_fit(str(gemma_path), "--json").stdout)["weights_complete"] is True
    r = _fit(str(cut))
    assert "warning:" in r.stdout and "incomplete" in r.stdout
    from typer.testing import CliRunner

    from localrun.cli import app

    rows = json.loads(CliRunner().invoke(app, ["ls", "--json", "--no-external"]).stdout)
    row = next(m for m in rows if m["path"].endswith("gemma-cut.gguf"))
    assert row["complete"] is False and row["quant"] == "Q4_K_M" and "incomplete" in row["problem"]
    out = CliRunner().invoke(app, ["ls", "--no-external"], env={"COLUMNS": "300"}).stdout
    assert "incomplete: 50%" in out


def test_chat_and_serve_load_the_chosen_context(gemma_path):
    """load_model (chat/serve/bench) without --ctx gets Gemma-3's 32,768-token training context from
    llama.cpp, so a 5,000-token prompt is no longer refused (RSS against the plan: test_memory.py)."""
    from localrun.loading import load_model

    ld = load_model(str(gemma_path))
    try:
        assert ld.engine.n_ctx == ld.plan.n_ctx == 32768 > 5000
        assert any(r.startswith("context 32768 tokens") for r in ld.plan.reasons)
    finally:
        ld.engine.close()


def test_fit_counts_a_catalog_entrys_projector_and_its_image(isolated_home, capsys):
    """gemma-3-4b-it from the catalog: the projector's file size, one 896² image's compute buffer (flash attention
    on: the ViT's FFN peak, offload/vision.py) and its 256 tokens; --no-mmproj-offload moves both to RAM."""
    from localrun.commands.fit import run_fit
    from localrun.offload.vision import vision_from_catalog

    e = get_entry("gemma-3-4b-it")
    v = vision_from_catalog(e.mmproj, e.n_embd)
    # 4096 patches × (FFN 4304 + 2 × 1152) × 4 B + the F16 copy of the 1152 × 2560 projection
    assert v.compute_bytes() == 4096 * (4304 + 2 * 1152) * 4 + 1152 * 2560 * 2
    assert v.compute_bytes(flash_attn=False) == 16 * 4096**2 * 4 + 6 * 4096 * 1152 * 4  # the scores: 1 GiB

    def fit(*flags):
        assert run_fit("gemma-3-4b-it", preset="nvidia-24gb", json_out=True, **dict(flags)) == 0
        return json.loads(capsys.readouterr().out)

    gpu, ram = fit(), fit(("no_mmproj_offload", True))
    assert gpu["quant"] == ram["quant"] and gpu["n_gpu_layers"] == ram["n_gpu_layers"]
    need = 851251104 + v.compute_bytes()
    assert gpu["mmproj_bytes"] == 851251104 and gpu["mmproj_on_gpu"] and not ram["mmproj_on_gpu"]
    assert gpu["vision"] == {"projector": "gemma3", "image_size": 896, "image_tokens": 256,
                             "compute_bytes": v.compute_bytes(),
                             "source": "the catalog: ggml-org/gemma-3-4b-it-GGUF/mmproj-model-f16.gguf"}
    assert gpu["vram_bytes"] - ram["vram_bytes"] == need == ram["ram_bytes"] - gpu["ram_bytes"]
    assert any("256 tokens" in r for r in gpu["reasons"]) and any("(--no-mmproj-offload)" in r for r in ram["reasons"])
    # a text model's plan has no vision facts at all (its JSON is what it was before projectors)
    assert run_fit("qwen3-8b", preset="nvidia-24gb", json_out=True) == 0
    assert "vision" not in json.loads(capsys.readouterr().out)


def test_fit_says_qwen25_vl_images_are_refused(isolated_home, capsys):
    from localrun.commands.fit import run_fit

    assert run_fit("qwen2.5-vl-7b-instruct", preset="nvidia-24gb", json_out=True) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["mmproj_bytes"] == 0 and "vision" not in plan  # a text-only plan …
    warning = next(w for w in plan["warnings"] if w.startswith("images: "))  # … that says why
    assert "M-RoPE" in warning and "mmproj-Qwen2.5-VL-7B-Instruct-Q8_0.gguf" in warning and "text only" in warning
