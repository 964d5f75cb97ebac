"""``Plan``: what a backend loads (llama.cpp parameters) and what the planner predicts about it.

The backends read only the *load* fields; the *prediction* fields are for `fit`, `bench` and the
refusal message when a plan does not fit. ``simple_plan`` is the foundation's rule (all layers on
the GPU when llama.cpp has GPU offload, else CPU); the full search lives in ``plan_model``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Plan:
    # --- what is loaded (llama.cpp: llama_model_params / llama_context_params) ---
    backend: str = "llamacpp"
    n_ctx: int = 4096  # per sequence, tokens
    n_parallel: int = 1  # sequences decoded together (serve); KV = n_ctx × n_parallel cells
    n_gpu_layers: int = 0  # repeating layers on the GPU (-1 = all)
    n_batch: int = 512  # logical batch, tokens
    n_ubatch: int = 512  # physical batch, tokens
    n_threads: int | None = None  # decode threads (None = physical cores)
    n_threads_batch: int | None = None  # prefill threads
    kv_type: str = "f16"  # f16 | q8_0 | q4_0 (type_k = type_v)
    flash_attn: bool | None = None  # None = llama.cpp decides (AUTO)
    use_mmap: bool = True
    use_mlock: bool = False
    offload_kqv: bool = True
    swa_full: bool = False  # full-size SWA cache (llama-cpp-python's default is True; localrun's is False)
    main_gpu: int = 0
    tensor_split: list[float] | None = None

    # --- what the planner predicts ---
    model: str = ""
    quant: str = ""
    n_layers: int = 0
    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    compute_bytes: int = 0
    vram_bytes: int = 0
    ram_bytes: int = 0
    disk_backed_bytes: int = 0
    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    fits: bool = True
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def simple_plan(spec, hardware=None, *, n_ctx: int | None = None, n_gpu_layers: int | None = None,
                gpu_offload_supported: bool = False, **overrides) -> Plan:
    """All layers on the GPU when the backend can offload and a GPU exists, else CPU.

    ``n_ctx`` defaults to min(4096, the model's training context).
    """
    ctx = n_ctx or min(4096, spec.n_ctx_train or 4096)
    has_gpu = bool(hardware and hardware.gpus) and gpu_offload_supported
    ngl = n_gpu_layers if n_gpu_layers is not None else (spec.n_layer if has_gpu else 0)
    threads = hardware.cpu.physical_cores if hardware else None
    reasons = [f"{ngl} of {spec.n_layer} layers on the GPU" if ngl else "CPU only: no GPU offload available"]
    return Plan(n_ctx=ctx, n_gpu_layers=ngl, n_threads=threads, n_threads_batch=threads, model=spec.name,
                quant=spec.file_type, n_layers=spec.n_layer, weights_bytes=spec.tensor_bytes,
                reasons=reasons, **overrides)
