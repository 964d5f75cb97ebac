"""`localrun launch CLIENT [--model M]`: run a coding agent on a local model (Ollama's ``ollama launch``).

1. Find a `localrun serve` answering on ``--port`` (default: the configured one) that has a context of at
   least what the client needs (``CLIENTS[...].n_ctx``: the agent's system prompt and tool schemas are
   12–16k tokens, and each turn grows it); else start one in the background with that context, its log in
   ``<LOCALRUN_HOME>/logs/launch-serve.log``, and stop it when the client exits.
2. Point the client at it without touching the user's own files: environment variables for Claude Code
   (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``, ``ANTHROPIC_MODEL``), ``-c`` overrides naming a
   ``model_providers.localrun`` entry with ``wire_api = "responses"`` (and its hosted web search off) for
   Codex, and a provider block in a
   config file under localrun's home passed through ``OPENCODE_CONFIG`` for opencode, ``OPENAI_*`` variables
   and ``--auth-type openai`` for Qwen Code. ``--config`` writes
   the same into the client's own configuration file instead (once; an existing entry is left as it is).
3. Run the client with the arguments after ``--`` and exit with its exit code.

A client that is not installed is an error naming its install command. ``--dry-run`` prints what would
run (server command, environment, client command) and runs nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from localrun.clients import ALIASES, CLIENTS
from localrun.errors import LocalrunError


class ClientNotInstalledError(LocalrunError):
    exit_code = 127


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def launch(
        ctx: typer.Context,
        client: str = typer.Argument(..., help="claude | codex | opencode | qwen"),
        model: Optional[str] = typer.Option(None, "--model", "-m",
                                            help="Model to serve (default: the embedded SmolLM2)."),
        port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="Server port (default 11500)."),
        n_ctx: Optional[int] = typer.Option(None, "--ctx", min=512,
                                            help="Context per sequence, tokens (default: what the client needs)."),
        serve_arg: List[str] = typer.Option([], "--serve-arg",
                                            help="Extra argument for `localrun serve` (repeatable)."),
        config: bool = typer.Option(False, "--config", help="Write the client's own configuration file."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print what would run; run nothing."),
    ) -> None:
        """Run a coding agent (Claude Code, Codex, opencode, Qwen Code) on a local model: finds or starts
        `localrun serve`, points the client at it, runs it. Arguments after `--` go to the client."""
        raise typer.Exit(run_launch(client, model=model, port=port, n_ctx=n_ctx, serve_args=serve_arg,
                                    write_config=config, dry_run=dry_run, client_args=list(ctx.args)))


def run_launch(client: str, *, model: str | None = None, port: int | None = None, n_ctx: int | None = None,
               serve_args: list[str] = (), write_config: bool = False, dry_run: bool = False,
               client_args: list[str] = ()) -> int:
    """``launch``'s work (see the module doc). Returns the client's exit code (0 for ``dry_run``). Raises
    LocalrunError for an unknown client, ClientNotInstalledError, and serve's errors when it cannot start."""
    from localrun.config import get_settings

    client = ALIASES.get(client, client)
    if client not in CLIENTS:
        raise LocalrunError(f"unknown client {client!r}", hint=f"use one of: {', '.join(CLIENTS)}")
    c = CLIENTS[client]
    settings = get_settings()
    port = port or settings.port
    base = f"http://127.0.0.1:{port}"
    need = n_ctx or c.n_ctx
    binary = shutil.which(c.binary)
    if binary is None and not dry_run:
        raise ClientNotInstalledError(f"{c.name} is not installed (no `{c.binary}` on PATH)",
                                      hint=f"install it: {c.install}")
    key = os.environ.get("LOCALRUN_API_KEY") or "localrun"
    serve_cmd = [sys.executable, "-m", "localrun", "serve", *([model] if model else []), "--port", str(port),
                 "--ctx", str(need), "--parallel", "1", *serve_args]
    running = _running_server(base, key)  # --dry-run too: it says which server the client would use
    if running is not None and running["n_ctx"] and running["n_ctx"] < need:
        raise LocalrunError(f"the server on port {port} serves {running['id']} with a {running['n_ctx']}-token "
                            f"context; {c.name} needs {need}",
                            hint=f"stop it, or use another --port (launch then starts one with --ctx {need})")
    model_id = running["id"] if running else (Path(model).stem if model else "localrun")
    env, args = client_setup(client, base, key, model_id, settings.home, write=write_config,
                             n_ctx=(running or {}).get("n_ctx") or need)
    cmd = [binary or c.binary, *args, *client_args]
    if dry_run:
        typer.echo(f"server: {'running at ' + base if running else shlex.join(serve_cmd)}")
        for k, v in env.items():
            typer.echo(f"env: {k}={v}")
        typer.echo(f"client: {shlex.join(cmd)}")
        return 0
    proc = None
    if running is None:
        proc = _start_server(serve_cmd, settings.home, base, key)
    try:
        return subprocess.call(cmd, env={**os.environ, **env})
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def client_setup(client: str, base: str, key: str, model_id: str, home: Path, *,
                 write: bool = False, n_ctx: int | None = None) -> tuple[dict[str, str], list[str]]:
    """(environment, leading arguments) that point ``client`` at the server at ``base``; with ``write``,
    the client's own configuration file gets the same settings (``write_client_config``). ``n_ctx`` (tokens,
    the server's context per sequence) is told to Codex as ``model_context_window`` (its config key for the
    window; for a model it has no metadata for it otherwise assumes its fallback metadata's, not the
    server's) and to Claude Code as ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` (read by 2.1.197 and 2.1.332: it
    compacts the conversation before the smaller of this and its own window for the model fills). Past the
    window the server answers OpenAI's ``context_length_exceeded`` (Codex: "ran out of room in the model's
    context window") or Anthropic's "prompt is too long"."""
    if write:
        write_client_config(client, base, key, model_id)
    if client == "claude":
        env = {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": key, "ANTHROPIC_MODEL": model_id,
               "ANTHROPIC_SMALL_FAST_MODEL": model_id}
        if n_ctx:  # Claude Code's auto-compaction works against min(this, the window it assumes for the model)
            env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(int(n_ctx))
        return env, []
    if client == "codex":
        provider = f'{{name="localrun", base_url="{base}/v1", wire_api="responses", env_key="LOCALRUN_API_KEY"}}'
        # hosted tools (web search) cannot run on a local server: the server would leave them out anyway
        args = ["-c", "model_provider=localrun", "-c", f"model_providers.localrun={provider}", "-c",
                'web_search="disabled"', "-m", model_id]
        if n_ctx:
            args[-2:-2] = ["-c", f"model_context_window={int(n_ctx)}"]
        return {"LOCALRUN_API_KEY": key}, args
    if client == "qwen":  # Qwen Code's OpenAI provider (its docs: "Authentication → OpenAI-compatible API")
        return {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": f"{base}/v1", "OPENAI_MODEL": model_id}, \
            ["--auth-type", "openai"]
    cfg = home / "launch" / "opencode.json"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps(opencode_config(base, key, model_id), indent=2))
    return {"OPENCODE_CONFIG": str(cfg)}, []


def opencode_config(base: str, key: str, model_id: str) -> dict:
    """opencode's provider block for an OpenAI-compatible server (its docs: "Providers → Custom provider")."""
    return {"$schema": "https://opencode.ai/config.json", "model": f"localrun/{model_id}",
            "provider": {"localrun": {"npm": "@ai-sdk/openai-compatible", "name": "localrun",
                                      "options": {"baseURL": f"{base}/v1", "apiKey": key},
                                      "models": {model_id: {"name": model_id}}}}}


def write_client_config(client: str, base: str, key: str, model_id: str) -> Path:
    """Write ``client``'s own configuration (asked for with ``--config``): Claude Code's
    ``~/.claude/settings.json`` ``env``, Codex's ``~/.codex/config.toml`` provider entry (appended when
    there is none), opencode's ``~/.config/opencode/opencode.json`` provider. Written to a temporary file and
    renamed, so a failure never leaves half a file. Returns the path."""
    home = Path.home()
    if client == "qwen":
        raise LocalrunError("--config is not available for Qwen Code (it reads its OpenAI provider from the "
                            "environment)", hint=f"export OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY={key} "
                            f"OPENAI_MODEL={model_id}, then run `qwen --auth-type openai`; or use `localrun launch "
                            "qwen` without --config")
    if client == "claude":
        path = home / ".claude" / "settings.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        data.setdefault("env", {}).update(ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY=key, ANTHROPIC_MODEL=model_id)
        text = json.dumps(data, indent=2) + "\n"
    elif client == "codex":
        path = Path(os.environ.get("CODEX_HOME") or home / ".codex") / "config.toml"
        text = path.read_text() if path.is_file() else ""
        if "[model_providers.localrun]" not in text:
            text += (f'\n[model_providers.localrun]\nname = "localrun"\nbase_url = "{base}/v1"\n'
                     f'wire_api = "responses"\nenv_key = "LOCALRUN_API_KEY"\n')
    else:
        path = home / ".config" / "opencode" / "opencode.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        new = opencode_config(base, key, model_id)
        data.setdefault("provider", {}).update(new["provider"])
        data.setdefault("model", new["model"])
        text = json.dumps(data, indent=2) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def _running_server(base: str, key: str) -> dict | None:
    """{"id", "n_ctx"} of the first model a localrun server at ``base`` lists (``n_ctx`` 0 when the model
    is not loaded yet: the server's own --ctx then applies), None when none answers."""
    import httpx

    try:
        r = httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=2)
    except httpx.HTTPError:
        return None
    if r.status_code != 200 or not r.json().get("data"):
        return None
    m = r.json()["data"][0]
    meta = m.get("meta") or {}
    return {"id": m["id"], "n_ctx": int(meta.get("n_ctx") or meta.get("n_ctx_seq") or 0)}


def _start_server(cmd: list[str], home: Path, base: str, key: str) -> subprocess.Popen:
    """Start ``cmd`` (a `localrun serve`) with its log under ``home``/logs and wait until it answers. Raises
    LocalrunError (with the log's tail) when it exits first."""
    import httpx

    log_path = home / "logs" / "launch-serve.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "LOCALRUN_API_KEY": key})
    typer.echo(f"localrun: starting `{shlex.join(cmd[2:])}` (log: {log_path})", err=True)
    while True:
        if proc.poll() is not None:
            log.close()
            raise LocalrunError("localrun serve exited before it was ready: "
                                + log_path.read_text(errors="replace")[-1500:].strip(),
                                hint=f"see {log_path}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
