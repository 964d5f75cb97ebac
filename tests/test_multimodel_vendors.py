"""Residency on every vendor's GPUs: the server's budget and the planner see the same device list, so a second
model lands on the card that has room whatever its vendor (a mixed NVIDIA + AMD box), one AMD card evicts
least recently used first, and a unified-memory machine (Strix Halo's GTT pool, a 780M laptop, DGX Spark's
GB10) counts a model once, in the one pool its GPU and the RAM share. The real planner and residency code on
the presets (localrun/machine/presets.py) with synthetic catalog specs (no 40 GB file here); only the engines
are scripted (tests/fakes.py), since no model loads on these GPUs on this machine."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest
from fakes import catalog_plan_load, scripted_loader

from localrun.config import Settings
from localrun.machine.presets import get_preset
from localrun.offload import memory as M
from localrun.server.app import create_app
from localrun.server.budget import Budget, Need
from localrun.server.loader import PlannerLoader, budget_hardware
from localrun.server.metrics import ServerMetrics
from localrun.server.models import ModelRegistry
from localrun.server.runtime import ServeOptions

GiB = 1 << 30
# a file name stands for a catalog model: "<catalog name>@<quantization>.gguf"
QWEN14, GEMMA12 = "qwen3-14b@Q8_0", "gemma-3-12b-it@Q8_0"  # 15.4 GB, 13.1 GB at 8k: one card each
QWEN32_Q4, MISTRAL24 = "qwen3-32b@Q4_K_M", "mistral-small-24b-instruct-2501@Q4_K_M"  # 20.3 GB; 14.5 GB
QWEN8_Q4 = "qwen3-8b@Q4_K_M"  # 5.8 GB


# a file stands for a catalog model: the real planner on its synthetic spec (tests/fakes.py)
synthetic_plan_load = catalog_plan_load(lambda p: p.name.removesuffix(".gguf").split("@"))


def mixed_box(nvidia_backend: str):
    """The ``nvidia-24gb+amd-16gb`` preset (RTX 4090 + RX 7800 XT), its NVIDIA card over ``nvidia_backend``:
    "vulkan" as the preset has it (one Vulkan build sees both), "cuda" for a build with CUDA and Vulkan
    (CUDA's devices come first in ggml's registry, as GPU 0 here)."""
    hw = get_preset("nvidia-24gb+amd-16gb")
    assert [g.vendor for g in hw.gpus] == ["nvidia", "amd"] and hw.gpus[1].backend == "vulkan"
    return replace(hw, gpus=[replace(hw.gpus[0], backend=nvidia_backend), hw.gpus[1]])


class Server:
    """A registry on ``hw`` (``budget_hardware``'s budget) behind the real app, driven over HTTP."""

    def __init__(self, tmp_path, hw, names: list[str], **budget_kw) -> None:
        self.files = {}
        for n in names:
            (tmp_path / f"{n}.gguf").write_bytes(b"GGUF")
            self.files[n] = str((tmp_path / f"{n}.gguf").resolve())
        self.hw, self.budget = budget_hardware(hw, **budget_kw)
        settings = Settings(home=tmp_path, models_dir=tmp_path / "models")
        self.loader = scripted_loader(settings, self.hw, n_ctx=8192, plan_fn=synthetic_plan_load)
        opts = ServeOptions()
        self.reg = ModelRegistry(settings, opts, ServerMetrics(), loader=self.loader, budget=self.budget,
                                 load_wait_s=5.0)
        self.app = create_app(None, settings, opts, registry=self.reg)
        self.http: httpx.AsyncClient | None = None

    async def gen(self, name: str) -> None:
        r = await self.http.post("/api/generate", json={"model": self.files[name], "prompt": "hi", "stream": False})
        assert r.status_code == 200, r.text

    def resident(self) -> set[str]:
        back = {v: k for k, v in self.files.items()}
        return {back[k] for k in self.reg.residents}

    def on(self, name: str) -> dict[int, int]:
        return self.reg.residents[self.files[name]].need.vram_by_gpu

    def plan(self, name: str):
        return self.reg.residents[self.files[name]].planned.plan

    def run(self, body) -> None:
        async def main():
            transport = httpx.ASGITransport(app=self.app)
            try:
                async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=10) as http:
                    self.http = http
                    await body()
            finally:
                self.reg.close()

        asyncio.run(main())


# ---------------------------------------------------------------------------------------------- a mixed box
@pytest.mark.parametrize("nvidia_backend", ["vulkan", "cuda"])
def test_mixed_box_second_model_lands_on_the_amd_card(tmp_path, nvidia_backend):
    s = Server(tmp_path, mixed_box(nvidia_backend), [QWEN14, GEMMA12])
    assert s.budget.vram_by_gpu == {0: s.hw.gpus[0].free_bytes, 1: s.hw.gpus[1].free_bytes}
    assert s.budget.shared == ()  # dedicated VRAM on both: the RAM is its own budget

    async def body():
        await s.gen(QWEN14)
        assert s.on(QWEN14).keys() == {0}  # the 4090: the fastest card that holds it alone
        assert set(s.loader.plan(s.files[GEMMA12]).need.vram_by_gpu) == {0}  # alone, gemma would pick it too
        await s.gen(GEMMA12)
        assert s.resident() == {QWEN14, GEMMA12}  # no eviction: it went to the Radeon, next to qwen
        p = s.plan(GEMMA12)
        assert s.on(GEMMA12).keys() == {1} and (p.split_mode, p.main_gpu) == ("none", 1)
        (dev,) = p.devices
        assert dev["backend"] == "vulkan" and dev["name"] == "AMD Radeon RX 7800 XT"
        assert dev["overhead_bytes"] == 0  # no CUDA context on the Vulkan card
        cuda = s.plan(QWEN14).devices[0]["overhead_bytes"]
        assert cuda == (M.CUDA_CONTEXT_VRAM_BYTES if nvidia_backend == "cuda" else 0)
        assert s.budget.fits(s.reg.residency.used(), 2)

    s.run(body)


def test_mixed_box_a_bigger_model_replaces_the_least_recently_used_and_splits(tmp_path):
    """qwen3-32b Q4 (20 GB) fits the 4090 alone, where qwen3-14b (used last) is. The Radeon's gemma, least
    recently used, goes instead, and qwen3-32b is split over the Radeon and what the 4090 has left (all its
    layers on the GPUs, as alone): a CUDA + Vulkan layer split, each card's share on its own budget."""
    s = Server(tmp_path, mixed_box("cuda"), [QWEN14, GEMMA12, QWEN32_Q4])

    async def body():
        await s.gen(QWEN14)
        await s.gen(GEMMA12)  # the Radeon
        await s.gen(QWEN14)  # qwen (4090) used last: gemma (Radeon) is the least recently used
        assert set(s.loader.plan(s.files[QWEN32_Q4]).need.vram_by_gpu) == {0}  # alone: the 4090
        await s.gen(QWEN32_Q4)
        assert s.resident() == {QWEN14, QWEN32_Q4}
        p = s.plan(QWEN32_Q4)
        assert p.split_mode == "layer" and s.on(QWEN32_Q4).keys() == {0, 1}
        assert p.n_gpu_layers == p.n_layers + 1
        assert [d["backend"] for d in p.devices] == ["cuda", "vulkan"]
        assert s.budget.fits(s.reg.residency.used(), 2)

    s.run(body)


def test_victims_skip_a_model_that_holds_nothing_where_memory_is_short():
    """The least recently used resident sits on the other card: unloading it frees nothing the new model
    needs, so it stays and the one on the short card goes (pure residency, any vendor)."""
    from localrun.server.residency import Residency, Resident

    res = Residency(Budget(60 * GiB, None, None, {0: 23 * GiB, 1: 15 * GiB}))
    radeon = Resident("r", "r", None, Need(0, GiB, {1: 13 * GiB}), None, 300, last_used=1.0)
    nvidia = Resident("n", "n", None, Need(0, GiB, {0: 15 * GiB}), None, 300, last_used=2.0)
    res.residents.update(r=radeon, n=nvidia)
    assert res.lru(lambda r: True) == [radeon, nvidia]
    assert res.victims(Need(0, GiB, {0: 20 * GiB}), lambda r: True) == [nvidia]
    assert res.victims(Need(0, GiB, {1: 10 * GiB}), lambda r: True) == [radeon]
    assert res.victims(Need(0, GiB, {0: 20 * GiB}), lambda r: r is radeon) is None  # only a busy one helps
    assert res.victims(Need(0, 59 * GiB), lambda r: True) == [radeon]  # RAM is short: LRU first
    assert res.held_without([radeon]) == {0: 15 * GiB}


@pytest.mark.parametrize("lru_first", [GEMMA12, QWEN14])
def test_mixed_box_a_model_for_either_card_replaces_the_least_recently_used(tmp_path, lru_first):
    """Both cards full; Mistral Small 24B Q4 (14.5 GB) fits either card alone, not what they have left. It
    replaces the least recently used model on that model's card, whichever vendor: alone it would pick the
    4090 and evict qwen3-14b there even when gemma on the Radeon is the least recently used."""
    s = Server(tmp_path, mixed_box("cuda"), [QWEN14, GEMMA12, MISTRAL24])
    other = QWEN14 if lru_first == GEMMA12 else GEMMA12

    async def body():
        await s.gen(QWEN14)
        await s.gen(GEMMA12)
        await s.gen(lru_first)
        await s.gen(other)  # lru_first is now the least recently used
        card = next(iter(s.on(lru_first)))
        assert set(s.loader.plan(s.files[MISTRAL24]).need.vram_by_gpu) == {0}  # alone: the 4090
        await s.gen(MISTRAL24)
        assert s.resident() == {other, MISTRAL24}
        assert s.on(MISTRAL24).keys() == {card} and s.plan(MISTRAL24).main_gpu == card

    s.run(body)


# ----------------------------------------------------------------------------------------- an AMD-only box
def test_one_amd_card_holds_what_fits_and_evicts_least_recently_used(tmp_path):
    s = Server(tmp_path, get_preset("amd-24gb"), [QWEN14, GEMMA12, QWEN8_Q4])
    assert s.budget.vram_by_gpu == {0: s.hw.gpus[0].free_bytes} and s.budget.shared == ()

    async def body():
        await s.gen(QWEN14)
        p = s.plan(QWEN14)
        assert p.devices[0]["backend"] == "vulkan" and p.devices[0]["overhead_bytes"] == 0
        await s.gen(GEMMA12)  # 15.4 + 13.1 GB > the 7900 XTX's 23.5: qwen (LRU) goes
        assert s.resident() == {GEMMA12}
        await s.gen(QWEN8_Q4)  # 5.8 GB more fits next to gemma
        assert s.resident() == {GEMMA12, QWEN8_Q4}
        assert s.on(GEMMA12).keys() == s.on(QWEN8_Q4).keys() == {0}
        assert s.budget.fits(s.reg.residency.used(), 2)

    s.run(body)


# -------------------------------------------------------------------------------------- unified memory
@pytest.mark.parametrize("preset", ["strix-halo-128gb", "dgx-spark-128gb", "laptop-780m-32gb"])
def test_a_model_on_a_unified_pool_is_counted_once(tmp_path, preset):
    hw, budget = budget_hardware(get_preset(preset))
    assert budget.shared == (0,) and hw.gpus[0].unified
    assert budget.vram_by_gpu[0] <= budget.ram_bytes  # the GPU's pool is inside the RAM the server may use
    s = PlannerLoader(Settings(home=tmp_path, models_dir=tmp_path), hw, n_ctx=8192, plan_fn=synthetic_plan_load)
    planned = s.plan("/m/qwen3-14b@Q8_0.gguf")
    plan, need = planned.plan, planned.need
    assert plan.n_gpu_layers == plan.n_layers + 1 and need.vram_by_gpu.keys() == {0}
    # the weights on the GPU are in its pool, not again in RAM: RAM holds only what the CPU keeps
    assert need.ram_bytes < plan.weights_bytes // 10 and plan.weights_gpu_bytes <= need.vram_bytes
    assert budget.ram_held(need) == need.vram_bytes + need.ram_bytes
    assert plan.ram_budget_bytes == hw.ram_available_bytes - plan.vram_bytes  # the plan, too, counts it once


def test_budget_counts_a_shared_gpu_against_the_ram():
    b = Budget(30 * GiB, None, None, {0: 16 * GiB}, shared=(0,))
    assert b.fits(Need(0, 12 * GiB, {0: 15 * GiB}), 1)
    assert not b.fits(Need(0, 16 * GiB, {0: 15 * GiB}), 1)  # 15 + 16 > 30: each alone would have passed
    assert b.over(Need(0, 16 * GiB, {0: 17 * GiB}), 1) == ["ram", 0]
    dedicated = Budget(30 * GiB, None, None, {0: 16 * GiB})
    assert dedicated.fits(Need(0, 16 * GiB, {0: 15 * GiB}), 1)  # VRAM of its own: two budgets
    assert b.frees(Need(0, 0, {0: GiB}), "ram") and not dedicated.frees(Need(0, 0, {0: GiB}), "ram")


def test_a_780m_laptop_does_not_overcommit_its_shared_ram(tmp_path):
    """qwen3-32b Q8 half on the 780M's GTT pool, half in RAM (27 GB of 27); a 135M model would still pass
    a VRAM budget and a RAM budget each on its own, not the one pool they are: qwen3-32b goes."""
    big, small = "qwen3-32b@Q8_0", "smollm2-135m-instruct@Q8_0"
    s = Server(tmp_path, get_preset("laptop-780m-32gb"), [big, small])

    async def body():
        await s.gen(big)
        a = s.reg.residents[s.files[big]].need
        b = s.loader.plan(s.files[small], None, a.vram_by_gpu).need
        separate = Budget(s.budget.ram_bytes, None, None, s.budget.vram_by_gpu)  # the pool counted twice
        assert separate.fits(a + b, 2) and not s.budget.fits(a + b, 2)
        await s.gen(small)
        assert s.resident() == {small}

    s.run(body)


def test_strix_halo_holds_three_models_in_gtt_and_evicts_the_least_recently_used(tmp_path):
    """70B Q4 + 27B Q4 + 32B Q8 (93 GB) share the 96 GB GTT pool; a fourth evicts the least recently used."""
    names = ["llama-3.3-70b-instruct@Q4_K_M", "gemma-3-27b-it@Q4_K_M", "qwen3-32b@Q8_0", QWEN14]
    s = Server(tmp_path, get_preset("strix-halo-128gb"), names)

    async def body():
        for n in names[:3]:
            await s.gen(n)
        assert s.resident() == set(names[:3])
        used = s.reg.residency.used()
        assert used.vram_bytes > 90 * GiB and s.budget.ram_held(used) <= s.budget.ram_bytes
        await s.gen(names[3])
        assert s.resident() == set(names[1:])  # the 70B, least recently used, made room

    s.run(body)


def test_dgx_spark_max_memory_caps_the_one_pool(tmp_path):
    """--max-memory 24GiB on a GB10: the GPU's budget is inside it, and two models of 17 and 15 GB do not both
    stay (counted in VRAM and RAM separately they did: 29 GB of "VRAM" next to 2.5 GB of RAM)."""
    s = Server(tmp_path, get_preset("dgx-spark-128gb"), [QWEN14, GEMMA12], max_ram_bytes=24 * GiB)
    assert s.budget.ram_bytes == 24 * GiB and s.budget.vram_by_gpu == {0: 24 * GiB}
    assert s.hw.gpus[0].free_bytes == 24 * GiB

    async def body():
        await s.gen(QWEN14)
        await s.gen(GEMMA12)
        assert s.resident() == {GEMMA12}

    s.run(body)


# ------------------------------------------------------------------------- a graphics card next to an iGPU
def desktop_with_igpu():
    """A Ryzen 7000 desktop: its Raphael iGPU (an APU id: a unified GTT pool) on card0 and an RX 7900 XTX on
    card1, as ``probe_amd`` lists them (by card number), through ``probe_hardware``."""
    from localrun.machine.hardware import CpuInfo, DiskInfo, GpuInfo, probe_hardware

    igpu = GpuInfo(name="AMD Radeon Graphics (Raphael)", vendor="amd", backend="vulkan", total_bytes=30 * GiB,
                   free_bytes=30 * GiB, index=0, unified=True, working_set_bytes=30 * GiB, memory_kind="unified")
    xtx = GpuInfo(name="AMD Radeon RX 7900 XTX", vendor="amd", backend="vulkan", total_bytes=24 * GiB,
                  free_bytes=23 * GiB, index=1, memory_kind="dedicated", arch="gfx1100")
    return probe_hardware("/tmp", cpu=lambda: CpuInfo("Ryzen 9 7950X", "x86_64", 16, 32, ["AVX2"]),
                          memory=lambda: (64 * GiB, 60 * GiB), nvidia=lambda: [], apple=lambda t, a: [],
                          linux_gpus=lambda t, a: [igpu, xtx], disk=lambda p: DiskInfo(p, 1 << 40, 1 << 39, "nvme"))


def test_a_desktop_igpu_is_not_planned_on_next_to_the_graphics_card(tmp_path):
    """llama.cpp adds integrated GPUs only when no other GPU is there (src/llama.cpp): the planner, the
    budget and the card numbers follow it, so both models go to the 7900 XTX (llama.cpp's device 0)."""
    from localrun.offload.devices import gpu_list_of

    hw = desktop_with_igpu()
    assert [g.name for g in hw.gpus] == ["AMD Radeon RX 7900 XTX", "AMD Radeon Graphics (Raphael)"]
    assert gpu_list_of(hw, None) == [hw.gpus[0]]
    s = Server(tmp_path, hw, [QWEN14, QWEN8_Q4])
    assert s.budget.shared == (1,)  # the iGPU shares the RAM; the card does not

    async def body():
        await s.gen(QWEN14)
        await s.gen(QWEN8_Q4)
        assert s.resident() == {QWEN14, QWEN8_Q4}
        for n in (QWEN14, QWEN8_Q4):
            p = s.plan(n)
            assert s.on(n).keys() == {0} and p.main_gpu == 0 and p.devices[0]["name"] == "AMD Radeon RX 7900 XTX"
        assert s.budget.fits(s.reg.residency.used(), 2)

    s.run(body)
