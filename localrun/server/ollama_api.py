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

from localrun.backends.base import Message
from localrun.backends.serial import serving_mode
from localrun.errors import LocalrunError, ModelNotFoundError
from localrun.server import convert as cv
from localrun.server.errors import RequestError
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
        tools = [t.model_dump() for t in req.tools] if req.tools else None
        for m in req.messages:
            _no_images(m.images)
        if tools and not st.engine.supports_tools:
            raise RequestError(f"{st.model_id} does not support tools", param="tools", code="tools_unsupported")
        msgs = cv.messages_from_ollama(req.messages)
        prompt, tokens = await st.chat_tokens(msgs, tools)
        t0 = time.perf_counter()
        job = await st.start(request, tokens, params)

        def done_line(text, c):
            msg = {"role": "assistant", "content": text}
            if tools:
                content, calls = cv.parse_tool_calls(text)
                if calls:
                    msg = {
                        "role": "assistant",
                        "content": content,
                        "tool_calls": [
                            {
                                "function": {
                                    "name": tc["function"]["name"],
                                    "arguments": json.loads(tc["function"]["arguments"]),
                                }
                            }
                            for tc in calls
                        ],
                    }
            return {
                "model": st.model_id,
                "created_at": cv.ollama_now(),
                "message": msg,
                **cv.ollama_final_fields(c.stats, c.finish_reason, time.perf_counter() - t0),
            }

        if not req.stream:
            text, last, _ = await st.collect(request, job)
            st.note(request, last.stats, last.finish_reason, prompt)
            return done_line(text, last)

        async def lines():
            held = []
            try:
                async for c in st.chunks(job):
                    if c.finish_reason is None:
                        if tools:
                            held.append(c.text)
                        elif c.text:
                            yield _line(
                                {
                                    "model": st.model_id,
                                    "created_at": cv.ollama_now(),
                                    "message": {"role": "assistant", "content": c.text},
                                    "done": False,
                                }
                            )
                    else:
                        st.note(request, c.stats, c.finish_reason, prompt)
                        if c.text and not tools:  # Ollama's final line carries no text
                            yield _line(
                                {
                                    "model": st.model_id,
                                    "created_at": cv.ollama_now(),
                                    "message": {"role": "assistant", "content": c.text},
                                    "done": False,
                                }
                            )
                        yield _line(done_line("".join(held) + c.text if tools else "", c))
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
            prompt = (req.system + "\n\n" if req.system and not req.raw else "") + req.prompt
            new = await st.text_tokens(prompt, raw=req.raw)
        else:
            msgs = ([Message("system", req.system)] if req.system and not context else []) + [
                Message("user", req.prompt)
            ]
            prompt, new = await st.chat_tokens(msgs)
        bos = getattr(st.spec, "bos_token_id", None)
        if context and new and st.engine.add_bos and new[0] == bos:
            new = new[1:]  # the tokenizer added a BOS: keep only the one at the start of the context
        tokens = context + new
        st.check_fits(tokens, "prompt")
        t0 = time.perf_counter()
        job = await st.start(request, tokens, params)
        out_ids: list[int] = []

        def done_line(text, c):
            return {
                "model": st.model_id,
                "created_at": cv.ollama_now(),
                "response": text,
                "context": tokens + out_ids,
                **cv.ollama_final_fields(c.stats, c.finish_reason, time.perf_counter() - t0),
            }

        if not req.stream:
            parts, last = [], None
            async for c in st.chunks(job, request):
                parts.append(c.text)
                if c.token_id is not None:
                    out_ids.append(c.token_id)
                last = c
            st.note(request, last.stats, last.finish_reason, prompt)
            return done_line("".join(parts), last)

        async def lines():
            try:
                async for c in st.chunks(job):
                    if c.token_id is not None:
                        out_ids.append(c.token_id)
                    if c.finish_reason is None:
                        if c.text:
                            yield _line(
                                {"model": st.model_id, "created_at": cv.ollama_now(), "response": c.text, "done": False}
                            )
                    else:
                        st.note(request, c.stats, c.finish_reason, prompt)
                        if c.text:  # Ollama's final line carries no text
                            yield _line(
                                {"model": st.model_id, "created_at": cv.ollama_now(), "response": c.text, "done": False}
                            )
                        yield _line(done_line("", c))
            except LocalrunError as e:
                yield _line({"error": e.message})

        return st.stream(job, lines(), "application/x-ndjson")


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
