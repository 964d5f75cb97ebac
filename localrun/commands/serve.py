"""`localrun serve [MODEL]`: the OpenAI- and Ollama-compatible HTTP API (see localrun/server/)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import List, Optional

import typer


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; any other name or address counts as exposed."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None, insecure: bool) -> None:
    """Refuse to expose the API beyond this machine without a key. Raises ConfigError."""
    from localrun.errors import ConfigError

    if not is_loopback(host) and not api_key and not insecure:
        raise ConfigError(
            f"refusing to listen on {host} without an API key: anyone who can reach this machine could use it",
            hint="set --api-key KEY (or LOCALRUN_API_KEY), bind --host 127.0.0.1, or pass --insecure if the "
            "network is trusted")


def check_port_free(host: str, port: int) -> None:
    """Fail fast (before loading the model) when ``host:port`` cannot be bound. Raises ConfigError."""
    import errno
    import socket

    from localrun.errors import ConfigError

    if not 0 <= port <= 65535:
        raise ConfigError(f"port {port} is out of range", hint="use a port from 1 to 65535 (default 11500)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as e:
            if isinstance(e, socket.gaierror):
                hint = f"{host!r} is not a host name or address this machine can resolve: check --host"
            elif e.errno == errno.EADDRNOTAVAIL:
                hint = (f"{host} is not an address of this machine: use 127.0.0.1, 0.0.0.0 (all interfaces) "
                        "or one of its own addresses")
            elif e.errno == errno.EACCES:
                hint = "ports below 1024 need administrator rights: pick a higher --port"
            else:
                hint = "another server uses this port: pick another with --port (or LOCALRUN_PORT)"
            raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror or e})", hint=hint) from None


def parse_max_body(text: str) -> int:
    """``--max-body`` ('8MiB', '512KiB', '1GiB') → bytes. Raises ConfigError for other text or a size
    under 1 KiB (no request fits in less)."""
    from localrun.errors import ConfigError
    from localrun.machine.hardware import parse_bytes

    try:
        n = parse_bytes(text)
    except ValueError as e:
        raise ConfigError(f"--max-body: {e}", hint="give a size with a unit, e.g. --max-body 8MiB") from None
    if n < 1024:
        raise ConfigError(f"--max-body {text} is {n} bytes: too small for any request",
                          hint="give a size with a unit, e.g. --max-body 8MiB (the default)")
    return n


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        click_ctx: typer.Context,
        model: Optional[List[str]] = typer.Argument(None,
            help="Models to load at start-up (.gguf paths or names `localrun ls` shows). None: the server starts "
                 "empty and loads each model on its first request (no `model` field: the embedded SmolLM2)."),
        host: Optional[str] = typer.Option(None, "--host", help="Address to bind (default 127.0.0.1; LOCALRUN_HOST)."),
        port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
            help="Port (default 11500; LOCALRUN_PORT)."),
        api_key: Optional[str] = typer.Option(None, "--api-key",
            help="Require 'Authorization: Bearer KEY' (LOCALRUN_API_KEY)."),
        insecure: bool = typer.Option(False, "--insecure", help="Allow a non-loopback --host without an API key."),
        cors_origin: List[str] = typer.Option([], "--cors-origin",
            help="Allow browser requests from this origin (repeatable)."),
        parallel: int = typer.Option(4, "--parallel", "-np", min=1, max=256,
            help="Sequences decoded together (llama.cpp; MLX serves one at a time)."),
        backend: Optional[str] = typer.Option(None, "--backend",
            help="llamacpp or mlx (default: LOCALRUN_BACKEND, else llamacpp). MLX serves requests one at a time."),
        ctx: Optional[int] = typer.Option(None, "--ctx", "--ctx-size", "-c", min=64,
            help="Context per sequence, tokens."),
        kv_type: Optional[str] = typer.Option(None, "--kv-type", help="KV-cache type: f16, q8_0, q4_0."),
        n_gpu_layers: Optional[int] = typer.Option(None, "--n-gpu-layers", "-ngl",
            help="Layer slots on the GPUs / RPC workers (default: the plan's; -1 = all), the rest on the CPU."),
        flash_attn: Optional[bool] = typer.Option(None, "--flash-attn/--no-flash-attn", "-fa",
            help="Flash attention (default: the plan's: on with a GPU, off on the CPU)."),
        max_queue: int = typer.Option(64, "--max-queue", min=1,
            help="Requests that may wait for a slot (503 past it)."),
        max_body: str = typer.Option("8MiB", "--max-body",
            help="Largest request body, e.g. 8MiB, 512KiB (413 past it)."),
        chat_template: Optional[str] = typer.Option(None, "--chat-template",
            help="chatml|llama3|gemma|mistral|phi3|FILE."),
        alias: Optional[str] = typer.Option(None, "--alias", help="Model id reported to clients (default: file name)."),
        mmproj: Optional[Path] = typer.Option(None, "--mmproj", metavar="FILE",
            help="Vision projector GGUF for the model named first (images in; default: an mmproj-*.gguf beside it)."),
        no_mmproj_offload: bool = typer.Option(False, "--no-mmproj-offload",
            help="Keep vision projectors on the CPU (default: on the GPU with the model's layers)."),
        allow_image_urls: bool = typer.Option(False, "--allow-image-urls",
            help="Fetch http(s) image URLs in requests (public hosts only, 20 MiB at most). Off: data: URLs and "
                 "base64 only."),
        threads: Optional[int] = typer.Option(None, "--threads", "-t", min=1,
            help="CPU threads (default: physical cores)."),
        force: bool = typer.Option(False, "--force", help="Load even when the plan says it does not fit."),
        log_prompts: bool = typer.Option(False, "--log-prompts", help="Include prompt text in the request log."),
        parse_special_in_content: bool = typer.Option(False, "--parse-special-in-content",
            help="Read control-token text in chat messages (e.g. <|im_end|>) as control tokens. Off: message text "
                 "is always text, so a message cannot end its own turn. Only for trusted clients."),
        parse_special_in_prompt: bool = typer.Option(True, "--parse-special-in-prompt/--no-parse-special-in-prompt",
            help="Raw prompts (/v1/completions, /api/generate with raw) may hold control tokens written as text "
                 "(<|im_start|>), as in llama-server."),
        stop_loops: bool = typer.Option(False, "--stop-loops",
            help="End a generation that repeats itself in a cycle (finish_reason stop; off by default: OpenAI's "
                 "semantics). A request's own stop_loops field wins."),
        n_predict: Optional[int] = typer.Option(None, "--n-predict", "-n", min=1,
            help="Most tokens any answer generates (llama-server's --n-predict): a request asking for more, or "
                 "for no limit, gets this many and ends with finish_reason \"length\". Default: no cap."),
        reasoning_budget: Optional[int] = typer.Option(None, "--reasoning-budget", min=0,
            help="Default thinking budget in tokens for thinking models: when it runs out the server closes the "
                 "thinking block and the model answers (0: no thinking). A request's reasoning_effort, Ollama "
                 "think level or Anthropic budget_tokens wins."),
        generic_tools: bool = typer.Option(True, "--generic-tools/--no-generic-tools",
            help="Tool calls for models whose chat template has no tool syntax (llama-server's generic format: "
                 "the tools described in a system message, the answer constrained to a call or a reply). Off: "
                 "such requests are refused (Ollama's \"does not support tools\")."),
        keep_alive: List[str] = typer.Option([], "--keep-alive",
            help="How long an idle model stays loaded: 5m (default), 1h, 30s, 0 (unload after each request), -1 "
                 "(never); NAME=DURATION sets one model's default (repeatable). A request's keep_alive wins."),
        pin: List[str] = typer.Option([], "--pin",
            help="Load NAME at start-up and never unload or evict it (repeatable)."),
        max_memory: Optional[str] = typer.Option(None, "--max-memory",
            help="RAM the loaded models may use together, e.g. 8GiB (default: what is free at start-up)."),
        max_vram: Optional[str] = typer.Option(None, "--max-vram",
            help="VRAM the loaded models may use on each GPU, e.g. 20GiB (default: what is free at start-up)."),
        max_models: Optional[int] = typer.Option(None, "--max-models", min=1,
            help="At most this many models loaded at once (idle ones are unloaded, least recently used first)."),
        load_timeout: float = typer.Option(120.0, "--load-timeout", min=0.0,
            help="Seconds a request waits for memory held by busy models before a 503."),
        cache_ram: str = typer.Option("auto", "--cache-ram",
                                      help="Host RAM for KV-cache snapshots of reused slots, per model (0: off; "
                                           "auto: a quarter of the RAM left after loading, at most 8GiB)."),
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir",
                                                 help="Folder for the disk tier of KV snapshots (kept across "
                                                      "restarts; one subfolder per model)."),
        cache_disk: str = typer.Option("8GiB", "--cache-disk", help="Disk budget of --cache-dir, per model."),
        spec_mode: Optional[str] = typer.Option(None, "--spec", metavar="auto|ngram|draft|off",
            help="Speculative decoding (llama.cpp): prompt lookup or a draft model, verified inside the batch; "
                 "auto turns itself off where it would lose. Off by default (auto with --draft-model): not "
                 "lossless on the CPU (a verify step takes other kernels than a one-token step: logprobs move "
                 "by up to ~0.3 nat and greedy or seeded text can change where the top-2 margin is below "
                 "~0.3; docs/chat.md, Not exact)."),
        draft_model: Optional[str] = typer.Option(None, "--draft-model", metavar="MODEL",
            help="A small model with the same vocabulary, drafting for the models that share it (--spec)."),
        draft_max: Optional[int] = typer.Option(None, "--draft-max", min=0, metavar="N",
            help="Drafted tokens per verify step at most (default 16; the engine adapts below it)."),
        log_level: str = typer.Option("info", "--log-level", help="debug|info|warning|error."),
        rpc: Optional[str] = typer.Option(None, "--rpc", help="RPC workers host:port,… (`localrun worker`, "
            "llama.cpp rpc-server) to split the model over, planned per device; the model then runs in a runner "
            "process this one restarts if a worker goes away (503 meanwhile)."),
        responses_db: Optional[Path] = typer.Option(None, "--responses-db",
            help="SQLite file of the stored Responses API responses (default: responses.db in localrun's home)."),
        rpc_runner: bool = typer.Option(False, "--rpc-runner", hidden=True,
            help="Internal: this process is serve --rpc's runner."),
    ) -> None:
        """Serve MODEL over HTTP: OpenAI (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models)
        and Ollama (/api/chat, /api/generate, /api/tags, /api/show, /api/ps) wire formats, with continuous
        batching, prefix caching, /health and Prometheus /metrics.

        A request without max_tokens (or with more than the context has room for) generates until the \
        model stops, a stop string matches, or the sequence's context (--ctx) is full: then it ends with \
        finish_reason "length".

        --parallel requests run at once and --max-queue more wait; past that the server answers 503. \
        Ctrl-C (SIGINT) or SIGTERM ends running generations and exits at once.

        Several models: a request's `model` field picks one (any name `localrun ls` shows); a model not \
        loaded loads on its first request, after idle models are unloaded (least recently used first) when \
        the planner says it does not fit next to them (--max-memory, --max-vram, --max-models). A model \
        serving a request is never unloaded. An idle model unloads after --keep-alive.

        With --backend mlx the same API runs on MLX, one request at a time (later requests wait in the \
        queue, and prefix caching reuses the previous request's KV); /v1/embeddings gives the same \
        mean-pooled vectors as on llama.cpp."""
        from localrun.config import get_settings
        from localrun.errors import ConfigError

        if log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise ConfigError(f"unknown --log-level {log_level!r}", hint="use debug, info, warning or error")
        max_body_bytes = parse_max_body(max_body)
        residency = parse_residency(keep_alive, max_memory, max_vram, max_models, pin, load_timeout)
        kv_tiers = parse_kv_tiers(cache_ram, cache_dir, cache_disk)
        settings = get_settings(host=host, port=port, api_key=api_key)
        from localrun.backends.spec_decode import spec_mode_or_default
        from localrun.server.spec_options import SpecOptions

        spec_mode = spec_mode_or_default(spec_mode, draft_model)

        speculation = SpecOptions(spec_mode, draft_model, draft_max).check(settings.models_dir)
        check_bind(settings.host, settings.api_key, insecure)
        check_port_free(settings.host, settings.port)
        if rpc and not rpc_runner:  # llama.cpp's RPC client aborts its process when a worker dies: a runner
            from localrun.commands.serve_rpc import serve_with_runner

            return serve_with_runner(click_ctx, settings, rpc, log_level=log_level)
        from localrun.backends import hardware_for

        run_server(settings, models=list(model or []), residency=residency, kv_tiers=kv_tiers, parallel=parallel,
                   ctx=ctx,
                   max_queue=max_queue, backend=backend,
                   max_body_bytes=max_body_bytes,
                   kv_type=kv_type, flash_attn=flash_attn,
                   chat_template=chat_template, alias=alias, threads=threads, force=force,
                   cors_origins=cors_origin, log_prompts=log_prompts, log_level=log_level,
                   parse_special_in_content=parse_special_in_content, parse_special_in_prompt=parse_special_in_prompt,
                   stop_loops=stop_loops, reasoning_budget=reasoning_budget, generic_tools=generic_tools,
                   n_predict=n_predict,
                   hardware=hardware_for(rpc, settings.models_dir), n_gpu_layers=n_gpu_layers,
                   speculation=speculation, responses_db=responses_db, mmproj=mmproj,
                   allow_image_urls=allow_image_urls, no_mmproj_offload=no_mmproj_offload)


def parse_residency(keep_alive: list[str], max_memory: str | None, max_vram: str | None,
                    max_models: int | None, pins: list[str], load_timeout_s: float = 120.0) -> dict:
    """The multi-model flags → ``make_registry`` keywords. Raises ConfigError naming the flag."""
    from localrun.errors import ConfigError
    from localrun.server.errors import RequestError
    from localrun.server.keepalive import DEFAULT_KEEP_ALIVE_S, parse_keep_alive
    from localrun.units import parse_bytes

    default, per_model = DEFAULT_KEEP_ALIVE_S, {}
    for item in keep_alive:
        name, eq, value = item.rpartition("=")
        try:
            secs = parse_keep_alive(value, "--keep-alive")
        except RequestError as e:
            raise ConfigError(e.message, hint='use e.g. --keep-alive 5m, --keep-alive 0, --keep-alive -1 or '
                              '--keep-alive NAME=1h') from None
        if eq:
            per_model[name] = secs
        else:
            default = secs
    return {"keep_alive_s": default, "keep_alive_by_model": per_model, "pins": tuple(pins),
            "max_ram_bytes": parse_bytes(max_memory, flag="--max-memory") if max_memory else None,
            "max_vram_bytes": parse_bytes(max_vram, flag="--max-vram") if max_vram else None,
            "max_models": max_models, "load_wait_s": load_timeout_s}


def parse_kv_tiers(cache_ram: str, cache_dir: Path | None, cache_disk: str) -> dict | None:
    """--cache-ram/--cache-dir/--cache-disk → ``kv_cache.attach_kv_cache`` keywords, None when both tiers are
    off. ``--cache-ram auto`` → ``ram_bytes`` None (the default: ``offload.kv_tiers.default_cache_ram_bytes``
    of the RAM free once the model is loaded). Raises ConfigError naming the flag."""
    from localrun.units import parse_bytes

    def size(text: str, flag: str) -> int:
        return 0 if text.strip() in ("0", "off") else parse_bytes(text, flag=flag)

    ram = None if cache_ram.strip().lower() == "auto" else size(cache_ram, "--cache-ram")
    disk = size(cache_disk, "--cache-disk") if cache_dir is not None else 0
    if ram == 0 and not disk:
        return None
    return {"ram_bytes": ram, "disk_dir": cache_dir, "disk_bytes": disk}


def make_registry(settings, options, *, parallel: int = 4, ctx: int | None = None, backend: str | None = None,
                  kv_type: str | None = None, flash_attn: bool | None = None, threads: int | None = None,
                  force: bool = False, keep_alive_s: float | None = None, keep_alive_by_model: dict | None = None,
                  pins: tuple = (), max_ram_bytes: int | None = None, max_vram_bytes: int | None = None,
                  max_models: int | None = None, load_wait_s: float = 120.0, hardware=None,
                  kv_tiers: dict | None = None, n_gpu_layers: int | None = None, speculation=None):
    """The server's ``ModelRegistry``: the machine probed once (``hardware``, default: now), its free memory
    capped by ``max_ram_bytes``/``max_vram_bytes`` as the budget every model is planned against."""
    from localrun.machine.hardware import probe_hardware
    from localrun.server.keepalive import DEFAULT_KEEP_ALIVE_S
    from localrun.server.loader import PlannerLoader, budget_hardware
    from localrun.server.metrics import ServerMetrics
    from localrun.server.models import ModelRegistry

    hw, budget = budget_hardware(hardware or probe_hardware(settings.models_dir), max_ram_bytes=max_ram_bytes,
                                 max_vram_bytes=max_vram_bytes, max_models=max_models)
    loader = PlannerLoader(settings, hw, backend=backend, n_ctx=ctx, n_parallel=parallel, kv_type=kv_type,
                           flash_attn=flash_attn, n_threads=threads, force=force)
    loader.kv_tiers = kv_tiers
    loader.n_gpu_layers = n_gpu_layers
    loader.speculation = speculation  # server.spec_options.SpecOptions (--spec), None: off
    return ModelRegistry(settings, options, ServerMetrics(), loader=loader, budget=budget,
                         keep_alive_s=DEFAULT_KEEP_ALIVE_S if keep_alive_s is None else keep_alive_s,
                         keep_alive_by_model=keep_alive_by_model, pins=pins, load_wait_s=load_wait_s)


def load_for_serving(model: str | None, settings, *, parallel: int, ctx: int | None, threads: int | None,
                     force: bool, chat_template: str | None, backend: str | None = None,
                     kv_type: str | None = None, flash_attn: bool | None = None):
    """MODEL → (engine, plan, hardware dict). Raises ModelNotFoundError, InsufficientMemoryError, …

    ``backend`` (``--backend``, else LOCALRUN_BACKEND, else llamacpp): planned for ``parallel`` sequences
    (continuous batching: llama.cpp's context, MLX's ``MlxBatchEngine``; an MLX model whose caches cannot
    batch is served one request at a time: ``backends.as_batch_engine``)."""
    from localrun.loading import load_model

    backend = backend or settings.backend or "llamacpp"
    loaded = load_model(model, backend=backend, n_ctx=ctx, n_parallel=parallel,
                        n_threads=threads, kv_type=kv_type, flash_attn=flash_attn, chat_template=chat_template,
                        force=force, models_dir=settings.models_dir)
    return loaded.engine, loaded.plan, loaded.hardware.to_dict()


def run_server(settings, *, models: list[str], parallel, ctx, max_queue, chat_template, alias, threads, force,
               cors_origins, log_prompts, log_level, backend: str | None = None, kv_type: str | None = None,
               flash_attn: bool | None = None, max_body_bytes: int = 8 * 1024 * 1024,
               parse_special_in_content: bool = False, parse_special_in_prompt: bool = True,
               stop_loops: bool = False, reasoning_budget: int | None = None, residency: dict | None = None,
               generic_tools: bool = True, n_predict: int | None = None,
               kv_tiers: dict | None = None, hardware=None, n_gpu_layers: int | None = None,
               speculation=None, responses_db: Path | None = None, mmproj: Path | None = None,
               allow_image_urls: bool = False, no_mmproj_offload: bool = False) -> None:
    """``hardware``: the profile to plan for (default: probe this machine; ``--rpc``: with the workers);
    ``n_gpu_layers``: layer slots on the GPUs / RPC workers (None: the plan's); ``speculation``: a
    ``server.spec_options.SpecOptions`` (--spec/--draft-model/--draft-max; None: off)."""
    import logging

    from localrun.backends.serial import serving_mode
    from localrun.render import stderr
    from localrun.server.app import create_app, serve_forever
    from localrun.server.runtime import ServeOptions

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = ServeOptions(api_key=settings.api_key, cors_origins=list(cors_origins), log_prompts=log_prompts,
                           max_queue=max_queue, max_body_bytes=max_body_bytes)
    options.parse_special_in_content = parse_special_in_content
    options.parse_special_in_prompt = parse_special_in_prompt
    options.stop_loops = stop_loops
    options.reasoning_budget = reasoning_budget
    options.generic_tools = generic_tools
    options.n_predict = n_predict
    options.responses_db = responses_db
    options.allow_image_urls = allow_image_urls
    residency = dict(residency or {})
    reg = make_registry(settings, options, parallel=parallel, ctx=ctx, backend=backend, kv_type=kv_type,
                        flash_attn=flash_attn, threads=threads, force=force, kv_tiers=kv_tiers, hardware=hardware,
                        n_gpu_layers=n_gpu_layers, speculation=speculation, **residency)
    pins = list(residency.get("pins") or ())
    reg.loader.warm_up()  # the load path's imports now, not on the first request's clock
    if chat_template:
        from localrun.store.resolve import resolve_model

        # the models named at start-up, or (none named) the default one a request without `model` loads
        for name in (models + [p for p in pins if p not in models]) or [None]:
            reg.loader.set_template(resolve_model(name, settings.models_dir), chat_template)
    reg.loader.no_mmproj_offload = no_mmproj_offload
    if mmproj:
        from localrun.store.resolve import resolve_model

        reg.loader.set_mmproj(resolve_model((models + list(pins) + [None])[0], settings.models_dir), str(mmproj))
    for i, name in enumerate(models + [p for p in pins if p not in models]):
        st = reg.preload(name, model_id=alias if i == 0 and alias else None, pinned=name in pins)
        for w in getattr(st.options.plan, "warnings", None) or []:
            stderr().print(f"[yellow]warning:[/] {w}", highlight=False)
    app = create_app(None, settings, options, registry=reg)
    url_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    loaded = []
    for r in reg.residents.values():
        served = r.state.engine  # the BatchEngine the scheduler drives (MLX's: one request at a time)
        mode = (f"{serving_mode(served)}, {served.n_ctx} tokens of context" if served.serial
                else f"{served.n_parallel} parallel × {served.n_ctx} tokens")
        loaded.append(f"[bold]{r.model_id}[/] ({mode})")
    what = ", ".join(loaded) if loaded else "no model loaded yet (each loads on its first request)"
    stderr().print(f"localrun: serving {what} on http://{url_host}:{settings.port}"
                   f"{' (API key required)' if settings.api_key else ''} — OpenAI base URL "
                   f"http://{url_host}:{settings.port}/v1, Ollama http://{url_host}:{settings.port}",
                   soft_wrap=True)  # one line in a log file too (no wrapping at 80 columns)
    from localrun.clients import CLIENTS

    agent_ctx = max(c.n_ctx for c in CLIENTS.values())  # tokens
    small = [r.model_id for r in reg.residents.values() if r.state.engine.n_ctx < agent_ctx]
    if small:  # say it now, not as "prompt is too long" in the agent's first turn
        stderr().print(f"note: coding agents (Claude Code, Codex, opencode) need a {agent_ctx}-token context; "
                       f"{', '.join(small)} has less (--ctx {agent_ctx}, or `localrun launch CLIENT`; "
                       "`localrun fit MODEL --for claude-code` plans it)", highlight=False, soft_wrap=True)
    try:
        serve_forever(app, settings.host, settings.port, log_level=log_level.lower())
    finally:
        if not reg.idle:  # still inside a llama_decode: freeing the context (or the exit's C++ destructors)
            import os  # under it could crash, so leave at once

            logging.getLogger("localrun.server").warning("exiting during a llama_decode (it did not end in time)")
            os._exit(0)
