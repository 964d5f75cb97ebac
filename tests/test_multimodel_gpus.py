"""Residency per GPU (issue 16): each card has its own VRAM budget, a model's need is counted on the cards its
plan uses (Plan.devices), and a model that fits on the emptier card goes there instead of evicting. The real
planner on injected machines (presets 2x24gb, 24+12gb) and synthetic catalog specs (no file holds a 34 GB
model here); the engines are scripted (tests/fakes.py), since no model loads on a GPU on this machine."""

from __future__ import annotations

import asyncio

import httpx
from fakes import catalog_plan_load, scripted_loader

from localrun.config import Settings
from localrun.machine.presets import get_preset
from localrun.model.catalog import get_entry
from localrun.model.synthetic import spec_from_entry
from localrun.offload.search import plan_for_run
from localrun.server.app import create_app
from localrun.server.budget import Budget, Need, vram_by_device
from localrun.server.loader import budget_hardware
from localrun.server.metrics import ServerMetrics
from localrun.server.models import ModelRegistry
from localrun.server.runtime import ServeOptions

GiB = 1 << 30
MODELS = {"a.gguf": ("qwen3-14b", "Q8_0"), "b.gguf": ("gemma-3-12b-it", "Q8_0"), "c.gguf": ("qwen3-32b", "Q8_0")}


# a file stands for a catalog model: the real planner on its synthetic spec (tests/fakes.py)
synthetic_plan_load = catalog_plan_load(lambda p: MODELS[p.name])


def files(tmp_path) -> dict[str, str]:
    out = {}
    for n in MODELS:
        (tmp_path / n).write_bytes(b"GGUF")
        out[n[0]] = str((tmp_path / n).resolve())
    return out


def test_a_plans_vram_is_counted_on_the_cards_it_uses():
    hw, budget = budget_hardware(get_preset("2x24gb"))
    assert budget.vram_by_gpu == {0: hw.gpus[0].free_bytes, 1: hw.gpus[1].free_bytes}
    one = plan_for_run(spec_from_entry(get_entry("qwen3-14b"), "Q8_0"), hw, n_ctx=8192)
    assert one.split_mode == "none"  # one card holds it
    assert vram_by_device(one, hw) == {one.main_gpu: one.vram_bytes}
    split = plan_for_run(spec_from_entry(get_entry("qwen3-32b"), "Q8_0"), hw, n_ctx=8192)
    per = vram_by_device(split, hw)
    assert split.split_mode == "layer" and set(per) == {0, 1} and sum(per.values()) == split.vram_bytes
    assert per == {d["index"]: d["total_bytes"] for d in split.devices}
    hw2, budget2 = budget_hardware(get_preset("24+12gb"), max_vram_bytes=16 * GiB)  # --max-vram caps each card
    assert budget2.vram_by_gpu == {0: 16 * GiB, 1: hw2.gpus[1].free_bytes} and hw2.gpus[0].free_bytes == 16 * GiB


def test_budget_per_gpu():
    b = Budget(None, None, None, {0: 10 * GiB, 1: 10 * GiB})
    on0, on1 = Need(0, 0, {0: 8 * GiB}), Need(0, 0, {1: 8 * GiB})
    assert b.fits(on0 + on1, 2)  # 16 GiB in all, 8 on each card: the old GPU-0-only count said no
    assert not b.fits(on0 + on0, 2)
    assert not b.fits(Need(0, 0, {2: GiB}), 1)  # a card the budget does not know
    assert (on0 + on1 - on0).vram_by_gpu == {1: 8 * GiB}
    assert Need(5).vram_by_gpu == {0: 5}  # bytes without devices: GPU 0, as before
    assert Budget(None, 10).fits(Need(0, 0, {0: 6, 1: 4}), 1)  # no per-card budget: the total


def test_a_model_goes_to_the_emptier_card_and_a_split_evicts_both(tmp_path):
    f = files(tmp_path)
    hw, budget = budget_hardware(get_preset("2x24gb"))
    settings = Settings(home=tmp_path, models_dir=tmp_path / "models")
    loader = scripted_loader(settings, hw, n_ctx=8192, plan_fn=synthetic_plan_load)
    opts = ServeOptions()
    reg = ModelRegistry(settings, opts, ServerMetrics(), loader=loader, budget=budget, load_wait_s=5.0)
    app = create_app(None, settings, opts, registry=reg)

    def gen(http, model):
        return http.post("/api/generate", json={"model": model, "prompt": "hi", "stream": False})

    def on(key) -> dict[int, int]:
        return reg.residents[key].need.vram_by_gpu

    async def body(http):
        assert (await gen(http, f["a"])).status_code == 200
        (gpu_a,) = on(f["a"])  # 15.7 GB: one card
        alone_b = loader.plan(f["b"])
        assert set(alone_b.need.vram_by_gpu) == {gpu_a}  # alone, b would pick the same card (13.4 GB more)
        assert (await gen(http, f["b"])).status_code == 200
        assert set(reg.residents) == {f["a"], f["b"]}  # no eviction: b went to the other card
        assert set(on(f["b"])) == {1 - gpu_a} and reg.residents[f["b"]].planned.plan.main_gpu == 1 - gpu_a
        ps = {m["localrun"]["path"]: m for m in (await http.get("/api/ps")).json()["models"]}
        assert ps[f["b"]]["size_vram"] == reg.residents[f["b"]].need.vram_bytes
        r = await gen(http, f["c"])  # 34.7 GB split over both cards: neither keeps room next to a or b
        assert r.status_code == 200
        assert set(reg.residents) == {f["c"]} and set(on(f["c"])) == {0, 1}
        text = (await http.get("/metrics")).text
        assert "localrun_model_evictions_total" in text

    async def main():
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=10) as http:
                await body(http)
        finally:
            reg.close()

    asyncio.run(main())
