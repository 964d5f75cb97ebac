"""Backend choice and the MLX memory guardrail, with injected hardware profiles.

Lines that only a Mac runs (tested here with injected profiles and a fake ``mx``):
choice.prepare_mlx_memory's ``probe_hardware()`` call, set_wired_limit's ``mx.set_wired_limit`` call, and
the Metal fields of ``mx.device_info()`` (memory_size, max_recommended_working_set_size)."""

from __future__ import annotations

import types

import pytest

from localrun.backends import choice
from localrun.errors import ConfigError, InsufficientMemoryError
from localrun.machine.hardware import CpuInfo, GpuInfo, HardwareProfile, apple_working_set_bytes
from localrun.model.gguf_info import read_gguf
from localrun.offload.plan import Plan

GiB = 1 << 30


def mac(ram_gib: int, wired_limit_mb: int | None = None) -> HardwareProfile:
    ram = ram_gib * GiB
    ws = apple_working_set_bytes(ram, wired_limit_mb)
    return HardwareProfile(cpu=CpuInfo("Apple M2", "arm64", 8, 8, ["NEON"]), ram_total_bytes=ram,
                           ram_available_bytes=ram * 3 // 4, os="Darwin",
                           gpus=[GpuInfo(name="Apple M2", vendor="apple", backend="metal", total_bytes=ram,
                                         free_bytes=ram * 3 // 4, unified=True, working_set_bytes=ws)])


def linux() -> HardwareProfile:
    return HardwareProfile(cpu=CpuInfo("Xeon", "x86_64", 2, 2, ["AVX2"]), ram_total_bytes=16 * GiB,
                           ram_available_bytes=12 * GiB, os="Linux")


def test_apple_silicon_picks_mlx_for_native_gguf_and_llamacpp_for_kquants(smollm_path, gemma_path):
    backend, why = choice.choose_backend(smollm_path, read_gguf(smollm_path), mac(16), None)
    assert backend == "mlx" and "natively" in why
    backend, why = choice.choose_backend(gemma_path, read_gguf(gemma_path), mac(16), "auto")
    assert backend == "llamacpp" and "Q4_K" in why and "Metal" in why


def test_elsewhere_llamacpp_unless_requested(smollm_path):
    spec = read_gguf(smollm_path)
    assert choice.choose_backend(smollm_path, spec, linux(), None)[0] == "llamacpp"
    assert choice.choose_backend(smollm_path, spec, None, None)[0] == "llamacpp"
    backend, why = choice.choose_backend(smollm_path, spec, linux(), "mlx")
    assert backend == "mlx" and "mlx[cpu]" in why
    assert choice.choose_backend(smollm_path, spec, mac(16), "llamacpp")[0] == "llamacpp"
    with pytest.raises(ConfigError):
        choice.choose_backend(smollm_path, spec, linux(), "tensorrt")


def test_mlx_folder_goes_to_mlx_and_cannot_go_to_llamacpp(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    from localrun.store.resolve import is_mlx_folder

    assert is_mlx_folder(tmp_path)
    assert choice.choose_backend(tmp_path, None, linux(), None)[0] == "mlx"
    with pytest.raises(ConfigError):
        choice.choose_backend(tmp_path, None, mac(16), "llamacpp")


def test_guardrail_refuses_with_numbers_on_a_small_mac(deepseek_header_path):
    spec = read_gguf(deepseek_header_path)  # a 7B Q4_K_M header
    plan = Plan(backend="mlx", n_ctx=32768)
    with pytest.raises(InsufficientMemoryError) as e:
        choice.check_mlx_memory(plan, spec, mac(8))
    err = e.value
    assert err.needed_bytes > err.available_bytes == apple_working_set_bytes(8 * GiB)
    assert "GiB" in err.message and "working-set" in err.message and "32768 tokens" in err.message
    # fits on a 64 GiB Mac: the wired limit is the working-set budget
    assert choice.check_mlx_memory(plan, spec, mac(64)) == apple_working_set_bytes(64 * GiB)
    # an explicit iogpu.wired_limit_mb raises the budget of the small Mac, but not enough for 32k context
    with pytest.raises(InsufficientMemoryError):
        choice.check_mlx_memory(plan, spec, mac(8, wired_limit_mb=6000))
    # --force loads anyway; off Apple Silicon there is no Metal budget to check
    assert choice.check_mlx_memory(plan, spec, mac(8), force=True) == apple_working_set_bytes(8 * GiB)
    assert choice.check_mlx_memory(plan, spec, linux()) is None


def test_kv_estimate_counts_sliding_window_layers(gemma_path):
    spec = read_gguf(gemma_path)
    from localrun.offload.memory import mlx_kv_bytes

    full = mlx_kv_bytes(spec, 32768)
    # 18 layers, 1 KV head, d=256: 3 global layers hold 32768 tokens, 15 SWA layers hold 512
    assert full == (3 * 32768 + 15 * 512) * 1 * 512 * 2
    assert choice.mlx_memory_need(Plan(backend="mlx", n_ctx=32768), spec)["kv_bytes"] == full  # one formula


def test_prepare_sets_wired_limit_only_with_metal(smollm_path, monkeypatch):
    spec = read_gguf(smollm_path)
    calls = []
    fake_mx = types.SimpleNamespace(metal=types.SimpleNamespace(is_available=lambda: True),
                                    set_wired_limit=lambda n: calls.append(n))
    assert choice.set_wired_limit(5 * GiB, mx=fake_mx) and calls == [5 * GiB]  # the Mac-only line
    pytest.importorskip("mlx.core")
    assert choice.set_wired_limit(5 * GiB) is False  # mlx[cpu]: no Metal, nothing set
    seen = []
    monkeypatch.setattr(choice, "set_wired_limit", lambda n, mx=None: seen.append(n) or True)
    limit = choice.prepare_mlx_memory(Plan(backend="mlx", n_ctx=2048), spec, mac(16))
    assert limit == seen[0] == apple_working_set_bytes(16 * GiB)
    assert choice.prepare_mlx_memory(Plan(backend="mlx", n_ctx=2048), spec, linux()) is None


@pytest.mark.model  # loads MLX (mlx.core) for its device info
def test_metal_device_info_to_gpu():
    # what mx.device_info() returns on an M2 (Mac only); the CPU build has no memory fields
    info = {"device_name": "Apple M2", "architecture": "applegpu_g14g", "memory_size": 16 * GiB,
            "max_recommended_working_set_size": 11_453_251_584}
    gpu = choice.gpu_from_mlx(info)
    assert gpu.unified and gpu.vendor == "apple" and gpu.working_set_bytes == 11_453_251_584
    pytest.importorskip("mlx.core")
    real = choice.metal_device_info()
    assert "architecture" in real
    import mlx.core as mx

    if not mx.metal.is_available():
        assert choice.gpu_from_mlx(real) is None


def test_mlx_load_uses_the_callers_hardware_probe(smollm_path, monkeypatch):
    """loading.load_model probes once and hands the profile to the MLX engine's guardrail (it probed again)."""
    pytest.importorskip("mlx.core")
    import localrun.machine.hardware as hardware
    from localrun.loading import load_model

    calls = []
    real = hardware.probe_hardware
    monkeypatch.setattr(hardware, "probe_hardware", lambda *a, **k: calls.append(1) or real(*a, **k))
    seen = []
    real_prepare = choice.prepare_mlx_memory
    monkeypatch.setattr(choice, "prepare_mlx_memory",
                        lambda plan, spec, hw, **k: seen.append(hw) or real_prepare(plan, spec, hw, **k))
    loaded = load_model(str(smollm_path), backend="mlx", n_ctx=256)
    try:
        assert len(calls) == 1 and seen == [loaded.hardware]
    finally:
        loaded.engine.close()
