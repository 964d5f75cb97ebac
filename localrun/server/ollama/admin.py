"""Ollama's model management routes: ``/api/tags``, ``/api/ps``, ``/api/pull`` (NDJSON progress),
``/api/delete``, ``/api/copy``, and the load / unload that an empty ``/api/generate`` or ``/api/chat``
prompt asks for (Ollama docs/api.md). The models themselves are ``server/models.py``'s registry.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response, StreamingResponse

from localrun.errors import LocalrunError, ModelNotFoundError
from localrun.server.errors import RequestError
from localrun.server.facts import file_capabilities, folder_facts
from localrun.server.keepalive import FOREVER, fmt_keep_alive
from localrun.server.listing import loadable, tag_entry
from localrun.server.models import ModelRegistry
from localrun.server.ollama import convert as cv
from localrun.server.residency import Resident


class _NameRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    name: str | None = None  # Ollama's older field
    stream: bool = True
    insecure: bool = False

    def model_name(self) -> str:
        n = self.model or self.name
        if not n:
            raise RequestError("'model' is required", param="model")
        return n


class _CopyRequest(BaseModel):
    source: str
    destination: str


def register(app: FastAPI, reg: ModelRegistry) -> None:
    @app.get("/api/tags")
    async def tags() -> dict:
        """The resident models first (``loaded: true``), then every model on disk the server can load."""
        out = []
        for e in await loadable(reg):
            if e.resident is not None:
                st = e.resident.state
                out.append({**cv.ollama_model_entry(e.name, st.spec, e.path, e.mtime_s or st.started_s),
                            "loaded": True})
            else:
                out.append(tag_entry(e))
        return {"models": out}

    @app.get("/api/ps")
    async def ps() -> dict:
        return {"models": [ps_entry(reg, r) for r in sorted(reg.residents.values(), key=lambda r: -r.last_used)]}

    @app.post("/api/pull")
    async def pull(request: Request):
        req = await reg.reader.parse(request, _NameRequest, lenient_type=True)
        name = req.model_name()
        events = _pull_events(reg, name)
        if req.stream:
            async def lines():
                async for ev in events:
                    yield json.dumps({k: v for k, v in ev.items() if k != "_status"}) + "\n"

            return StreamingResponse(lines(), media_type="application/x-ndjson")
        last = {}
        async for ev in events:
            if "error" in ev:
                raise RequestError(ev["error"], param="model", status=ev.get("_status", 400))
            last = ev
        return last

    @app.delete("/api/delete")
    async def delete(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        from localrun.store.resolve import remove_pulled

        req = await reg.reader.parse(request, _NameRequest, lenient_type=True)
        name = req.model_name()
        await reg.unload(name)
        await run_in_threadpool(remove_pulled, name, models_dir=reg.settings.models_dir)
        reg.names.forget()
        return Response(status_code=200)

    @app.post("/api/copy")
    async def copy(request: Request) -> Response:
        req = await reg.reader.parse(request, _CopyRequest, lenient_type=True)
        key = await reg.names.resolve_strict(req.source)
        dest = copy_into_store(Path(key), req.destination, reg.settings.models_dir)
        reg.names.forget()
        return Response(status_code=200, headers={"X-Localrun-Path": str(dest)})


async def load_or_unload(reg: ModelRegistry, request: Request, name: str | None,
                         keep_alive_s: float | None, n_ctx: int | None = None) -> tuple[str, str]:
    """An empty prompt: ``keep_alive`` 0 unloads the model (if loaded), anything else loads it (and sets its
    keep-alive; ``n_ctx``: with that context, reloading it if needed). → (the model's name, Ollama's
    ``done_reason``: "unload" | "load")."""
    if keep_alive_s == 0:
        await reg.unload(name or "default")
        return name or "", "unload"
    st = await reg.state_for(request, name, keep_alive_s=keep_alive_s, n_ctx=n_ctx)
    return st.model_id, "load"


def ps_entry(reg: ModelRegistry, r: Resident) -> dict:
    """``/api/ps``'s entry: Ollama's fields (size, size_vram, expires_at, context_length) plus ``busy`` and
    a ``localrun`` object (plan, memory, asked vs given, keep-alive, queue)."""
    st = r.state
    path = st.engine.model_path
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        mtime = st.started_s
    e = cv.ollama_model_entry(r.model_id, st.spec, path, mtime)
    plan = st.options.plan
    kv_bytes = int(getattr(plan, "kv_cache_bytes", 0) or 0)
    weights = int(getattr(plan, "weights_bytes", 0) or getattr(st.spec, "tensor_bytes", st.spec.file_bytes))
    size = r.need.ram_bytes + r.need.vram_bytes or weights + kv_bytes
    e.update(expires_at=expires_at(r), size=size, size_vram=r.need.vram_bytes, context_length=st.engine.n_ctx,
             busy=reg.busy(r))
    from localrun.backends.serial import serving_mode

    e["localrun"] = {
        "plan": plan.to_dict() if plan is not None and hasattr(plan, "to_dict") else None,
        "memory": {"rss_bytes": rss_bytes(), "weights_bytes": weights, "kv_cache_bytes": kv_bytes,
                   "vram_bytes": r.need.vram_bytes, "ram_bytes": r.need.ram_bytes,
                   "kv_cells_used": st.engine.kv_cells_used(),
                   "kv_cells_total": st.engine.n_ctx * st.engine.n_parallel},
        "n_ctx": st.engine.n_ctx, "n_parallel": st.engine.n_parallel,
        "backend": st.engine.backend, "serving": serving_mode(st.engine),
        "active_sequences": st.scheduler.n_running, "queued": st.scheduler.n_waiting, "requests": r.refs,
        "path": path, "uptime_s": round(time.time() - r.loaded_at, 1), "load_s": round(r.load_s, 3),
        "keep_alive": fmt_keep_alive(r.keep_alive_s), "pinned": r.pinned,
        "never_expires": r.pinned or r.keep_alive_s == FOREVER,
        "asked_vs_given": r.asked_given(),
        "hardware": st.options.hardware,
    }
    return e


def expires_at(r: Resident) -> str:
    """Ollama's ``expires_at`` (RFC 3339, UTC): when the idle model unloads; a busy model's is its
    keep-alive from now; never: 292 years on, as Ollama's maximal duration gives."""
    if r.pinned or r.keep_alive_s == FOREVER:
        when = datetime.now(timezone.utc) + timedelta(days=292 * 365)
    elif r.expires_at is not None:
        when = datetime.now(timezone.utc) + timedelta(seconds=max(0.0, r.expires_at - time.monotonic()))
    else:
        when = datetime.now(timezone.utc) + timedelta(seconds=r.keep_alive_s)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


async def show_unloaded(name: str, key: str, *, generic_tools: bool = False) -> dict:
    """``/api/show`` for a model on disk that is not loaded: from its GGUF header (nothing is loaded);
    ``capabilities`` from that header and its own template (``model/capabilities.py``)."""
    from starlette.concurrency import run_in_threadpool

    from localrun.model.capabilities import capabilities

    def read():
        if os.path.isdir(key):
            return folder_facts(key), None, file_capabilities(key, generic_tools=generic_tools)
        from localrun.model.gguf_info import read_gguf

        spec = read_gguf(key)
        return spec, spec.chat_template, capabilities(spec, spec.chat_template, generic_tools=generic_tools)

    spec, tpl, caps = await run_in_threadpool(read)
    arch = spec.arch
    info = {"general.architecture": arch, "general.name": spec.name, "general.parameter_count": spec.n_params,
            "general.file_type": spec.file_type, f"{arch}.context_length": spec.n_ctx_train,
            f"{arch}.block_count": spec.n_layer, f"{arch}.embedding_length": spec.n_embd,
            f"{arch}.attention.head_count": spec.n_head, f"{arch}.attention.head_count_kv": spec.n_head_kv}
    return {"license": "", "modelfile": f"FROM {key}\n", "parameters": "", "template": tpl or "",
            "details": cv.ollama_details(spec), "model_info": info, "capabilities": caps.ollama(),
            "modified_at": cv.ollama_model_entry(name, spec, key, os.path.getmtime(key))["modified_at"]}


def copy_into_store(source: Path, destination: str, models_dir: Path) -> Path:
    """Ollama's ``/api/copy``: ``destination`` becomes a name for ``source`` (a symbolic link in the store:
    no bytes are copied). Raises RequestError for a name that is taken or not a plain name."""
    stem = destination.replace(":", "-")
    if not stem or "/" in stem or "\\" in stem or stem.startswith("."):
        raise RequestError(f"'destination' {destination!r} is not a model name", param="destination")
    if source.is_dir():
        raise RequestError("copying an MLX folder is not supported", param="source", code="unsupported_value")
    dest = models_dir / f"{stem}.gguf"
    if dest.exists() or dest.is_symlink():
        raise RequestError(f"a model named {destination!r} already exists ({dest})", param="destination",
                           hint="pick another name, or DELETE /api/delete it first")
    models_dir.mkdir(parents=True, exist_ok=True)
    os.symlink(source, dest)
    return dest


async def _pull_events(reg: ModelRegistry, name: str):
    """Ollama's pull progress (``{"status": ...}``, ``digest``/``total``/``completed`` while downloading,
    ``{"status": "success"}`` last) from ``store.pull.pull`` running in a thread; an error is a last
    ``{"error": ...}`` object."""
    from localrun.store.pull import pull

    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    digest = {"d": ""}

    def put(ev: dict) -> None:
        loop.call_soon_threadsafe(q.put_nowait, ev)

    def on_plan(f, reason) -> None:
        digest["d"] = "sha256:" + (getattr(f, "sha256", None) or "")
        put({"status": f"pulling {f.repo}/{f.file}: {reason}"})

    def on_progress(done: int, total: int) -> None:
        put({"status": f"pulling {digest['d'][7:19] or 'file'}", "digest": digest["d"], "total": int(total),
             "completed": int(done)})

    def work() -> None:
        try:
            res = pull(name, models_dir=reg.settings.models_dir, on_plan=on_plan, on_progress=on_progress)
            put({"status": "verifying sha256 digest"})
            put({"status": "writing manifest"})
            put({"status": "success", "localrun": {"path": res.path, "name": f"{res.name}:{res.quant}"
                                                   if res.quant else res.name, "result": res.status}})
        except LocalrunError as e:
            put({"error": e.message + (f" (hint: {e.hint})" if e.hint else ""),
                 "_status": 404 if isinstance(e, ModelNotFoundError) else 400})
        except Exception as e:  # pragma: no cover - a bug: reported in the stream, the server keeps serving
            put({"error": f"internal error: {type(e).__name__}: {e}", "_status": 500})
        put({})  # end

    yield {"status": "pulling manifest"}
    fut = loop.run_in_executor(None, work)
    try:
        while True:
            ev = await q.get()
            if not ev:
                break
            if ev.get("status") == "success":
                reg.names.forget()
            yield ev
    finally:
        await asyncio.shield(fut)


def rss_bytes() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # pragma: no cover
        return 0
