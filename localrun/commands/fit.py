"""`localrun fit [MODEL]`: will it run here, how, and how fast. Never imports a backend (< 0.5 s)."""

from __future__ import annotations

from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("fit")
    def fit(
        model: Optional[str] = typer.Argument(None, help="GGUF path, models.toml name (NAME or NAME:QUANT), "
                                              "or nothing for the embedded default."),
        ctx: Optional[int] = typer.Option(None, "--ctx", "--ctx-size", "-c", help="Context per sequence, tokens."),
        parallel: int = typer.Option(1, "--parallel", "-np", help="Sequences decoded together (serve)."),
        kv_type: Optional[str] = typer.Option(None, "--kv-type", help="KV-cache type: f16, q8_0, q4_0."),
        flash_attn: Optional[bool] = typer.Option(None, "--flash-attn/--no-flash-attn", "-fa", help="Flash attention."),
        vram: Optional[str] = typer.Option(None, "--vram", help="Describe another machine: GPU memory, e.g. 24GiB."),
        ram: Optional[str] = typer.Option(None, "--ram", help="System RAM, e.g. 64GiB."),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU name, e.g. 'RTX 4090' or 'Apple M3 Max'."),
        disk: Optional[str] = typer.Option(None, "--disk", help="Model disk: nvme, ssd or hdd."),
        preset: Optional[str] = typer.Option(None, "--preset", help="A named machine (nvidia-12gb, mac-36gb, "
                                             "laptop-16gb, …)."),
        rpc: Optional[str] = typer.Option(None, "--rpc", help="RPC workers host:port,… (`localrun worker` on "
                                          "other machines) to split the model over; needs the RPC build."),
        rpc_link: Optional[str] = typer.Option(None, "--rpc-link", help="The link to the workers as "
                                               "LAT_MS,GBPS (round trip ms, GB/s), instead of the measured one."),
        goal: str = typer.Option("balanced", "--goal", help="balanced, quality, speed or context."),
        cache_ram: str = typer.Option("auto", "--cache-ram", help="The KV snapshots' RAM tier to show (serve "
                                      "--cache-ram; auto: what serve picks)."),
        cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help="The KV snapshots' disk tier folder "
                                                "(serve --cache-dir)."),
        cache_disk: str = typer.Option("8GiB", "--cache-disk", help="Its budget (serve --cache-disk)."),
        mmproj: Optional[str] = typer.Option(None, "--mmproj", metavar="FILE", help="The vision projector to "
                                             "count (default: an mmproj-*.gguf beside the model file)."),
        no_mmproj_offload: bool = typer.Option(False, "--no-mmproj-offload", help="Plan the vision projector "
                                               "on the CPU (serve/chat --no-mmproj-offload)."),
        for_client: Optional[str] = typer.Option(None, "--for", metavar="CLIENT", help="Plan for an agent: "
                                                 "claude-code, codex or opencode (the context it needs, its "
                                                 "first prompt's TTFT, how tool calls are written)."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Plan a model for this (or another) machine: quantization, GPU layers, context, KV type, memory
        per tier (VRAM, RAM, disk-backed pages) and predicted speed. Exit 0 when it fits, 1 when not."""
        code = run_fit(model, ctx=ctx, parallel=parallel, kv_type=kv_type, flash_attn=flash_attn, vram=vram,
                       ram=ram, gpu=gpu, disk=disk, preset=preset, goal=goal, json_out=json_out, rpc=rpc,
                       rpc_link=rpc_link, cache_ram=cache_ram, cache_dir=cache_dir, cache_disk=cache_disk,
                       mmproj=mmproj, no_mmproj_offload=no_mmproj_offload, for_client=for_client)
        if code:
            raise SystemExit(code)  # click swallows typer.Exit when standalone_mode=False


def machine(*, preset=None, vram=None, ram=None, gpu=None, disk=None):
    """The HardwareProfile to plan for: a preset, else the detected machine, with --vram/--ram/--gpu/--disk
    applied on top. Raises ConfigError for a bad size or disk kind."""
    from localrun.errors import ConfigError
    from localrun.machine.hardware import DiskInfo, GpuInfo, apple_working_set_bytes, probe_hardware
    from localrun.units import parse_bytes

    if preset:
        from localrun.machine.presets import get_preset

        hw = get_preset(preset)
    else:
        hw = probe_hardware()
    ram_b = parse_bytes(ram, flag="--ram") if ram else None
    vram_b = parse_bytes(vram, flag="--vram") if vram else None
    if ram_b:
        hw.ram_total_bytes, hw.ram_available_bytes = ram_b, max(ram_b - (2 << 30), ram_b * 3 // 4)
        hw.label = (hw.label or "this machine") + f", RAM {ram}"
    if vram_b is not None or gpu:
        name = gpu or (hw.gpus[0].name if hw.gpus else "GPU")
        apple = "apple" in name.lower() or name.lower().startswith("m1") or name.lower().startswith("m2") \
            or name.lower().startswith("m3") or name.lower().startswith("m4")
        if apple:
            if not name.lower().startswith("apple"):
                name = "Apple " + name
            total = hw.ram_total_bytes
            hw.gpus = [GpuInfo(name=name, vendor="apple", backend="metal", total_bytes=total,
                               free_bytes=hw.ram_available_bytes, unified=True,
                               working_set_bytes=apple_working_set_bytes(total))]
        else:
            if vram_b is None:
                vram_b = hw.gpus[0].total_bytes if hw.gpus else 0
            hw.gpus = [GpuInfo(name=name, vendor="nvidia", backend="cuda", total_bytes=vram_b,
                               free_bytes=max(0, vram_b - (512 << 20)))] if vram_b else []
        shown = name if "gpu" in name.lower().split() else f"GPU {name}"  # not "GPU GPU" when unnamed
        hw.label = (hw.label or "this machine") + f", {shown}" + (f" {vram}" if vram else "")
    if disk:
        if disk not in ("nvme", "ssd", "hdd"):
            raise ConfigError(f"unknown disk kind {disk!r}", hint="use nvme, ssd or hdd")
        d = hw.disk or DiskInfo(path="", total_bytes=0, free_bytes=0)
        hw.disk = DiskInfo(d.path, d.total_bytes, d.free_bytes, disk)
    return hw


def run_fit(model, *, ctx=None, parallel=1, kv_type=None, flash_attn=None, vram=None, ram=None, gpu=None,
            disk=None, preset=None, goal="balanced", json_out=False, rpc=None, rpc_link=None, cache_ram="auto",
            cache_dir=None, cache_disk="8GiB", mmproj=None, no_mmproj_offload=False, for_client=None) -> int:
    """Plan, print, and return the exit status (0 fits, 1 nothing fits). ``rpc``: workers host:port,…
    whose devices join the split (``backends.hardware_with_workers``; BackendUnavailableError without the RPC
    build); ``rpc_link``: ``LAT_MS,GBPS`` for their link (``offload.links.parse_link``).
    ``cache_ram``/``cache_dir``/``cache_disk``: the KV tiers to show (serve's flags; ``kv_tiers_for``).
    ``mmproj``: the vision projector counted with a model file (default: the one beside it; a catalog entry's
    own projector when planned from the catalog); ``no_mmproj_offload``: plan it in RAM. ``for_client``: an
    agent of ``localrun.clients`` (``--for``): its context is the default ``ctx``, and the plan says whether
    the client's session fits, its first prompt's TTFT and the tool-call format (``client_facts``)."""
    from localrun.errors import ConfigError
    from localrun.machine.measurements import planner_measurement
    from localrun.store.info import plan_model_here

    if kv_type and kv_type.lower() not in ("f16", "q8_0", "q4_0", "f32", "bf16", "q4_1", "q5_0", "q5_1"):
        raise ConfigError(f"unknown KV-cache type {kv_type!r}", hint="use f16, q8_0 or q4_0")
    if parallel < 1 or (ctx is not None and ctx < 1):
        raise ConfigError("--ctx and --parallel must be positive")
    client = None
    if for_client:
        from localrun.clients import get_client

        client = get_client(for_client)[1]
        ctx = ctx or client.n_ctx
    link = None
    if rpc_link is not None:
        from localrun.offload.links import parse_link

        if not rpc:
            raise ConfigError("--rpc-link describes the link to RPC workers", hint="add --rpc host:port,…")
        lk = parse_link(rpc_link)
        link = {"latency_s": lk.latency_s, "bandwidth_gbps": lk.bandwidth_gbps, "source": lk.source}
    hw = machine(preset=preset, vram=vram, ram=ram, gpu=gpu, disk=disk)
    if rpc:  # each worker's free/total memory, and its link timed (8 MiB each way) unless --rpc-link
        from localrun.backends import hardware_with_workers, parse_endpoints
        from localrun.machine.rpc import require_rpc

        endpoints = parse_endpoints(rpc)
        require_rpc(what="fit --rpc")
        hw = hardware_with_workers(hw, endpoints, time_link=True, link=link)
    detected = not (preset or vram or ram or gpu or disk)
    tier_args = _tier_args(hw, detected, cache_ram, cache_dir, cache_disk)  # bad sizes fail before planning
    meas = planner_measurement("llamacpp") if detected else None  # measured speeds describe THIS machine
    title, chosen, plans = plan_model_here(model, hw, n_ctx=ctx, n_parallel=parallel, kv_type=kv_type,
                                           flash_attn=flash_attn, goal=goal, measurement=meas)
    if chosen is not None:
        chosen.no_mmproj_offload = no_mmproj_offload
        if chosen.source == "file" or mmproj:
            _add_projector(model, chosen, mmproj)
        elif chosen.source == "catalog":
            _add_catalog_projector(model, chosen)
    if chosen is not None and chosen.devices and chosen.source == "file" and (rpc or (detected and hw.gpus)):
        _measure_compute(model, chosen)  # the devices are real: llama.cpp's dry run sizes their compute buffers
    if json_out:
        from localrun.render import print_json

        best = chosen or plans[0]
        d = best.to_dict()
        d["kv_tiers"] = kv_tiers_for(best, hw, **tier_args).to_dict()
        d["fits"] = chosen is not None and chosen.fits
        d["warnings"] = _warnings(best, plans)
        d["machine"] = hw.label or "this machine"
        if client is not None:
            d["client"] = client_facts(client, best, model)
        keys = ("quant", "source", "quality_kld", "fits", "n_ctx", "n_gpu_layers", "n_cpu_moe", "kv_type", "split_mode",
                "weights_bytes", "vram_bytes", "ram_bytes", "disk_backed_bytes", "decode_tok_s", "prefill_tok_s")
        d["alternatives"] = [{k: pd[k] for k in keys} for pd in (p.to_dict() for p in plans)]  # to_dict once
        print_json(d)
    else:
        _render(title, hw, chosen, plans, tier_args)
        if client is not None:
            _render_client(client_facts(client, chosen or plans[0], model))
    return 0 if chosen is not None and chosen.fits else 1


def client_facts(client, plan, model) -> dict:
    """What ``plan`` gives ``client`` (a ``localrun.clients.Client``): ``{"client", "api", "n_ctx_needed",
    "n_ctx", "fits_session", "fits_first_prompt", "first_prompt_tokens", "ttft_first_prompt_s", "tool_calls",
    "advice"}``. Tokens and seconds; TTFT = first prompt / the plan's prefill tok/s (``offload.speed``).
    ``tool_calls``: the template's own tool-call family, ``generic`` (serve's fallback for a template with no
    tool syntax: the tools described in a system message, the reply constrained to a call or an answer) or,
    for a model not on disk, ``"template's own, else generic"``. Never raises."""
    tools = "template's own, else generic"
    if plan.source == "file":
        try:
            from localrun.server.facts import file_capabilities
            from localrun.store.resolve import resolve_model

            tools = file_capabilities(str(resolve_model(model)), generic_tools=True).tool_calls or "none"
        except Exception:  # noqa: BLE001 - a fact we cannot read is left general, never an error
            pass
    n = plan.n_ctx
    advice = []
    if n < client.n_ctx:
        advice.append(f"{client.name} needs a {client.n_ctx}-token context and this plan has {n}: "
                      + ("its first prompt fits, but a session outgrows it within a few turns"
                         if n >= client.first_prompt else "its first prompt does not fit (\"prompt is too long\")")
                      + f"; try --ctx {client.n_ctx} with --kv-type q8_0, or a smaller quantization")
    if plan.n_ctx_train and plan.n_ctx_train < client.n_ctx:
        advice.append(f"the model was trained to {plan.n_ctx_train} tokens: past that, RoPE is stretched and "
                      f"answers degrade; a model trained to ≥ {client.n_ctx} serves {client.name} better")
    ttft = client.first_prompt / plan.prefill_tok_s if plan.prefill_tok_s > 0 else None
    return {"client": client.name, "api": client.api, "n_ctx_needed": client.n_ctx, "n_ctx": n,
            "fits_session": n >= client.n_ctx, "fits_first_prompt": n >= client.first_prompt,
            "first_prompt_tokens": client.first_prompt,
            "ttft_first_prompt_s": round(ttft, 1) if ttft is not None else None, "tool_calls": tools,
            "advice": advice}


def _render_client(f: dict) -> None:
    from localrun.render import stdout

    con = stdout()
    ok = "[green]enough[/]" if f["fits_session"] else "[red]too small[/]"
    ttft = f"{f['ttft_first_prompt_s']:g} s" if f["ttft_first_prompt_s"] is not None else "unknown"
    con.print(f"[bold]For {f['client']}[/] ({f['api']}): needs a {f['n_ctx_needed']}-token context, this plan "
              f"has {f['n_ctx']} ({ok}); its first prompt (≈ {f['first_prompt_tokens']} tokens: system prompt "
              f"and tool schemas) takes ≈ {ttft} to prefill, later turns reuse it from the prefix cache; tool "
              f"calls: {f['tool_calls']}", highlight=False)
    for a in f["advice"]:
        con.print(f"  • {a}", highlight=False)


def _add_catalog_projector(model, plan) -> None:
    """Count the catalog entry's projector (models.toml ``[model.mmproj]``, ``offload.vision``): the weights
    are its file's size on the hub, the compute buffer and image tokens come from its vision dimensions. A
    projector localrun cannot use yet (``refused``) is a warning instead: the plan is text only."""
    from localrun.model.catalog import get_entry
    from localrun.offload.vision import add_vision, vision_from_catalog

    e = get_entry(model) if model else None
    mm = e.mmproj if e is not None else {}
    if not mm:
        return
    if mm.get("refused"):
        plan.warnings.append(f"images: {mm['refused']}; this plan is text only, and `localrun pull` leaves the "
                             f"projector ({mm['repo']}/{mm['file']}) on the hub")
        return
    add_vision(plan, int(mm["bytes"]), vision_from_catalog(mm, e.n_embd),
               source=f"the catalog: {mm['repo']}/{mm['file']}")


def _add_projector(model, plan, mmproj) -> None:
    """Count the model file's vision projector in ``plan`` (``offload.plan.add_projector``): ``mmproj``, else
    the ``mmproj-*.gguf`` beside the file; nothing without one."""
    from localrun.loading import find_mmproj
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import add_projector
    from localrun.store.resolve import resolve_model

    path = mmproj or find_mmproj(resolve_model(model))
    if path:
        add_projector(plan, read_gguf(str(path)))


def _measure_compute(model, plan) -> None:
    """Each device's compute buffer as llama.cpp's dry run reserves it (``backends.measure_compute``), in
    place of the planner's estimate; a warning when that no longer fits, or when the dry run fails."""
    from localrun.backends import apply_measured_compute, measure_compute
    from localrun.errors import LocalrunError
    from localrun.offload.plan import split_reason
    from localrun.store.resolve import resolve_model

    try:
        measured = measure_compute(str(resolve_model(model)), plan)
    except LocalrunError as e:
        plan.warnings.append(f"llama.cpp's dry run failed ({e}); the compute buffers are the planner's estimate")
        return
    before = split_reason(plan, plan.n_layers)
    if apply_measured_compute(plan, measured):
        plan.reasons.append("compute buffers per device: llama.cpp's own dry run (no_alloc), not an estimate")
    plan.reasons = [split_reason(plan, plan.n_layers) if r == before else r for r in plan.reasons]
    over = [d for d in plan.devices if not d["fits"]]
    for d in over:
        plan.warnings.append(f"device {d['index']} ({d.get('endpoint') or d['name']}) needs "
                             f"{(d['total_bytes'] - d['budget_bytes']) / 2**20:.0f} MiB more than it has once "
                             "llama.cpp's compute buffer is counted: lower --ctx or use --kv-type q8_0")


def _tier_args(hw, detected: bool, cache_ram: str, cache_dir, cache_disk: str) -> dict:
    """serve's --cache-ram/--cache-dir/--cache-disk → ``kv_tiers_for`` keywords; the disk kind of
    ``cache_dir`` when this machine is planned (else the described machine's disk). Raises ConfigError."""
    from localrun.units import parse_bytes

    ram = cache_ram.strip().lower()
    kind = hw.disk.kind if hw.disk else None
    if cache_dir is not None and detected:
        from pathlib import Path

        from localrun.machine.hardware import probe_disk

        p = Path(cache_dir).expanduser().absolute()
        while not p.exists() and p.parent != p:
            p = p.parent
        kind = probe_disk(p).kind
    return {"cache_ram_bytes": None if ram == "auto" else 0 if ram in ("0", "off") else
            parse_bytes(cache_ram, flag="--cache-ram"), "cache_dir": cache_dir,
            "cache_disk_bytes": parse_bytes(cache_disk, flag="--cache-disk"), "disk_kind": kind}


def kv_tiers_for(plan, hw, **kw):
    """The KV tiers (``offload.kv_tiers.KvTierPlan``) of ``plan`` on ``hw``: keywords of ``_tier_args``."""
    from localrun.offload.kv_tiers import plan_kv_tiers

    return plan_kv_tiers(plan, hw.ram_available_bytes, **kw)


def _tiers_line(t) -> str:
    """One line on the KV tiers: budgets, and a full context's snapshot restored from each tier."""
    from localrun.machine.hardware import fmt_bytes

    ram = f"RAM {fmt_bytes(t.ram_bytes)}" + (" (default)" if t.ram_source.startswith("default") else "") \
        if t.ram_bytes else "RAM off"
    disk = (f"disk {fmt_bytes(t.disk_bytes)} in {t.disk_dir}" if t.disk_dir is not None
            else "disk off (serve --cache-dir DIR)")
    prefill = f", prefill ≈ {t.prefill_s:.2g} s" if t.prefill_s else ""
    return (f"  KV tiers: {ram} · {disk} · a snapshot of {t.snapshot_tokens} tokens ({fmt_bytes(t.snapshot_bytes)}) "
            f"restores in ≈ {t.restore_ram_s:.2g} s from RAM, ≈ {t.restore_disk_s:.2g} s from disk "
            f"({t.disk_kind}, {t.disk_read_gbps:g} GB/s){prefill}")


def _checkpoints_line(t) -> str:
    """One line on a hybrid's context checkpoints (``offload.kv_tiers.checkpoint_budget``): how many of which
    size, their RAM at most, and the RAM serve holds with the model and the RAM tier."""
    from localrun.machine.hardware import fmt_bytes
    from localrun.offload.kv_tiers import CHECKPOINTS_MIN_BYTES, CHECKPOINTS_PER_SLOT, CHECKPOINTS_RAM_SHARE

    return (f"  context checkpoints: up to {t.checkpoints_max} × {fmt_bytes(t.checkpoint_bytes)} (a sequence's "
            f"recurrent state; {CHECKPOINTS_PER_SLOT} per sequence, in all ≤ {CHECKPOINTS_RAM_SHARE:.0%} of the "
            f"RAM the model leaves, ≥ {fmt_bytes(CHECKPOINTS_MIN_BYTES)}) = RAM "
            f"{fmt_bytes(t.checkpoints_ram_bytes)} · RAM in all ≤ {fmt_bytes(t.ram_total_bytes)} (model + RAM "
            "tier + checkpoints)")


def _render(title, hw, chosen, plans, tier_args=None) -> None:
    from rich.table import Table

    from localrun.machine.hardware import fmt_bytes
    from localrun.render import stdout

    con = stdout()
    where = hw.label or "this machine"
    for w in _warnings(chosen or plans[0], plans):
        con.print(f"[yellow]warning:[/] {w}", highlight=False)
    if chosen is None or not chosen.fits:  # not chosen.fits: its vision projector did not fit next to it
        con.print(f"[bold red]{title} does not fit[/] on {where}.")
        for r in (chosen or plans[0]).reasons:
            con.print(f"  • {r}", highlight=False)
    else:
        p = chosen
        con.print(f"[bold]{title}[/] on {where}: [green]{p.quant}[/], {p.n_ctx}-token context, "
                  f"{p.kv_type} KV, {_gpu_layers_text(p)}", highlight=False)
        con.print(f"  VRAM {fmt_bytes(p.vram_bytes)} · RAM {fmt_bytes(p.ram_bytes)} "
                  f"(anonymous {fmt_bytes(p.ram_anon_bytes)}, page cache {fmt_bytes(p.page_cache_bytes)}) · "
                  f"disk-backed {fmt_bytes(p.disk_backed_bytes)} · decode ≈ {p.decode_tok_s:.1f} tok/s · "
                  f"prefill ≈ {p.prefill_tok_s:.0f} tok/s", highlight=False)
        for r in p.reasons:
            con.print(f"  • {r}", highlight=False)
        tiers = kv_tiers_for(p, hw, **(tier_args or {}))
        con.print(_tiers_line(tiers), highlight=False)
        if tiers.checkpoints_max:
            con.print(_checkpoints_line(tiers), highlight=False)
        if len(hw.gpus) > 1 and p.devices:
            con.print(_devices_table(p))
    t = Table(title="alternatives", header_style="bold")
    for col in ("quant", "quality loss (KLD)", "weights", "where", "context", "decode tok/s", "prefill tok/s", ""):
        t.add_column(col)
    for p in plans:
        if not p.fits:
            place = "does not fit"
        elif p.disk_backed_bytes:
            place = f"disk-backed {fmt_bytes(p.disk_backed_bytes)}"
        elif p.vram_bytes and p.n_gpu_layers > p.n_layers and not p.n_cpu_moe:
            place = "all on GPU"
        elif p.vram_bytes:
            place = f"{max(0, p.n_gpu_layers - 1)}/{p.n_layers} layers on GPU"
        else:
            place = "CPU (RAM)"
        mark = "← chosen" if p is chosen else ("" if p.source in ("file", "catalog") else "other file")
        t.add_row(p.quant, f"{p.quality_kld:g}", fmt_bytes(p.weights_bytes), place, str(p.n_ctx),
                  f"{p.decode_tok_s:.1f}", f"{p.prefill_tok_s:.0f}", mark)
    con.print(t)


def _warnings(best, plans) -> list[str]:
    """The chosen plan's warnings (incomplete file, context beyond training, rounding), each once."""
    out: list[str] = []
    for w in [*best.warnings, *(w for p in plans if p.source == "file" for w in p.warnings)]:
        if w not in out:
            out.append(w)
    return out


def _gpu_layers_text(p) -> str:
    """llama.cpp counts the output layer as one more "layer" and offloads the last n_gpu_layers of the
    n_layer + 1 (src/llama-model.cpp: i_gpu_start = n_layer + 1 - n_gpu_layers): n_gpu_layers = k ≥ 1 is
    k - 1 repeating layers + the output layer. Say it in both terms so it agrees with the reasons."""
    if p.n_gpu_layers <= 0:
        return f"all {p.n_layers} layers on the CPU (n_gpu_layers 0)"
    on = min(p.n_gpu_layers - 1, p.n_layers)
    return f"{on} of {p.n_layers} layers + output on the GPU (n_gpu_layers {p.n_gpu_layers})"


def _devices_table(p):
    """One row per device of ``p``: its layers and its bytes (weights, KV, compute buffer, CUDA context)."""
    from rich.table import Table

    from localrun.machine.hardware import fmt_bytes

    mode = {"none": "one GPU", "layer": "split by layer", "row": "split by rows"}.get(p.split_mode, p.split_mode)
    t = Table(title=f"per device ({mode}" + (f", tensor_split {','.join(f'{x:g}' for x in p.tensor_split)})"
                                           if p.tensor_split else ")"), header_style="bold")
    for col in ("device", "layers", "weights", "KV cache", "compute", "CUDA ctx", "total", "usable"):
        t.add_column(col)
    for d in p.devices:
        lay = f"{d['layers'][0]}-{d['layers'][1] - 1}" if d["layers"] else "-"
        t.add_row(f"GPU {d['index']} {d['name']}", lay + (" + output" if d["output"] else ""),
                  fmt_bytes(d["weights_bytes"]), fmt_bytes(d["kv_bytes"]), fmt_bytes(d["compute_bytes"]),
                  fmt_bytes(d["overhead_bytes"]), fmt_bytes(d["total_bytes"]), fmt_bytes(d["budget_bytes"]))
    return t
