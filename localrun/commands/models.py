"""`localrun pull | ls | rm | show | ps`: get models, see what is on disk, and what a server has loaded."""

from __future__ import annotations

from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("pull")(pull)
    app.command("ls")(ls)
    app.command("rm")(rm)
    app.command("show")(show)
    app.command("ps")(ps)
    app.command("stop")(stop)


def pull(
    model: str = typer.Argument(..., help="NAME[:QUANT] from the catalog, hf.co/OWNER/REPO[:QUANT], or "
                                "hf.co/OWNER/REPO/FILE.gguf."),
    force: bool = typer.Option(False, "--force", help="Download again even if the file is up to date."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON (no progress bar)."),
) -> None:
    """Download a GGUF into the model store: resumable, size- and sha256-verified.

    With no QUANT the planner picks the best quantization for this machine and says why. Gated
    models need HF_TOKEN. An interrupted pull continues where it stopped when run again.
    """
    from localrun.render import print_json, stderr
    from localrun.store.pull import pull as do_pull
    from localrun.units import fmt_bytes

    if json_out:
        res = do_pull(model, force=force)
        print_json(res.to_dict())
        return
    res = pull_with_progress(model, force=force)
    err = stderr()
    out_verb = {"up-to-date": "already up to date", "resumed": "resumed and verified",
                "downloaded": "downloaded and verified"}[res.status]
    err.print(f"[green]{out_verb}[/]: {res.path} ({fmt_bytes(res.size_bytes)}, sha256 {(res.sha256 or '?')[:12]}…)")
    if res.mmproj:
        err.print(f"vision projector beside it: {res.mmproj} (images in)")
    if res.note:
        err.print(f"[yellow]note[/]: {res.note}")
    err.print(f"run it: localrun chat {res.name}:{res.quant}" if res.quant else f"run it: localrun chat {res.path}")


def pull_with_progress(model: str, *, force: bool = False, confirm=None):
    """`localrun pull`'s download with its plan line and a progress bar on stderr → ``PullResult``.

    The bar appears with the first byte, so an error before the download (an unknown name, a hub that
    cannot be reached) prints only the error. ``confirm(file)`` is called once the file and its size are
    known, before any byte; it may raise (``typer.Exit``) to stop. Raises what ``localrun.store.pull.pull``
    raises (ModelNotFoundError, DownloadError)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from localrun.render import stderr
    from localrun.store.pull import pull as do_pull
    from localrun.units import fmt_bytes

    err = stderr()
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeRemainingColumn(), console=err, transient=False)
    task = None

    def on_plan(f, reason):
        size = f" ({fmt_bytes(f.best_size)})" if f.best_size else ""
        err.print(f"pulling [bold]{f.repo}/{f.file}[/]{size}: {reason}")
        if confirm is not None:
            confirm(f)

    def on_progress(done, total):
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("download", total=total)
        bar.update(task, completed=done, total=total)

    def stop():  # once, and only if started: Progress.stop() prints a newline off a terminal
        nonlocal task
        if task is not None:
            bar.stop()
            task = None

    try:
        return do_pull(model, force=force, on_plan=on_plan, on_progress=on_progress)
    except KeyboardInterrupt:
        stop()
        err.print("[yellow]interrupted[/]: run the same `localrun pull` again to resume")
        raise
    finally:
        stop()


def ls(
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    catalog: bool = typer.Option(False, "--catalog", help="List the models.toml catalog instead."),
    external: bool = typer.Option(True, "--external/--no-external",
                                  help="Include GGUFs found in the Hugging Face cache, Ollama and LM Studio."),
) -> None:
    """Models on disk: name, quantization, size, and where (localrun's store or another tool's folder)."""
    from localrun.machine.hardware import fmt_bytes
    from localrun.render import print_json, stdout

    if catalog:
        from localrun.model.catalog import load_catalog

        entries = load_catalog()
        if json_out:
            print_json([{"name": e.name, "family": e.family, "arch": e.arch, "params_total": e.params_total,
                         "params_active": e.params_active, "n_ctx_train": e.n_ctx_train, "license": e.license,
                         "quants": e.quants, "mlx": "mlx" in e.sources} for e in entries])
            return
        from rich.table import Table

        t = Table(title="catalog (models.toml)")
        for c in ("name", "params", "context", "license", "quantizations"):
            t.add_column(c)
        for e in entries:
            p = f"{e.params_total / 1e9:.1f}B" + (f" ({e.params_active / 1e9:.1f}B active)"
                                                  if e.params_active < e.params_total else "")
            t.add_row(e.name, p, f"{e.n_ctx_train:,}", e.license, " ".join(e.quants))
        stdout().print(t)
        return
    from localrun.model.gguf_info import file_status
    from localrun.store.resolve import list_local_models

    models = list_local_models(external=external, embedded=True)
    status = [file_status(m.path) for m in models]  # header only: quant when the name lacks it, completeness
    if json_out:
        print_json([{**m.to_dict(), "quant": m.quant or st["quant"], "complete": st["complete"],
                     "problem": st["problem"]} for m, st in zip(models, status)])
        return
    con = stdout()
    if not models:
        con.print("no models on disk yet: `localrun pull NAME` (see `localrun ls --catalog`); "
                  "`localrun chat` runs the embedded SmolLM2 without one")
        return
    from rich.table import Table

    t = Table()
    for c in ("name", "quant", "size", "where", "path"):
        t.add_column(c)
    for m, st in zip(models, status):
        where = {"localrun": "localrun", "embedded": "embedded (default)",
                     "package": "Python package"}.get(m.source, f"{m.source} (read-only)")
        size = fmt_bytes(m.size_bytes) + (f" [red]{st['problem']}[/]" if st["problem"] else "")
        t.add_row(m.ref, m.quant or st["quant"] or "?", size, where, m.path)
    con.print(t)


def rm(
    model: str = typer.Argument(..., help="NAME[:QUANT] as `localrun ls` shows it."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Remove every quantization of NAME without asking."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Delete a pulled model from localrun's store. Files of other tools are never touched."""
    from localrun.render import print_json, stdout
    from localrun.store.resolve import remove_pulled

    removed = remove_pulled(model, all_quants=yes)
    if json_out:
        print_json({"removed": removed})
        return
    for p in removed:
        stdout().print(f"removed {p}")


def show(
    model: str = typer.Argument(..., help="A catalog name, a pulled NAME[:QUANT], or a .gguf path."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Catalog facts, the file's header (when on disk) and a fit summary for this machine."""
    from localrun.render import print_json, stdout
    from localrun.store.info import show_info

    info = show_info(model)
    if json_out:
        print_json(info)
        return
    from rich.table import Table

    t = Table(title=info["name"], show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for label, text in info["summary"]:  # readable rows, built by store.info.summary_rows
        t.add_row(label, text)
    stdout().print(t)


def ps(
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    host: Optional[str] = typer.Option(None, "--host", help="Server host (default 127.0.0.1; LOCALRUN_HOST)."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
        help="Server port (default 11500; LOCALRUN_PORT)."),
    api_key: Optional[str] = typer.Option(None, "--api-key",
        help="The key the server was started with (LOCALRUN_API_KEY)."),
) -> None:
    """What a running `localrun serve` has loaded: model, quantization, memory, plan (GET /api/ps)."""
    from localrun.render import print_json, stdout
    from localrun.store.info import server_ps

    info = server_ps(host=host, port=port, api_key=api_key)
    if json_out:
        print_json(info)  # {"running": false, …} when no server listens
        return
    con = stdout()
    if not info["running"]:
        from localrun.errors import LocalrunError

        raise LocalrunError(f"no localrun server is running at {info['url']}",
                            hint="start one with `localrun serve [MODEL]` (or give --host/--port)")
    models = info.get("models") or []
    if not models:
        con.print(f"the server at {info['url']} has no model loaded")
        return
    from rich.table import Table

    from localrun.machine.hardware import fmt_bytes

    t = Table(title=f"localrun serve at {info['url']}")
    for c in ("name", "quant", "memory", "VRAM", "context", "state", "until", "plan"):
        t.add_column(c)
    for m in models:
        det = m.get("details") or {}
        lr = m.get("localrun") or {}
        plan = m.get("plan") or lr.get("plan") or {}
        plan_s = (f"{plan.get('backend', '?')}, {plan.get('n_gpu_layers', 0)} GPU layers, kv {plan.get('kv_type', '?')}"
                  if plan else "")
        ag = lr.get("asked_vs_given")
        if ag:
            plan_s += "; given " + ", ".join(f"{k} {v}" for k, v in ag["given"].items() if ag["asked"].get(k) != v) \
                + " (asked " + ", ".join(f"{ag['asked'][k]}" for k, v in ag["given"].items()
                                         if ag["asked"].get(k) != v) + ")"
        busy = m.get("busy")
        state = "busy" if busy else "idle" if busy is not None else "?"
        until = "forever" if lr.get("never_expires") else (m.get("expires_at") or "?")[:19].replace("T", " ")
        t.add_row(m.get("name") or m.get("model", "?"), det.get("quantization_level", "?"),
                  fmt_bytes(int(m.get("size") or 0)), fmt_bytes(int(m.get("size_vram") or 0)),
                  str(m.get("context_length") or plan.get("n_ctx") or "?"), state, until, plan_s)
    con.print(t)


def stop(
    model: str = typer.Argument(..., help="A model the server has loaded (as `localrun ps` names it)."),
    host: Optional[str] = typer.Option(None, "--host", help="Server host (default 127.0.0.1; LOCALRUN_HOST)."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
        help="Server port (default 11500; LOCALRUN_PORT)."),
    api_key: Optional[str] = typer.Option(None, "--api-key",
        help="The key the server was started with (LOCALRUN_API_KEY)."),
) -> None:
    """Unload MODEL from a running `localrun serve` (as `ollama stop`: an empty generate with keep_alive 0).
    Its requests in flight finish first."""
    from localrun.render import stdout

    names = [m.get("name") for m in _running_models(host, port, api_key)]
    if model not in names:
        from localrun.errors import ModelNotFoundError

        raise ModelNotFoundError(model, hint="loaded now: " + (", ".join(n for n in names if n) or "none")
                                 + " (`localrun ps`)")
    _post(host, port, api_key, "/api/generate", {"model": model, "keep_alive": 0})
    stdout().print(f"unloaded {model}")


def _running_models(host, port, api_key) -> list[dict]:
    from localrun.errors import LocalrunError
    from localrun.store.info import server_ps

    info = server_ps(host=host, port=port, api_key=api_key)
    if not info["running"]:
        raise LocalrunError(f"no localrun server is running at {info['url']}",
                            hint="start one with `localrun serve [MODEL]` (or give --host/--port)")
    return info.get("models") or []


def _post(host, port, api_key, path: str, body: dict, timeout_s: float = 300.0) -> dict:
    """POST ``body`` to the server; its JSON answer. Raises LocalrunError with the server's message."""
    import json
    import urllib.error
    import urllib.request

    from localrun.config import get_settings
    from localrun.errors import LocalrunError

    st = get_settings()
    url = f"http://{host or st.host}:{port or st.port}{path}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    key = api_key or st.api_key
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read() or b"{}").get("error") or str(e)
        except ValueError:
            msg = str(e)
        raise LocalrunError(f"the server answered {e.code}: {msg}") from None
