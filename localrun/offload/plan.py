"""``Plan``: what a backend loads (llama.cpp parameters) and what the planner predicts about it.

The backends read only the *load* fields; the *prediction* fields are for `fit`, `bench` and the
refusal message when a plan does not fit. ``simple_plan`` is the foundation's rule (all layers on
the GPU when llama.cpp has GPU offload, else CPU). ``evaluate`` computes one configuration's memory per
tier, fit and speed (formulas in ``memory.py``/``speed.py``); ``check_fits`` refuses a plan that does not
fit; ``draft_plan``/``add_draft_model`` add a speculative-decoding draft model. The search over
configurations is ``search.py`` (``plan_model`` searches n_gpu_layers, the MoE experts on the CPU, the KV
type and the context for one quantization; ``plan_for_run`` is what chat/serve load); choosing among
quantizations is ``choose.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from localrun.errors import ConfigError, InsufficientMemoryError


@dataclass
class Plan:
    # --- what is loaded (llama.cpp: llama_model_params / llama_context_params) ---
    backend: str = "llamacpp"
    n_ctx: int = 4096  # per sequence, tokens
    n_parallel: int = 1  # sequences decoded together (serve); KV = n_ctx × n_parallel cells
    n_gpu_layers: int = 0  # repeating layers on the GPU (-1 = all)
    n_batch: int = 2048  # logical batch, tokens: the most one llama_decode takes (llama-server's default)
    n_ubatch: int = 512  # physical batch, tokens
    n_threads: int | None = None  # decode threads (None = physical cores)
    n_threads_batch: int | None = None  # prefill threads
    kv_type: str = "f16"  # f16 | q8_0 | q4_0 (type_k = type_v)
    flash_attn: bool | None = None  # None = llama.cpp decides (AUTO)
    use_mmap: bool = True
    use_mlock: bool = False
    offload_kqv: bool = True
    swa_full: bool = False  # full-size SWA cache (llama-cpp-python's default is True; localrun's is False)
    kv_unified: bool = False  # one KV buffer shared by all sequences (llama-server's default for slots > 1)
    main_gpu: int = 0  # the device of split_mode "none" (llama.cpp model params main_gpu)
    tensor_split: list[float] | None = None  # layers per device, llama.cpp's order (offload/devices.py)
    split_mode: str = "layer"  # none (one GPU: main_gpu) | layer | row (llama_split_mode)

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
    # --- planner detail (bytes) ---
    n_cpu_moe: int = 0  # layers whose MoE expert tensors stay on the CPU (llama.cpp --n-cpu-moe)
    ram_anon_bytes: int = 0  # RAM that cannot be paged out: KV/buffers on the CPU, runtime, unmapped weights
    page_cache_bytes: int = 0  # mmapped weights resident in RAM
    rss_bytes: int = 0  # predicted process RSS after load (compute buffers reserved but untouched)
    weights_gpu_bytes: int = 0
    weights_cpu_bytes: int = 0
    kv_gpu_bytes: int = 0  # KV cache and recurrent state on the GPU(s)
    recurrent_bytes: int = 0  # recurrent layers' state (R/S, F32, per sequence), besides kv_cache_bytes
    vram_budget_bytes: int = 0
    ram_budget_bytes: int = 0
    speed_source: str = ""
    kv_cells: dict = field(default_factory=dict)
    n_ctx_train: int = 0  # the model's training context, tokens
    n_ctx_requested: int | None = None  # --ctx as given (None: the planner chose n_ctx)
    weights_complete: bool = True  # False: the file's tensor data is cut short (a partial download)
    warnings: list[str] = field(default_factory=list)  # what the user must hear (fit prints them; chat/serve too)
    source: str = ""  # fit: "file" | "catalog" | "other quantization (not downloaded)"
    quality_kld: float | None = None  # fit: published mean KL-divergence of the quantization
    devices: list[dict] = field(default_factory=list)  # several devices: DeviceUse.to_dict() each, bytes
    draft_bytes: int = 0  # speculative decoding's draft model: weights + KV + compute (add_draft_model)
    draft_on_gpu: bool = False  # all its layers on the GPU (else the CPU)
    mmproj_bytes: int = 0  # the vision projector's weights (add_projector)
    mmproj_on_gpu: bool = False
    no_mmproj_offload: bool = False  # keep the projector on the CPU (llama-server's --no-mmproj-offload)
    # the projector's image facts (offload.vision.add_vision): projector, image_size (px), image_tokens,
    # compute_bytes (one image's compute buffer, counted with mmproj_bytes), source; empty without one
    vision: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not d["vision"]:
            del d["vision"]  # text-only plans print as they did before projectors were planned
        return d


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


# ------------------------------------------------------------------------------------------------
# evaluation of one configuration
# ------------------------------------------------------------------------------------------------

VRAM_MARGIN = 0.05  # of usable VRAM, for fragmentation and what the estimate cannot see


def _gib(n: float) -> str:
    from localrun.machine.hardware import fmt_bytes

    return fmt_bytes(n)


def _budgets(hw, gpu=None) -> tuple[int, int]:
    """(usable VRAM bytes of ``gpu`` (default GPU 0) after the margin, usable RAM bytes)."""
    vram = 0
    if hw is not None and hw.gpus:
        g = gpu or hw.gpus[0]
        vram = int(g.usable_bytes * (1 - VRAM_MARGIN))
    ram = hw.ram_available_bytes if hw is not None else 1 << 62
    return vram, ram


QUANTIZED_KV = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")


def flash_attention(kv_type: str, flash_attn: bool | None, on_gpu: bool) -> bool:
    """Whether the context runs with flash attention.

    ``flash_attn`` None (localrun decides): on with a GPU; off on the CPU, where llama.cpp's CPU
    flash-attention kernel wins prefill a little and loses decode at depth badly: llama-bench, SmolLM2
    Q4_1, 1 thread, -fa 0 vs 1 interleaved, median of 2: pp512 148 → 163 tok/s (1.10×) at depth 0 and
    60 → 66 at depth 4096, tg128 47.7 → 49.4 (1.04×) at depth 0 but 21.6 → 7.4 (0.34×) at depth 4096
    (its one-query path walks the cells one by one, ggml-cpu/ops.cpp flash_attn_ext) — except that a
    quantized V cache needs it (llama.cpp turns AUTO into ENABLED for one, src/llama-context.cpp
    llama_init_from_model). ``flash_attn`` False with a quantized V cache raises ConfigError: llama.cpp
    refuses that context ("quantized V cache requires flash_attn to be enabled", it returns NULL)."""
    quant_v = kv_type.lower() in QUANTIZED_KV
    if flash_attn is False and quant_v:
        raise ConfigError(f"a {kv_type} KV cache needs flash attention: llama.cpp cannot run a quantized V "
                          "cache without it", hint="drop --no-flash-attn, or use --kv-type f16")
    if flash_attn is None:
        return True if quant_v else on_gpu
    return bool(flash_attn)


def kv_layout(n_parallel: int) -> bool:
    """localrun's KV layout for ``n_parallel`` sequences → ``kv_unified``: one KV stream per sequence (False).

    A unified pool makes any batch one ubatch (src/llama-batch.cpp ``split_simple``), but every token then
    attends over the cells of ALL sequences, cached idle ones included (the K/Q product without flash
    attention; a mask test per cell and head with llama.cpp's CPU flash attention, ggml-cpu/ops.cpp), so a
    decode step grows with the pool rather than with its own sequence: measured with
    benches/serve_concurrency.py at 8 streams, unified 69.7 tok/s vs 82.3 per-sequence. Per-sequence streams
    cost one ubatch per run of consecutive sequence ids, and the engine keeps the running ids in one run
    (``backends/llamacpp/placement.py``), so a decode step is one pass over the weights either way
    (docs/architecture.md §1, "One pass per step"). The pool's cells are the same in both: n_ctx × n_parallel."""
    return False


def evaluate(spec, hw, *, n_ctx: int, n_parallel: int = 1, kv_type: str = "f16", n_gpu_layers: int = 0,
             n_cpu_moe: int = 0, flash_attn: bool | None = None, use_mmap: bool = True, n_ubatch: int = 512,
             n_batch: int = 2048, backend: str = "llamacpp", measurement: dict | None = None,
             offload_kqv: bool = True, gpu_indices: tuple[int, ...] | None = None,
             kv_unified: bool | None = None) -> Plan:
    """Memory per tier, fits, and predicted speed of ONE configuration (no search).

    Tiers: VRAM (the GPUs; Apple: the Metal working set inside RAM); RAM as anonymous memory (KV and
    buffers on the CPU, runtime, weights when mmap is off) plus page cache for mmapped weights; and
    disk-backed pages: mmapped weights that do not fit in RAM and are re-read from disk every token.
    ``gpu_indices``: which of ``hw.gpus`` to use (one: llama.cpp split_mode "none" with that main_gpu);
    None = all of them (several: a layer split, ``offload/devices.py``; ``Plan.devices`` per device).
    ``kv_unified``: one KV pool shared by the sequences (True) or one stream each (False); None = localrun's
    choice (``kv_layout``).
    """
    from localrun.offload import devices as D
    from localrun.offload import memory as M
    from localrun.offload import speed as S

    kv_type = kv_type.lower()
    if kv_type not in M.KV_TYPES:
        raise ConfigError(f"unknown KV-cache type {kv_type!r}", hint="use f16, q8_0 or q4_0")
    n_layer = spec.n_layer
    gpu_list = D.gpu_list_of(hw, gpu_indices) if n_gpu_layers != 0 else []
    gpu = gpu_list[0] if gpu_list else None
    ngl = n_gpu_layers if gpu is not None else 0
    ws = M.split_weights(spec, ngl, n_cpu_moe=n_cpu_moe)
    fa = flash_attention(kv_type, flash_attn, gpu is not None)
    kv_unified = kv_layout(n_parallel) if kv_unified is None else bool(kv_unified)
    kv = M.kv_cache(spec, n_ctx, n_parallel=n_parallel, kv_type=kv_type, n_ubatch=n_ubatch, kv_unified=kv_unified,
                    flash_attn=fa)
    n_ctx_seq = kv.n_ctx_total // max(1, n_parallel) if kv_unified else kv.n_ctx_seq
    gpu_set = set(ws.gpu_layers)
    kv_gpu = sum(kv.layer_bytes(il) for il in gpu_set) if (gpu is not None and offload_kqv) else 0
    kv_cpu = kv.bytes - kv_gpu
    compute = M.compute_buffer_bytes(spec, kv.n_ctx_total if kv_unified else kv.n_ctx_seq, n_ubatch=n_ubatch,
                                     flash_attn=fa)
    full_offload = gpu is not None and len(gpu_set) == n_layer and ws.output_on_gpu and not ws.cpu_expert_bytes
    compute_gpu = compute if gpu is not None else 0
    compute_cpu = n_ubatch * spec.n_embd * 4 * 2 if full_offload else compute
    unified = gpu is not None and gpu.unified
    driver_vram = M.CUDA_CONTEXT_VRAM_BYTES if (gpu is not None and gpu.backend == "cuda") else 0
    driver_host = M.CUDA_CONTEXT_HOST_BYTES if (hw is not None and any(g.backend == "cuda" for g in hw.gpus)) else 0
    vram = ws.gpu_bytes + kv_gpu + compute_gpu + driver_vram if gpu is not None else 0
    output = M.output_buffer_bytes(spec, n_parallel)
    anon = (kv_cpu + compute_cpu + output + M.model_host_overhead_bytes(spec) + M.CONTEXT_HOST_BASE_BYTES
            + M.RUNTIME_BASE_BYTES + driver_host + (0 if use_mmap else ws.cpu_bytes))
    page_cache = ws.cpu_bytes if use_mmap else 0
    vram_budget, ram_budget = _budgets(hw, gpu)
    devices, tsplit, row = [], None, None
    if len(gpu_list) > 1:
        devices, tsplit = D.place_model(spec, kv, gpu_list, ngl, compute, fa, n_ubatch, offload_kqv, n_cpu_moe,
                                        margin=VRAM_MARGIN)
        vram, vram_budget = sum(d.total_bytes for d in devices), sum(d.budget_bytes for d in devices)
    ram_for_host = ram_budget - (vram if unified else 0)
    disk_backed = max(0, min(page_cache, anon + page_cache - ram_for_host))
    fits = anon <= ram_for_host and (gpu is None or vram <= vram_budget)
    if devices:
        fits = fits and all(d.fits for d in devices)
    if not use_mmap and anon > ram_for_host:
        fits = False
    # --- speed ---
    meas = measurement
    tiers = {"cpu": S.cpu_tier(hw, meas)}
    if gpu is not None:
        tiers["gpu"] = S.gpu_tier(gpu)
    tiers["disk"] = S.disk_tier(hw.disk.kind if hw is not None and hw.disk else None)
    rd = S.weights_read_per_token(spec, gpu_set, ws.output_on_gpu, n_cpu_moe)
    frac_disk = disk_backed / page_cache if page_cache else 0.0
    kv_read = S.kv_read_per_token(kv.bytes, n_parallel)
    kv_read_gpu = kv_read * (kv_gpu / kv.bytes) if kv.bytes else 0.0
    bytes_tier = {"gpu": rd["gpu"] + kv_read_gpu, "cpu": rd["cpu"] * (1 - frac_disk) + kv_read - kv_read_gpu,
                  "disk": rd["cpu"] * frac_disk}
    params_tier = {"gpu": S.prefill_params(rd, "gpu"),
                   "cpu": S.prefill_params(rd, "cpu") / S.cpu_prefill_factor(tiers["cpu"], spec.file_type, spec)}
    if devices:
        D.split_speed_inputs(spec, devices, gpu_list, n_cpu_moe, kv_read_gpu, kv_gpu, bytes_tier, params_tier, tiers)
    cpu_extra = S.cpu_decode_overhead_s(tiers["cpu"], n_layer - len(gpu_set), rd["cpu_params"],
                                        rd["cpu"] * (1 - frac_disk), spec.file_type, spec)
    decode = S.decode_tok_s(bytes_tier, tiers, cpu_extra)
    prefill = S.prefill_tok_s(params_tier, tiers)
    used = [gpu_list[d.index] for d in devices if d.n_slots] if devices else gpu_list[:1]
    if len(used) > 1 or any(g.backend == "rpc" for g in used):
        from localrun.offload import links as L

        hops = D.hops_along([None, *used])
        extra_s = L.decode_hops_s(hops, spec.n_embd)
        if used[-1].backend == "rpc" and ws.output_on_gpu:  # the logits come back over the network
            extra_s += L.hop_s(D.rpc_link(used[-1]), spec.vocab_size * 4)
        decode = L.with_hops(decode, extra_s)
        prefill = L.with_hops(prefill, L.prefill_hops_s_per_token(hops, spec.n_embd, n_ubatch))
    if devices:
        row = D.row_split_decode(devices, gpu_list, bytes_tier, tiers, decode, tsplit)
    quant = spec.file_type
    plan = Plan(backend=backend, n_ctx=n_ctx_seq, n_parallel=n_parallel, kv_unified=kv_unified,
                n_gpu_layers=(n_layer + 1 if ngl < 0 else ngl), n_batch=n_batch, n_ubatch=n_ubatch,
                n_threads=hw.cpu.physical_cores if hw is not None else None,
                n_threads_batch=hw.cpu.physical_cores if hw is not None else None, kv_type=kv_type,
                flash_attn=fa, use_mmap=use_mmap, offload_kqv=offload_kqv,
                model=spec.name, quant=quant, n_layers=n_layer, weights_bytes=spec.tensor_bytes,
                kv_cache_bytes=kv.attn_bytes, compute_bytes=compute, vram_bytes=vram,
                ram_bytes=anon + page_cache - disk_backed, disk_backed_bytes=disk_backed,
                prefill_tok_s=prefill, decode_tok_s=decode, fits=fits)
    plan.n_cpu_moe = n_cpu_moe
    if devices:
        plan.tensor_split, plan.split_mode = tsplit, "layer"
        plan.devices = [d.to_dict() for d in devices]
        if row is not None:
            plan.split_mode, plan.decode_tok_s = "row", row[0]
    elif gpu is not None:
        from localrun.offload.devices import DeviceUse

        idx = hw.gpus.index(gpu)
        if len(hw.gpus) > 1:
            plan.split_mode, plan.main_gpu = "none", idx
        one = DeviceUse(index=idx, name=gpu.name, backend=gpu.backend, layers=list(ws.gpu_layers),
                        output=ws.output_on_gpu, weights_bytes=ws.gpu_bytes, kv_bytes=kv_gpu,
                        compute_bytes=compute_gpu, overhead_bytes=driver_vram, budget_bytes=vram_budget,
                        endpoint=gpu.endpoint)
        plan.devices = [one.to_dict()]
    plan.ram_anon_bytes = anon
    plan.page_cache_bytes = page_cache - disk_backed
    plan.rss_bytes = anon - compute_cpu + min(compute_cpu, M.MiB) + page_cache - disk_backed
    plan.weights_gpu_bytes = ws.gpu_bytes
    plan.weights_cpu_bytes = ws.cpu_bytes
    plan.kv_gpu_bytes = kv_gpu
    plan.recurrent_bytes = kv.recurrent_bytes
    plan.vram_budget_bytes = vram_budget
    plan.ram_budget_bytes = ram_for_host
    gpu_tiers = [t for k, t in tiers.items() if k.startswith("gpu")]
    plan.speed_source = tiers["cpu"].source if (gpu is None or rd["cpu"] > 0) else gpu_tiers[0].source
    plan.kv_cells = {p.name: p.cells for p in kv.parts}
    plan.n_ctx_train = spec.n_ctx_train
    plan.reasons = _reasons(plan, spec, hw, gpu, ws, kv, tiers, unified)
    if devices:
        plan.reasons[0] = split_reason(plan, n_layer)
        if row is not None:
            plan.reasons.insert(1, row[1])
    if fa and flash_attn is None and kv_type in QUANTIZED_KV and gpu is None:
        plan.reasons.append(f"flash attention on: llama.cpp needs it for a {kv_type} V cache")
    _context_notes(plan, spec, n_ctx)
    if spec.file_bytes and spec.truncated:  # a real file (synthetic specs have no bytes) cut short
        plan.weights_complete = False
        plan.warnings.append(
            f"{spec.path}: the tensor data is incomplete ({_gib(spec.file_bytes)} of "
            f"{_gib(spec.expected_file_bytes)}, {spec.file_bytes / spec.expected_file_bytes:.0%}): planned from its "
            "header; it cannot be loaded until the download completes (`localrun pull` resumes it)")
    return plan


def split_reason(plan: Plan, n_layer: int) -> str:
    """The reason line for a split over several devices, from ``plan.devices`` (each device's layers and
    bytes against what it can hold)."""
    used = [d for d in plan.devices if d["n_layers"] or d["output"]]
    parts = []
    for d in used:
        rng = f"layers {d['layers'][0]}-{d['layers'][1] - 1}" if d["layers"] else "no layers"
        parts.append(f"GPU {d['index']} {d['name']}: {rng}{' + output' if d['output'] else ''} "
                     f"({_gib(d['total_bytes'])} of {_gib(d['budget_bytes'])})")
    n_on = sum(d["n_layers"] for d in used)
    split = ",".join(f"{c:g}" for c in (plan.tensor_split or []))
    how = "rows" if plan.split_mode == "row" else "layer"
    ctx = "CUDA context and " if any(d.get("backend") == "cuda" for d in plan.devices) else ""
    return (f"{n_on} of {n_layer} layers split over {len(used)} GPUs by {how} (tensor_split {split}, in proportion "
            f"to what each holds after its {ctx}compute buffer): " + "; ".join(parts))


def rope_scale_needed(n_ctx: int, n_ctx_train: int) -> float:
    """RoPE scaling factor a context beyond training needs: ``n_ctx / n_ctx_train`` (llama.cpp
    ``--rope-scale``, YaRN's ``s``; Peng et al. 2023). 1.0 when it is within training or unknown."""
    return n_ctx / n_ctx_train if n_ctx_train and n_ctx > n_ctx_train else 1.0


def _context_notes(plan: Plan, spec, n_ctx: int) -> None:
    """Warnings about the context: beyond the training length, or rounded up by llama.cpp."""
    trained = spec.n_ctx_train
    if trained and n_ctx > trained:
        f = rope_scale_needed(n_ctx, trained)
        scaled = spec.meta(".rope.scaling.type")
        plan.warnings.append(
            f"context {n_ctx} is above {spec.name}'s training context ({trained} tokens): past {trained} the "
            f"model degrades unless RoPE is scaled by {f:.3g}× (YaRN/linear, llama.cpp --rope-scale {f:.3g}"
            + (f"; the file declares {scaled} scaling" if scaled else "; the file declares none")
            + f"), and the KV cache costs {_gib(plan.kv_cache_bytes)}; use --ctx {trained} or less")
    if plan.n_ctx != n_ctx:
        plan.warnings.append(f"context {n_ctx} rounded up to {plan.n_ctx} tokens: llama.cpp gives each sequence "
                             "a multiple of 256 KV cells")


def _reasons(plan: Plan, spec, hw, gpu, ws, kv, tiers, unified: bool) -> list[str]:
    r: list[str] = []
    n_layer = spec.n_layer
    if gpu is None:
        r.append("CPU only: " + ("no GPU on this machine" if not (hw and hw.gpus) else "no layers on the GPU"))
    else:
        k = len(ws.gpu_layers)
        pool = ("Metal working set" if gpu.vendor == "apple" else "unified pool") if unified else "VRAM"
        where = f"{gpu.name} ({pool} {_gib(plan.vram_budget_bytes)} usable)"
        if k == n_layer and ws.output_on_gpu:
            r.append(f"all {n_layer} layers + output on the GPU: {where}")
        else:
            r.append(f"{k} of {n_layer} layers on the GPU{' + output' if ws.output_on_gpu else ''}, "
                     f"{n_layer - k} on the CPU: {where}")
        if plan.n_cpu_moe:
            r.append(f"MoE experts of the first {plan.n_cpu_moe} layers stay on the CPU "
                     f"({_gib(ws.cpu_expert_bytes)}); attention and dense weights go to the GPU first")
    attn = [p for p in kv.parts if p.name != "recurrent"]
    cells = ", ".join(f"{p.cells} cells × {p.n_layers} layers" + (" (SWA)" if p.name == "kv_swa" else "")
                      for p in attn)
    layout = (f"one pool shared by {plan.n_parallel} sequences" if plan.kv_unified and plan.n_parallel > 1
              else f"{plan.n_parallel} sequence(s), one stream each")
    if attn:
        r.append(f"KV cache {_gib(kv.attn_bytes)} ({plan.kv_type}; {cells}; {layout}; a sequence grows to "
                 f"{plan.n_ctx} tokens)")
    rs = next((p for p in kv.parts if p.name == "recurrent"), None)
    if rs is not None:
        r.append(f"recurrent state {_gib(rs.bytes)} (F32: {rs.n_layers} recurrent layers × {plan.n_parallel} "
                 f"sequence(s); R {_gib(rs.k_bytes)} + S {_gib(rs.v_bytes)}; fixed, not growing with the context)")
    if plan.page_cache_bytes or plan.disk_backed_bytes:
        r.append(f"{_gib(ws.cpu_bytes)} of weights on the CPU are mmapped (page cache, reclaimable)")
    if plan.disk_backed_bytes:
        kind = hw.disk.kind if hw is not None and hw.disk else "disk"
        r.append(f"disk-backed: {_gib(plan.disk_backed_bytes)} of the weights do not fit in RAM and are read "
                 f"from the {kind} every token (decode ≈ {plan.decode_tok_s:.2f} tok/s)")
    if not plan.fits:
        if gpu is not None and plan.vram_bytes > plan.vram_budget_bytes:
            r.append(f"does not fit: needs {_gib(plan.vram_bytes)} VRAM, {_gib(plan.vram_budget_bytes)} usable")
        else:
            r.append(f"does not fit: needs {_gib(plan.ram_anon_bytes)} RAM that cannot be paged out, "
                     f"{_gib(plan.ram_budget_bytes)} available")
    if tiers["cpu"].source.startswith("measured"):
        r.append(f"CPU speed from a measurement: {tiers['cpu'].source}")
    return r


# ------------------------------------------------------------------------------------------------
# the plan that runs: checked, and with a draft model
# ------------------------------------------------------------------------------------------------


def check_fits(plan: Plan, force: bool = False) -> None:
    """Raise InsufficientMemoryError (with the numbers and the fix) when ``plan`` does not fit, unless
    ``force``. A plan with disk-backed pages fits (slowly); the reasons say so."""
    if plan.fits or force:
        return
    if plan.vram_budget_bytes and plan.vram_bytes > plan.vram_budget_bytes:
        needed, avail, what = plan.vram_bytes, plan.vram_budget_bytes, "VRAM"
    else:
        needed, avail, what = plan.ram_anon_bytes, plan.ram_budget_bytes, "RAM"
    raise InsufficientMemoryError(
        f"{plan.model} {plan.quant} with a {plan.n_ctx}-token context ({plan.kv_type} KV, {plan.n_parallel} "
        f"sequence(s)) needs {_gib(needed)} of {what}; {_gib(avail)} is available "
        f"(KV cache {_gib(plan.kv_cache_bytes)}, compute buffers {_gib(plan.compute_bytes)})",
        needed_bytes=needed,
        available_bytes=avail,
        hint=f"use a smaller quantization, a shorter context (--ctx {max(512, plan.n_ctx // 4)}), "
        "--kv-type q8_0, fewer --n-gpu-layers, or --force to load anyway",
    )


def draft_plan(plan: Plan) -> Plan:
    """The Plan a speculative-decoding draft model loads with, derived from the target's ``plan`` (after
    ``add_draft_model`` decided ``draft_on_gpu``): the same context per sequence, sequences, threads, load
    mode, devices and flash attention; all layers on the GPU when ``draft_on_gpu``, else none; an f16,
    unified KV (its batches mix catch-up lengths freely) and 512-token batches. Its memory is already in
    ``plan`` (``draft_bytes``), so the prediction fields stay empty."""
    return Plan(
        backend=plan.backend, n_ctx=plan.n_ctx, n_parallel=plan.n_parallel,
        n_gpu_layers=-1 if plan.draft_on_gpu else 0, n_batch=512, n_ubatch=512,
        n_threads=plan.n_threads, n_threads_batch=plan.n_threads_batch or plan.n_threads, kv_type="f16",
        flash_attn=plan.flash_attn, use_mmap=plan.use_mmap, use_mlock=plan.use_mlock, offload_kqv=plan.offload_kqv,
        kv_unified=True, main_gpu=plan.main_gpu, split_mode="none" if plan.draft_on_gpu else plan.split_mode,
    )


def add_draft_model(plan: Plan, draft) -> Plan:
    """Add a speculative-decoding draft model (``draft``: its ModelSpec) to ``plan``, in place: its
    weights, its KV (f16, unified, ``n_ctx × n_parallel`` cells: ``llamacpp.spec.DraftModel``'s context) and
    compute buffer, on the GPU when the whole of it fits in the VRAM the target leaves (the draft runs
    once per drafted token: on the CPU it would cost more than it saves), else in RAM (weights mmapped).
    Sets ``fits`` False when the RAM budget is then exceeded. Returns ``plan``."""
    from localrun.offload.memory import compute_buffer_bytes, kv_cache

    kv = kv_cache(draft, plan.n_ctx, n_parallel=plan.n_parallel, kv_unified=True)
    weights, compute = int(draft.tensor_bytes), compute_buffer_bytes(draft, kv.n_ctx_total)
    plan.draft_bytes = weights + kv.bytes + compute
    free_vram = plan.vram_budget_bytes - plan.vram_bytes
    if plan.n_gpu_layers != 0 and plan.vram_budget_bytes and plan.draft_bytes <= free_vram:
        plan.draft_on_gpu = True
        plan.vram_bytes += plan.draft_bytes
        plan.reasons.append(f"draft model on the GPU ({_gib(plan.draft_bytes)}: weights, KV, compute)")
        return plan
    plan.ram_bytes += plan.draft_bytes
    plan.ram_anon_bytes += kv.bytes + compute
    plan.page_cache_bytes += weights
    plan.reasons.append(f"draft model in RAM ({_gib(plan.draft_bytes)}: weights, KV, compute)")
    if plan.ram_budget_bytes and plan.ram_anon_bytes > plan.ram_budget_bytes:
        plan.fits = False
        plan.reasons.append("the draft model does not fit next to the model: drop --draft-model")
    return plan


def add_projector(plan: Plan, proj) -> Plan:
    """Add a vision projector (``proj``: the mmproj GGUF's ModelSpec) to ``plan``, in place: its weights, the
    sum of its tensors' bytes (what tools/mtmd/clip.cpp ``clip_model_loader`` allocates and logs as "model
    size"), and its compute buffer for one image at the projector's image size, with the image's tokens
    (``offload.vision``): on the GPU when the plan offloads layers and they fit in the VRAM left
    (llama-server's ``--mmproj-offload`` default) unless ``plan.no_mmproj_offload``, else in RAM. Sets
    ``fits`` False when the RAM budget is then exceeded. Returns ``plan``."""
    from localrun.offload.vision import add_vision, vision_from_gguf

    where = "the projector file " + str(getattr(proj, "path", ""))
    add_vision(plan, int(proj.tensor_bytes), vision_from_gguf(proj), source=where)
    return plan
