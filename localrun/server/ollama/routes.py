"""Ollama wire format: ``/api/chat``, ``/api/generate`` (NDJSON streaming), ``/api/show``, ``/api/embed``,
``/api/version`` (Ollama docs/api.md); the model management routes (``/api/tags``, ``/api/ps``, ``/api/pull``,
``/api/delete``, ``/api/copy``, load/unload by an empty prompt) are in ``admin.py``. Errors are
``{"error": "message"}``.

``model`` picks the model (``server/models.py``); ``keep_alive`` sets how long it stays after the request.
"""

from __future__ import annotations

import json
import os
import time

from fastapi import FastAPI, Request

from localrun.dialects import Delta, ToolCallEnd, ToolCallStart
from localrun.errors import LocalrunError
from localrun.server.errors import RequestError
from localrun.server.facts import model_capabilities
from localrun.server.keepalive import parse_keep_alive, request_n_ctx
from localrun.server.models import ModelRegistry
from localrun.server.ollama import convert as cv
from localrun.server.ollama.schemas import (
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
)
from localrun.server.reply import (
    Finish,
    Reply,
    ReplyOptions,
    collect_reply,
    family_of,
    prepare_chat,
    reply_events,
    tools_supported,
)
from localrun.server.runtime import ServerState


def _line(obj) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


def register(app: FastAPI, reg: ModelRegistry) -> None:
    from localrun.server.ollama import admin as ollama_admin

    ollama_admin.register(app, reg)

    @app.get("/api/version")
    async def version() -> dict:
        from localrun import __version__

        return {"version": __version__}

    @app.post("/api/show")
    async def show(request: Request) -> dict:
        show = await reg.reader.parse(request, OllamaShowRequest, lenient_type=True)
        name = show.model or show.name
        if not name:
            raise RequestError("'model' is required", param="model")
        key = await reg.names.resolve_strict(name)
        r = reg.residents.get(key)
        if r is None:
            return await ollama_admin.show_unloaded(name, key, generic_tools=reg.options.generic_tools)
        st = r.state
        spec = st.spec
        tpl = st.engine.template_source or ""
        caps = model_capabilities(st).ollama()
        info = {"general.architecture": spec.arch, "general.name": spec.name,
                "general.parameter_count": spec.n_params, "general.file_type": spec.file_type,
                f"{spec.arch}.context_length": spec.n_ctx_train, f"{spec.arch}.block_count": spec.n_layer,
                f"{spec.arch}.embedding_length": spec.n_embd, f"{spec.arch}.attention.head_count": spec.n_head,
                f"{spec.arch}.attention.head_count_kv": spec.n_head_kv}
        proj = getattr(st.engine, "projector", None)
        extra = {"projector_info": {"general.architecture": "clip", "path": proj.path}} if proj is not None else {}
        return {"license": "", "modelfile": f"FROM {st.engine.model_path}\n", "parameters": "",
                "template": tpl, "details": cv.ollama_details(spec), "model_info": info,
                "capabilities": caps, "modified_at": _entry(st)["modified_at"], **extra}

    @app.post("/api/embed")
    async def embed(request: Request) -> dict:
        st, req = await reg.routed(request, OllamaEmbedRequest, lenient_type=True)
        inputs = [req.input] if isinstance(req.input, str) else list(req.input or [])
        t0 = time.perf_counter()
        vectors, n = await st.embed(request, inputs, "input", truncate=req.truncate)
        return {"model": st.model_id, "embeddings": vectors, "total_duration": int((time.perf_counter() - t0) * 1e9),
                "load_duration": 0, "prompt_eval_count": n}

    @app.post("/api/embeddings")  # Ollama's older endpoint: one prompt, one vector
    async def embeddings(request: Request) -> dict:
        st, req = await reg.routed(request, OllamaEmbedRequest, lenient_type=True)
        vectors, _ = await st.embed(request, [req.prompt] if req.prompt else [], "prompt", truncate=req.truncate)
        return {"embedding": vectors[0]}

    @app.post("/api/chat")
    async def chat(request: Request):
        req = await reg.reader.parse(request, OllamaChatRequest, lenient_type=True)
        keep = parse_keep_alive(req.keep_alive)
        if not req.messages:  # Ollama: an empty chat loads the model (keep_alive 0: unloads it)
            name, reason = await ollama_admin.load_or_unload(reg, request, req.model, keep, request_n_ctx(req))
            return {"model": name, "created_at": cv.ollama_now(), "message": {"role": "assistant", "content": ""},
                    "done_reason": reason, "done": True}
        st = await reg.state_for(request, req.model, keep_alive_s=keep, n_ctx=request_n_ctx(req))
        params = cv.sampling_from_ollama(req.options, req.format, stop_loops=st.options.stop_loops)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        if tools and not tools_supported(st):  # only under --no-generic-tools, on a template without tools
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
        req = await reg.reader.parse(request, OllamaGenerateRequest, lenient_type=True)
        keep = parse_keep_alive(req.keep_alive)
        if not req.prompt and not req.system:  # Ollama: loads the model (keep_alive 0: unloads it)
            name, reason = await ollama_admin.load_or_unload(reg, request, req.model, keep, request_n_ctx(req))
            return {"model": name, "created_at": cv.ollama_now(), "response": "", "done": True,
                    "done_reason": reason}
        st = await reg.state_for(request, req.model, keep_alive_s=keep, n_ctx=request_n_ctx(req))
        params = cv.sampling_from_ollama(req.options, req.format, stop_loops=st.options.stop_loops)
        if req.raw or not st.engine.has_chat_template:
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
                _user_message(req.prompt, req.images)
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
    """Images need the chat template (the projector's tokens go where the template puts the message)."""
    if images:
        raise RequestError("images need the chat template: a raw prompt cannot hold them", param="images",
                           code="unsupported_value", hint="send the request without raw, or without images")


def _user_message(prompt: str, images: list[str] | None) -> dict:
    """/api/generate's prompt and ``images`` (base64) → the user message dict, the images before the text."""
    from localrun.backends.images import IMAGE_MARKER
    from localrun.server.images import image_from_base64

    if not images:
        return {"role": "user", "content": prompt}
    return {"role": "user", "content": IMAGE_MARKER * len(images) + prompt,
            "images": [image_from_base64(b, f"images[{j}]") for j, b in enumerate(images)]}


def _entry(st: ServerState) -> dict:
    path = st.engine.model_path
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        mtime = st.started_s
    return cv.ollama_model_entry(st.model_id, st.spec, path, mtime)
