"""`localrun serve --rpc host:port,…`: the front process and its runner (``localrun.server.runner``).

The front checks what it can without llama.cpp (the flags, the bind, the port, every worker's TCP answer),
then starts the runner: the same ``localrun serve`` command line with ``--host 127.0.0.1 --port P
--rpc-runner`` (its flags rebuilt from click's parsed values, so defaults and aliases need no copy here),
the API key passed in the environment (``LOCALRUN_API_KEY``, not on a command line ``ps`` shows).
"""

from __future__ import annotations

import sys

# flags the front keeps for itself; the runner gets its own host and port
FRONT_ONLY = {"host", "port", "api_key", "insecure", "rpc_runner"}


def runner_args(ctx, drop: set[str] = FRONT_ONLY) -> list[str]:
    """The command's parsed parameters back to argv (click ``ctx.params`` over ``ctx.command.params``),
    leaving out ``drop`` and options at their default. Arguments come first, in order."""
    args: list[str] = []
    opts: list[str] = []
    for p in ctx.command.params:
        if p.name in drop or p.name not in ctx.params:
            continue
        value = ctx.params[p.name]
        if p.param_type_name == "argument":
            args += [str(v) for v in (value or [])] if p.multiple or p.nargs == -1 else [str(value)]
            continue
        if value is None or value == p.default or (p.multiple and not value):
            continue
        if p.is_flag and p.secondary_opts:
            opts.append(p.opts[0] if value else p.secondary_opts[0])
        elif p.is_flag:
            if value:
                opts.append(p.opts[0])
        else:
            for v in (value if p.multiple else [value]):
                opts += [p.opts[0], str(v)]
    return args + opts


def serve_with_runner(ctx, settings, rpc: str, *, log_level: str = "info") -> None:
    """The front: check the workers answer, start the runner, relay (``server.runner.run_front``). Exits
    with the runner's status when it fails to start (its error printed by itself). Raises ConfigError."""
    from localrun.backends import check_reachable, parse_endpoints, split_endpoint
    from localrun.render import stderr
    from localrun.server.runner import run_front

    workers = parse_endpoints(rpc)
    for ep in workers:
        check_reachable(*split_endpoint(ep))
    base = [sys.executable, "-m", "localrun", "serve", *runner_args(ctx)]
    env = {"LOCALRUN_API_KEY": settings.api_key} if settings.api_key else {}

    def argv_for(port: int) -> list[str]:
        return [*base, "--host", "127.0.0.1", "--port", str(port), "--rpc-runner"]

    url_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{url_host}:{settings.port}"
    stderr().print(f"localrun: loading the model in a runner process over RPC workers {', '.join(workers)}",
                   soft_wrap=True, highlight=False)

    def ready() -> None:
        stderr().print(f"localrun: serving on {url} (the runner's own address above is internal) — OpenAI base "
                       f"URL {url}/v1, Ollama {url}; the runner restarts if an RPC worker goes away",
                       soft_wrap=True, highlight=False)

    code = run_front(argv_for, workers, settings.host, settings.port, log_level=log_level.lower(), env=env,
                     on_ready=ready)
    if code:
        raise SystemExit(code)
