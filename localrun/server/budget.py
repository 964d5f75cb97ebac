"""What a resident model holds and what the server may hold, by the planner's bytes, per memory: RAM and each
GPU on its own (a model split over two cards holds its share on each, as ``Plan.devices`` says; a model on
one card leaves the others free; a GPU that shares the RAM counts its bytes against the RAM too, once). Split
from ``server/models.py``, which decides residency with them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Need:
    """What a resident holds by the planner, bytes: ``vram_by_gpu`` on each GPU (index into
    ``HardwareProfile.gpus`` → bytes; ``vram_bytes`` their sum) and ``ram_bytes`` in RAM (anonymous memory +
    the mmapped weights resident in the page cache: ``Plan.ram_bytes``). ``Need(vram_bytes=X)`` alone puts
    X on GPU 0."""

    vram_bytes: int = 0
    ram_bytes: int = 0
    vram_by_gpu: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.vram_by_gpu:
            self.vram_by_gpu = {i: int(b) for i, b in self.vram_by_gpu.items() if b}
            self.vram_bytes = sum(self.vram_by_gpu.values())
        elif self.vram_bytes:
            self.vram_by_gpu = {0: int(self.vram_bytes)}

    def __add__(self, other: "Need") -> "Need":
        gpus = dict(self.vram_by_gpu)
        for i, b in other.vram_by_gpu.items():
            gpus[i] = gpus.get(i, 0) + b
        return Need(0, self.ram_bytes + other.ram_bytes, gpus)

    def __sub__(self, other: "Need") -> "Need":
        gpus = dict(self.vram_by_gpu)
        for i, b in other.vram_by_gpu.items():
            gpus[i] = gpus.get(i, 0) - b
        return Need(0, self.ram_bytes - other.ram_bytes, gpus)


@dataclass
class Budget:
    """What the server may hold, bytes; ``None``: no limit. ``vram_by_gpu``: each GPU's own budget (index into
    ``HardwareProfile.gpus`` → bytes); without it, ``vram_bytes`` bounds the VRAM of all GPUs together.
    ``max_models``: a count cap. ``shared``: the GPUs whose memory IS the RAM (``GpuInfo.unified``: Apple
    Silicon, an AMD APU's GTT pool, an Intel iGPU, DGX Spark's GB10, Jetson): what a model holds there is
    counted once, against its GPU's budget and, with the RAM the models hold, against ``ram_bytes`` (one
    pool: a model on Strix Halo in 30 GiB of GTT leaves 30 GiB less RAM for the next one)."""

    ram_bytes: int | None = None
    vram_bytes: int | None = None
    max_models: int | None = None
    vram_by_gpu: dict[int, int] | None = None
    shared: tuple[int, ...] = ()

    def over(self, used: Need, n_models: int) -> list:
        """The caps ``used`` and ``n_models`` models exceed: "models", "ram" (RAM, with the shared GPUs'
        bytes), a GPU's index (its own budget), "vram" (all GPUs together, without per-GPU budgets)."""
        out: list = []
        if self.max_models is not None and n_models > self.max_models:
            out.append("models")
        if self.ram_bytes is not None and self.ram_held(used) > self.ram_bytes:
            out.append("ram")
        if self.vram_by_gpu is not None:
            out += [i for i, b in sorted(used.vram_by_gpu.items()) if b > self.vram_by_gpu.get(i, 0)]
        elif self.vram_bytes is not None and used.vram_bytes > self.vram_bytes:
            out.append("vram")
        return out

    def fits(self, used: Need, n_models: int) -> bool:
        """Whether ``used`` (the sum of the residents' needs) and ``n_models`` models stay within every cap."""
        return not self.over(used, n_models)

    def ram_held(self, used: Need) -> int:
        """The RAM ``used`` holds, bytes: its own, plus what it holds on the GPUs that share the RAM."""
        return used.ram_bytes + sum(used.vram_by_gpu.get(i, 0) for i in self.shared)

    def frees(self, need: Need, cap) -> bool:
        """Whether unloading a model holding ``need`` lowers the use of ``cap`` (an item of ``over``)."""
        if cap == "models":
            return True
        if cap == "ram":
            return self.ram_held(need) > 0
        if cap == "vram":
            return need.vram_bytes > 0
        return need.vram_by_gpu.get(cap, 0) > 0


def vram_by_device(plan, hw=None) -> dict[int, int]:
    """A plan's VRAM on each GPU, bytes, keyed by position in ``hw.gpus``: ``Plan.devices``' totals
    (offload/devices.py). A layer split numbers its devices in llama.cpp's order (``gpu_list_of``: RPC
    workers first); one card (``split_mode`` none, or a single GPU) by its position in ``hw.gpus``. A plan
    without devices puts ``vram_bytes`` on ``main_gpu``; VRAM the devices do not list (a draft model) goes to
    the first device. Without ``hw`` a split's device numbers are taken as
    positions in ``hw.gpus`` (right unless RPC workers take part)."""
    from localrun.offload.devices import gpu_list_of

    devices = [d for d in (getattr(plan, "devices", None) or []) if d.get("total_bytes")]
    if not devices:
        vram = int(getattr(plan, "vram_bytes", 0) or 0)
        return {int(getattr(plan, "main_gpu", 0) or 0): vram} if vram else {}
    order = gpu_list_of(hw, None) if hw is not None and len(plan.devices) > 1 else None
    out: dict[int, int] = {}
    for d in devices:
        i = int(d["index"])
        if order is not None:
            i = next(j for j, h in enumerate(hw.gpus) if h is order[i])
        out[i] = out.get(i, 0) + int(d["total_bytes"])
    extra = int(getattr(plan, "vram_bytes", 0) or 0) - sum(out.values())
    if extra > 0:  # bytes the devices do not list (a draft model: offload/plan.py add_draft_model): the first
        first = next(iter(out))
        out[first] += extra
    return out


def need_text(n: Need) -> str:
    """``n`` in words: "1.2 GiB of RAM and 3.0 GiB of VRAM (GPU 0 1.0 GiB, GPU 1 2.0 GiB)"."""
    text = f"{_fmt(n.ram_bytes)} of RAM"
    if n.vram_bytes:
        text += f" and {_fmt(n.vram_bytes)} of VRAM"
        if len(n.vram_by_gpu) > 1 or any(i != 0 for i in n.vram_by_gpu):
            text += " (" + ", ".join(f"GPU {i} {_fmt(b)}" for i, b in sorted(n.vram_by_gpu.items())) + ")"
    return text


def budget_text(b: Budget) -> str:
    """``b`` in words: "30 GiB of RAM, 23.5 GiB of VRAM on GPU 0 and 23.9 GiB on GPU 1, 2 models"."""
    parts = [f"{_fmt(b.ram_bytes)} of RAM" if b.ram_bytes is not None else "any RAM"]
    if b.vram_by_gpu:
        each = [f"{_fmt(v)} on GPU {i}" for i, v in sorted(b.vram_by_gpu.items())]
        parts.append("VRAM " + (" and ".join(each) if len(each) <= 2 else ", ".join(each)))
    elif b.vram_bytes is not None:
        parts.append(f"{_fmt(b.vram_bytes)} of VRAM")
    if b.shared:
        parts.append(f"GPU {', '.join(str(i) for i in b.shared)} sharing the RAM (counted once)")
    if b.max_models is not None:
        parts.append(f"{b.max_models} model{'s' if b.max_models != 1 else ''}")
    return ", ".join(parts)


def _fmt(n: int) -> str:
    from localrun.units import fmt_bytes

    return fmt_bytes(n)
