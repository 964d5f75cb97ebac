"""Ollama wire format: ``/api/chat``, ``/api/generate`` (NDJSON streaming), ``/api/tags``, ``/api/show``,
``/api/ps``, ``/api/version`` (Ollama docs/api.md). Errors are ``{"error": "message"}``.

``/api/ps`` adds a ``localrun`` field with the load plan and memory use (``localrun ps`` reads it).
``model`` in requests is accepted as-is: the server holds one model and answers with it.
"""

from __future__ import annotations

import json
import os
import time

from fastapi import FastAPI, Request

from localrun.backends.serial import serving_mode
from localrun.dialects import Delta, ToolCallEnd, ToolCallStart
from localrun.errors import LocalrunError, ModelNotFoundError
from localrun.server import convert as cv
from localrun.server.errors import RequestError
from localrun.server.reply import Finish, Reply, ReplyOptions, collect_reply, family_of, prepare_chat, reply_events
from localrun.server.runtime import ServerState
from localrun.server.schemas import OllamaChatRequest, OllamaEmbedRequest, OllamaGenerateRequest, OllamaShowRequest


def _line(obj) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


def register(app: FastAPI, st: ServerState) -> None:
    @app.get("/api/version")
    async def version() -> dict:
        from localrun import __version__

        return {"version": __version__}

    @app.get("/api/tags")
    async def tags() -> dict:
        return {"models": [_entry(st)]}

    @app.post("/api/show")
    async def show(request: Request) -> dict:
        show = await st.parse(request, OllamaShowRequest, lenient_type=True)
        name = show.model or show.name
        if name and not st.serves(name):
            raise ModelNotFoundError(name, hint=f"this server serves {st.model_id!r} (GET /api/tags)")
        spec = st.spec
        tpl = st.engine.template_source or ""
        caps = ["completion"] + (["tools"] if st.engine.supports_tools else []) + ["embedding"]
        info = {"general.architecture": spec.arch, "general.name": spec.name,
                "general.parameter_count": spec.n_params, "general.file_type": spec.file_type,
                f"{spec.arch}.context_length": spec.n_ctx_train, f"{spec.arch}.block_count": spec.n_layer,
                f"{spec.arch}.embedding_length": spec.n_embd, f"{spec.arch}.attention.head_count": spec.n_head,
                f"{spec.arch}.attention.head_count_kv": spec.n_head_kv}
        return {"license": "", "modelfile": f"FROM {st.engine.model_path}\n", "parameters": "",
                "template": tpl, "details": cv.ollama_details(spec), "model_info": info,
                "capabilities": caps, "modified_at": _entry(st)["modified_at"]}

    @app.post("/api/embed")
    async def embed(request: Request) -> dict:
        req = await st.parse(request, OllamaEmbedRequest, lenient_type=True)
        inputs = [req.input] if isinstance(req.input, str) else list(req.input or [])
        t0 = time.perf_counter()
        vectors, n = await st.embed(request, inputs, "input", truncate=req.truncate)
        return {"model": st.model_id, "embeddings": vectors, "total_duration": int((time.perf_counter() - t0) * 1e9),
                "load_duration": 0, "prompt_eval_count": n}

    @app.post("/api/embeddings")  # Ollama's older endpoint: one prompt, one vector
    async def embeddings(request: Request) -> dict:
        req = await st.parse(request, OllamaEmbedRequest, lenient_type=True)
        vectors, _ = await st.embed(request, [req.prompt] if req.prompt else [], "prompt", truncate=req.truncate)
        return {"embedding": vectors[0]}

    @app.get("/api/ps")
    async def ps() -> dict:
        e = _entry(st)
        plan = st.options.plan
        kv_bytes = int(getattr(plan, "kv_cache_bytes", 0) or 0)
        weights = int(getattr(plan, "weights_bytes", 0) or getattr(st.spec, "tensor_bytes", st.spec.file_bytes))
        vram = int(getattr(plan, "vram_bytes", 0) or 0)
        e.update(expires_at="0001-01-01T00:00:00Z", size=weights + kv_bytes, size_vram=vram,
                 context_length=st.engine.n_ctx)
        e["localrun"] = {
            "plan": plan.to_dict() if plan is not None else None,
            "memory": {"rss_bytes": _rss_bytes(), "weights_bytes": weights, "kv_cache_bytes": kv_bytes,
                       "vram_bytes": vram, "kv_cells_used": st.engine.kv_cells_used(),
                       "kv_cells_total": st.engine.n_ctx * st.engine.n_parallel},
            "n_ctx": st.engine.n_ctx, "n_parallel": st.engine.n_parallel,
            "backend": st.engine.backend, "serving": serving_mode(st.engine),
            "active_sequences": st.scheduler.n_running, "queued": st.scheduler.n_waiting,
            "path": st.engine.model_path, "uptime_s": round(time.time() - st.started_s, 1),
            "hardware": st.options.hardware,
        }
        return {"models": [e]}

    @app.post("/api/chat")
    async def chat(request: Request):
        req = await st.parse(request, OllamaChatRequest, lenient_type=True)
        if not req.messages:  # Ollama: an empty chat loads the model and returns at once
            return {
                "model": st.model_id,
                "created_at": cv.ollama_now(),
                "message": {"role": "assistant", "content": ""},
                "done_reason": "load",
                "done": True,
            }
        params = cv.sampling_from_ollama(req.options, req.format, stop_loops=st.options.stop_loops)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        for m in req.messages:
            _no_images(m.images)
        if tools and not st.engine.supports_tools:
            raise RequestError(f"{st.model_id} does not support tools", param="tools", code="tools_unsupported")
        think, level = _think(st, req.think)
        prompt, tokens, family, opts = await prepare_chat(
            st, cv.messages_from_ollama(req.messages), tools=tools, tool_choice=None, think=think, level=level,
            budget=None, params=params)
        t0 = time.perf_counter()
        job = await st.start(request, tokens, params)

        def line(msg: dict) -> str:
            return _line({"model": st.model_id, "created_at": cv.ollama_now(),
                          "message": {"role": "assistant", "content": "", **msg}, "done": False})

        def done_line(r: Reply) -> dict:
            msg: dict = {"role": "assistant", "content": r.content}
            if r.thinking:
                msg["thinking"] = r.thinking
            if r.tool_calls:
                msg["tool_calls"] = [_ollama_call(i, c.id, c.name, c.args) for i, c in enumerate(r.tool_calls)]
            f = r.finish
            return {"model": st.model_id, "created_at": cv.ollama_now(), "message": msg,
                    **cv.ollama_final_fields(f.stats, _done_reason(f.reason), time.perf_counter() - t0)}

        if not req.stream:
            r = await collect_reply(reply_events(st, job, family, opts, request))
            st.note(request, r.finish.stats, r.finish.reason, prompt)
            return done_line(r)

        async def lines():
            names: dict[int, tuple[str, str]] = {}
            try:
                async for e in reply_events(st, job, family, opts):
                    if isinstance(e, Delta) and e.text:
                        yield line({"thinking": e.text} if e.channel == "thinking" else {"content": e.text})
                    elif isinstance(e, ToolCallStart):
                        names[e.index] = (e.id, e.name)
                    elif isinstance(e, ToolCallEnd):  # Ollama sends a call whole, arguments as an object
                        cid, name = names[e.index]
                        yield line({"tool_calls": [_ollama_call(e.index, cid, name, e.arguments)]})
                    elif isinstance(e, Finish):
                        st.note(request, e.stats, e.reason, prompt)
                        yield _line(done_line(Reply(finish=e)))  # Ollama's final line carries no text
            except LocalrunError as e:
                yield _line({"error": e.message})

        return st.stream(job, lines(), "application/x-ndjson")

    @app.post("/api/generate")
    async def generate(request: Request):
        req = await st.parse(request, OllamaGenerateRequest, lenient_type=True)
        if not req.prompt and not req.system:
            return {
                "model": st.model_id,
                "created_at": cv.ollama_now(),
                "response": "",
                "done": True,
                "done_reason": "load",
            }
        params = cv.sampling_from_ollama(req.options, req.format, stop_loops=st.options.stop_loops)
        _no_images(req.images)
        # ``context`` (returned by the previous /api/generate) comes first, as in Ollama: a short memory
        context = st.check_token_ids(req.context or [], "context")
        if req.raw or not st.engine.has_chat_template:
            if req.think:
                raise RequestError("'think' needs the chat template (not raw mode)", param="think",
                                   hint="leave 'think' out with raw prompts")
            prompt = (req.system + "\n\n" if req.system and not req.raw else "") + req.prompt
            new = await st.text_tokens(prompt, raw=req.raw)
            family, opts = family_of(None), ReplyOptions()
        else:
            msgs = ([{"role": "system", "content": req.system}] if req.system and not context else []) + [
                {"role": "user", "content": req.prompt}
            ]
            think, level = _think(st, req.think)
            prompt, new, family, opts = await prepare_chat(st, msgs, tools=None, tool_choice=None, think=think,
                                                           level=level, budget=None, params=params)
        bos = getattr(st.spec, "bos_token_id", None)
        if context and new and st.engine.add_bos and new[0] == bos:
            new = new[1:]  # the tokenizer added a BOS: keep only the one at the start of the context
        tokens = context + new
        st.check_fits(tokens, "prompt")
        t0 = time.perf_counter()
        job = await st.start(request, tokens, params)

        def done_line(r: Reply) -> dict:
            f = r.finish
            d = {"model": st.model_id, "created_at": cv.ollama_now(), "response": r.content}
            if r.thinking:
                d["thinking"] = r.thinking
            return {**d, "context": tokens + f.token_ids,
                    **cv.ollama_final_fields(f.stats, f.reason, time.perf_counter() - t0)}

        if not req.stream:
            r = await collect_reply(reply_events(st, job, family, opts, request))
            st.note(request, r.finish.stats, r.finish.reason, prompt)
            return done_line(r)

        def line(e: Delta) -> str:
            key = "thinking" if e.channel == "thinking" else "response"
            return _line({"model": st.model_id, "created_at": cv.ollama_now(), "response": "", key: e.text,
                          "done": False})

        async def lines():
            try:
                async for e in reply_events(st, job, family, opts):
                    if isinstance(e, Delta) and e.text:
                        yield line(e)
                    elif isinstance(e, Finish):
                        st.note(request, e.stats, e.reason, prompt)
                        yield _line(done_line(Reply(finish=e)))  # Ollama's final line carries no text
            except LocalrunError as e:
                yield _line({"error": e.message})

        return st.stream(job, lines(), "application/x-ndjson")


def _think(st: ServerState, think) -> tuple[bool | None, str | None]:
    """Ollama ``think`` (true/false, or "low"/"medium"/"high") → (think, level) for ``reply.prepare_chat``.
    Asking a model that does not think to think is a 400, as in Ollama."""
    if think is None:
        return None, None
    if family_of(st.engine.template_source).thinking is None:
        if think is False:
            return None, None
        raise RequestError(f"{st.model_id} does not support thinking (its chat template has no thinking block)",
                           param="think", code="unsupported_value", hint="leave 'think' out for this model")
    if isinstance(think, str):
        return True, think
    return bool(think), None


def _ollama_call(index: int, call_id: str, name: str, arguments: dict) -> dict:
    """One of Ollama's ``message.tool_calls``: ``arguments`` is an object (api/types.go ``ToolCall``)."""
    return {"id": call_id, "function": {"index": index, "name": name, "arguments": arguments}}


def _done_reason(reason: str) -> str:
    """Ollama's done_reason: a reply that called tools is "stop" there."""
    return "stop" if reason == "tool_calls" else reason


def _no_images(images) -> None:
    """Ollama answers an image for a text-only model with an error; so does localrun (no vision models)."""
    if images:
        raise RequestError(
            "this model does not support image input (localrun serves text-only models)",
            param="images",
            code="unsupported_value",
        )


def _entry(st: ServerState) -> dict:
    path = st.engine.model_path
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        mtime = st.started_s
    return cv.ollama_model_entry(st.model_id, st.spec, path, mtime)


def _rss_bytes() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # pragma: no cover
        return 0
