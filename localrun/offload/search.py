"""The search for one quantization: the best configuration of a model on a machine (``plan_model``) and the
plan chat/serve load (``plan_for_run``: the same search, with every flag given kept as is).

Every candidate is one ``evaluate`` (plan.py: memory per tier, fit, speed). The search: the KV type (f16,
then q8_0 when that is what lets the model fit or keeps more layers on the GPU); with several GPUs, one card
alone when the whole model fits on it (``_one_card``), else all layers on the GPU, else (MoE) the expert
tensors of the first N layers on the CPU, else the most layers that fit (binary search, ``_search_gpu``);
then, when no context is asked, the longest context that costs nothing else (``CTX_FLOOR`` … the caps).
Pure: no I/O (measured speeds come in as ``measurement``). Choosing among quantizations is ``choose.py``.
"""

from __future__ import annotations

from localrun.offload.plan import Plan, evaluate
from localrun.units import fmt_bytes as _gib

# The context chosen when none is asked for (``plan_model(n_ctx=None)``): the longest that fits, up to the
# training context, within these caps. llama-server allocates the full training context by default,
# Ollama and LM Studio 4096 (Ollama ≥ 0.12 more with more VRAM): localrun takes the training context when
# the KV cache stays a modest share of memory, capped on the CPU, where a long prompt prefills slowly
# anyway and the KV cache competes with everything else in RAM.
CTX_FLOOR = 4096  # never choose less (unless the model was trained shorter)
CTX_CAP_CPU = 32768
CTX_CAP_GPU = 131072
KV_SHARE_MAX = 0.25  # chosen context: KV cache ≤ this share of the memory it lives in (VRAM or RAM)


def plan_model(spec, hw, *, n_ctx: int | None = None, n_parallel: int = 1, kv_type: str | None = None,
               flash_attn: bool | None = None, n_gpu_layers: int | None = None, use_mmap: bool = True,
               backend: str = "llamacpp", measurement: dict | None = None,
               gpu_offload_supported: bool = True) -> Plan:
    """The best configuration of ``spec`` on ``hw``: the most layers on the GPU that fit (MoE: expert
    tensors move to the CPU before any layer does), f16 KV unless q8_0 is what lets it fit or keeps more
    layers on the GPU. Flags given are kept as is.

    ``n_ctx`` None: the longest context per sequence (tokens) up to the training context that costs
    nothing else — the same GPU layers, KV type and experts as at ``CTX_FLOOR``, no disk-backed pages,
    the KV cache ≤ ``KV_SHARE_MAX`` of the budget — capped at ``CTX_CAP_CPU`` (CPU only) or
    ``CTX_CAP_GPU``; the reasons say what was chosen and why. Raises ConfigError for an unknown KV type
    or a quantized KV cache with ``flash_attn=False``."""
    kw = dict(n_parallel=n_parallel, kv_type=kv_type, flash_attn=flash_attn, n_gpu_layers=n_gpu_layers,
              use_mmap=use_mmap, backend=backend, measurement=measurement,
              gpu_offload_supported=gpu_offload_supported)
    if n_ctx:
        p = _plan_at_ctx(spec, hw, n_ctx=int(n_ctx), **kw)
        p.n_ctx_requested = int(n_ctx)
        return p
    trained = spec.n_ctx_train or CTX_FLOOR
    base = _plan_at_ctx(spec, hw, n_ctx=min(CTX_FLOOR, trained), **kw)
    cap = CTX_CAP_GPU if base.vram_bytes else CTX_CAP_CPU
    for ctx in _longer_contexts(trained, cap, base.n_ctx):
        if not base.fits:
            break
        p = evaluate(spec, hw, n_ctx=ctx, n_parallel=n_parallel, kv_type=base.kv_type,
                     n_gpu_layers=base.n_gpu_layers, n_cpu_moe=base.n_cpu_moe, flash_attn=flash_attn,
                     use_mmap=use_mmap, backend=backend, measurement=measurement,
                     gpu_indices=plan_gpu_indices(base))
        budget = p.vram_budget_bytes if p.kv_gpu_bytes else p.ram_budget_bytes
        if (p.fits and not p.disk_backed_bytes and p.n_gpu_layers >= base.n_gpu_layers
                and p.n_cpu_moe <= base.n_cpu_moe and p.kv_cache_bytes <= KV_SHARE_MAX * budget):
            p.reasons.insert(_ctx_reason_at(p), _ctx_reason(p, trained, cap))
            p.reasons[1:1] = [r for r in base.reasons if r.startswith("one card: ")]
            p.reasons += [r for r in base.reasons if r.startswith("CPU only: this llama.cpp")
                          or (r.startswith("KV cache ") and ": with " in r)]
            return p
    base.reasons.insert(_ctx_reason_at(base), _ctx_reason(base, trained, cap, longer=base.n_ctx < min(trained, cap)))
    return base


def _longer_contexts(trained: int, cap: int, floor: int) -> list[int]:
    """Candidate contexts above ``floor``, longest first: min(trained, cap), then halvings."""
    top = min(trained, cap)
    out, c = [], top
    while c > floor:
        out.append(c)
        c //= 2
    return out


def _ctx_reason_at(p: Plan) -> int:
    """Index for the context reason: right after the GPU/CPU placement line."""
    return min(1, len(p.reasons))


def _ctx_reason(p: Plan, trained: int, cap: int, *, longer: bool = False) -> str:
    where = "GPU" if p.kv_gpu_bytes else "RAM"
    if p.n_ctx >= trained:
        why = "the model's training context"
    elif p.n_ctx >= cap:
        why = (f"capped at {cap} of {trained} trained: " + ("on the CPU a long prompt prefills slowly"
               if where == "RAM" else "a longer KV cache is rarely used") + "; --ctx asks for more")
    elif longer:
        why = (f"a longer one would cost GPU layers, disk-backed pages or over {KV_SHARE_MAX:.0%} of the {where} "
               f"budget for the KV cache (trained for {trained}; --ctx asks for more)")
    else:
        why = (f"the longest whose KV cache stays within {KV_SHARE_MAX:.0%} of the {where} budget "
               f"(trained for {trained})")
    return f"context {p.n_ctx} tokens per sequence (chosen: {why})"  # the KV cache's size is its own reason


def _plan_at_ctx(
    spec,
    hw,
    *,
    n_ctx: int,
    n_parallel: int = 1,
    kv_type: str | None = None,
    flash_attn: bool | None = None,
    n_gpu_layers: int | None = None,
    use_mmap: bool = True,
    backend: str = "llamacpp",
    measurement: dict | None = None,
    gpu_offload_supported: bool = True,
) -> Plan:
    """``plan_model`` for one given context (tokens per sequence)."""
    ctx = int(n_ctx)
    kw = dict(
        n_ctx=ctx,
        n_parallel=n_parallel,
        flash_attn=flash_attn,
        use_mmap=use_mmap,
        backend=backend,
        measurement=measurement,
    )
    kv_choices = [kv_type] if kv_type else (["f16"] if flash_attn is False else ["f16", "q8_0"])
    has_gpu = bool(hw is not None and hw.gpus) and gpu_offload_supported
    best: Plan | None = None
    for kvt in kv_choices:
        if n_gpu_layers is not None or not has_gpu:
            p = evaluate(spec, hw, kv_type=kvt, n_gpu_layers=(n_gpu_layers or 0) if has_gpu else 0, **kw)
        else:
            p = _search_gpu(spec, hw, kvt, kw)
        if best is None or _better(p, best):
            if best is not None:
                gl = lambda n: max(0, min(n - 1, spec.n_layer))  # noqa: E731  (n_gpu_layers → repeating layers)
                p.reasons.append(
                    f"KV cache {kvt}: with {best.kv_type} KV only {gl(best.n_gpu_layers)} of "
                    f"{spec.n_layer} layers would be on the GPU (here {gl(p.n_gpu_layers)})"
                    + ("" if best.fits else " and it would not fit")
                )
            best = p
        if best.fits and (not has_gpu or best.n_gpu_layers >= spec.n_layer + 1) and not best.disk_backed_bytes:
            break
    if not has_gpu and hw is not None and hw.gpus:
        best.reasons.insert(0, "CPU only: this llama.cpp build has no GPU offload")
    return best


def _better(a: Plan, b: Plan) -> bool:
    """Fits beats not; then no disk-backed pages; then more layers on the GPU; then fewer experts on CPU."""
    ka = (a.fits, not a.disk_backed_bytes, a.n_gpu_layers, -a.n_cpu_moe)
    kb = (b.fits, not b.disk_backed_bytes, b.n_gpu_layers, -b.n_cpu_moe)
    return ka > kb


def _search_gpu(spec, hw, kv_type: str, kw: dict) -> Plan:
    n_layer = spec.n_layer
    one = _one_card(spec, hw, kv_type, kw)
    if one is not None:
        return one
    full = evaluate(spec, hw, kv_type=kv_type, n_gpu_layers=n_layer + 1, **kw)
    if full.fits:
        return full
    if spec.n_expert:  # experts of the first N layers to the CPU, everything else on the GPU
        lo, hi = 1, n_layer
        cand = evaluate(spec, hw, kv_type=kv_type, n_gpu_layers=n_layer + 1, n_cpu_moe=n_layer, **kw)
        if cand.fits:
            while lo < hi:
                mid = (lo + hi) // 2
                if evaluate(spec, hw, kv_type=kv_type, n_gpu_layers=n_layer + 1, n_cpu_moe=mid, **kw).fits:
                    hi = mid
                else:
                    lo = mid + 1
            return evaluate(spec, hw, kv_type=kv_type, n_gpu_layers=n_layer + 1, n_cpu_moe=lo, **kw)
    lo, hi = 0, n_layer  # largest n_gpu_layers that fits (VRAM grows with it)
    ncm = n_layer if spec.n_expert else 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if evaluate(spec, hw, kv_type=kv_type, n_gpu_layers=mid, n_cpu_moe=ncm, **kw).fits:
            lo = mid
        else:
            hi = mid - 1
    p = evaluate(spec, hw, kv_type=kv_type, n_gpu_layers=lo, n_cpu_moe=ncm, **kw)
    if lo < n_layer + 1 and p.fits:
        nxt = evaluate(spec, hw, kv_type=kv_type, n_gpu_layers=lo + 1, n_cpu_moe=ncm, **kw)
        extra = nxt.vram_bytes - p.vram_bytes
        p.reasons.insert(
            1,
            f"one more layer needs {_gib(extra)} more VRAM (weights + its KV for "
            f"{p.n_ctx}-token context): {_gib(nxt.vram_bytes)} > {_gib(p.vram_budget_bytes)} usable",
        )
    return p


def _one_card(spec, hw, kv_type: str, kw: dict) -> Plan | None:
    """Several GPUs and the whole model fits on one local card: that card alone (split_mode "none"), the
    fastest first (most bandwidth, then most memory). A layer split runs the cards one after another
    for every token, so two cards read the same bytes no faster than one, and add a PCIe hop per token,
    a CUDA context and a compute buffer per card (offload/devices.py); the other cards stay free. None
    when there is one GPU or no single card holds everything."""
    from localrun.offload import devices as D
    from localrun.offload import speed as S

    gpus = D.gpu_list_of(hw, None)
    if len(gpus) < 2:
        return None
    # a worker joins only when needed; an iGPU next to a graphics card is not in llama.cpp's list
    local = [i for i, g in enumerate(hw.gpus) if g.backend != "rpc" and any(g is x for x in gpus)]
    order = sorted(local, key=lambda i: (-S.gpu_tier(hw.gpus[i]).bandwidth_gbps, -hw.gpus[i].usable_bytes))
    for i in order:
        p = evaluate(spec, hw, kv_type=kv_type, n_gpu_layers=spec.n_layer + 1, gpu_indices=(i,), **kw)
        if p.fits:
            others = ", ".join(str(j) for j in range(len(hw.gpus)) if j != i)
            p.reasons.insert(1, f"one card: it fits on GPU {i} alone (split_mode none, main_gpu {i}), which "
                             f"decodes at least as fast as a layer split (the cards would run one after another, "
                             f"plus a hop per token) and leaves GPU {others} free")
            return p
    return None


def plan_gpu_indices(plan: Plan) -> tuple[int, ...] | None:
    """The ``gpu_indices`` that re-evaluate ``plan``'s device choice (one card for split_mode none)."""
    return (plan.main_gpu,) if plan.split_mode == "none" else None


def plan_for_run(
    spec,
    hardware,
    *,
    n_ctx: int | None = None,
    n_parallel: int = 1,
    kv_type: str | None = None,
    n_gpu_layers: int | None = None,
    flash_attn: bool | None = None,
    backend: str = "llamacpp",
    gpu_offload_supported: bool = True,
    measurement: dict | None = None,
) -> Plan:
    """The Plan chat/serve load: the planner's choice for ``spec`` on ``hardware``, with every flag given
    overriding it. ``n_ctx`` None lets the planner choose (see ``plan_model``); ``n_gpu_layers`` uses
    llama.cpp's meaning (-1 = all). ``measurement``: this machine's measured speeds
    (``localrun.machine.measurements.planner_measurement``), passed in by the caller so the planner does no I/O.
    The plan carries ``fits``, ``reasons`` and ``warnings``; pass it to ``check_fits`` before loading."""
    if n_gpu_layers is not None and n_gpu_layers < 0:
        n_gpu_layers = spec.n_layer + 1
    return plan_model(
        spec,
        hardware,
        n_ctx=n_ctx,
        n_parallel=n_parallel,
        kv_type=kv_type,
        flash_attn=flash_attn,
        n_gpu_layers=n_gpu_layers,
        backend=backend,
        measurement=measurement,
        gpu_offload_supported=gpu_offload_supported,
    )
