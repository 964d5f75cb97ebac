"""OpenAI wire format: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``.

Streaming answers are Server-Sent Events (``data: {json}\\n\\n`` … ``data: [DONE]``), one event per
token chunk, as OpenAI's API sends them. An error after the stream started arrives as an
``data: {"error": {...}}`` event (the status line is already sent).
"""

from __future__ import annotations

from fastapi import FastAPI, Request

from localrun.dialects import Delta, ToolCallArgs, ToolCallStart
from localrun.errors import LocalrunError, ModelNotFoundError
from localrun.server.errors import RequestError, error_info
from localrun.server.heartbeat import with_heartbeats
from localrun.server.models import ModelRegistry
from localrun.server.openai import convert as cv
from localrun.server.openai.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from localrun.server.reply import Finish, Logprobs, collect_reply, prepare_chat, reply_events


def register(app: FastAPI, reg: ModelRegistry) -> None:
    @app.get("/v1/models")
    async def models() -> dict:
        """The resident models first (``meta.loaded`` true), then every model this server can load."""
        from starlette.concurrency import run_in_threadpool

        from localrun.server.listing import loadable

        entries = await loadable(reg)
        generic = reg.options.generic_tools
        return {"object": "list", "data": await run_in_threadpool(lambda: [_card(e, generic) for e in entries])}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        from localrun.server.listing import loadable

        for e in await loadable(reg):
            if model_id in (e.name, f"{e.name}:latest") or e.resident is not None and model_id in e.resident.names():
                from starlette.concurrency import run_in_threadpool

                return await run_in_threadpool(_card, e, reg.options.generic_tools)
        raise ModelNotFoundError(model_id, hint="GET /v1/models lists the models this server can load")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        st, req = await reg.routed(request, ChatCompletionRequest)
        messages = cv.messages_from_openai(req.messages)
        max_tokens = req.max_completion_tokens or req.max_tokens
        top = (req.top_logprobs or 0) if req.logprobs else None
        params = cv.sampling_from_openai(req, stop_loops=st.options.stop_loops, max_tokens=max_tokens, logprobs=top)
        think, level = _effort(req.reasoning_effort)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        prompt, tokens, family, opts = await prepare_chat(
            st, messages, tools=tools, tool_choice=req.tool_choice, think=think, level=level,
            budget=req.reasoning_budget, params=params, raw_thinking=req.reasoning_format == "none",
            template_kwargs=req.chat_template_kwargs, parallel_tool_calls=bool(req.parallel_tool_calls))
        job = await st.start(request, tokens, params)
        rid, created = cv.new_id("chatcmpl"), cv.now_s()
        if not req.stream:
            r = await collect_reply(reply_events(st, job, family, opts, request))
            f = r.finish
            st.note(request, f.stats, f.reason, prompt)
            calls = [cv.openai_tool_call(c.id, c.name, c.arguments) for c in r.tool_calls] or None
            return cv.mark_incomplete(cv.chat_response(rid, created, st.model_id, r.content, f.reason, f.stats,
                                                       r.logprobs if top is not None else None, calls,
                                                       thinking=r.thinking, reasoning_tokens=f.reasoning_tokens),
                                      params, f.reason, looped=f.looped)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(delta: dict, finish: str | None = None, logprobs=None, looped: bool = False) -> str:
            c = cv.mark_incomplete(cv.chat_chunk(rid, created, st.model_id, delta, finish, logprobs=logprobs),
                                   params, finish, looped=looped)
            if include_usage:  # OpenAI: with include_usage every other chunk carries "usage": null
                c["usage"] = None
            return cv.sse(c)

        async def events():
            yield chunk({"role": "assistant", "content": ""})
            pending = None  # the last delta, held so that its chunk's logprobs ride with it
            try:
                async for e in with_heartbeats(reply_events(st, job, family, opts)):
                    if e is None:  # a long prefill: an empty delta every client reads as a chunk
                        yield chunk({})
                        continue
                    if isinstance(e, Logprobs):
                        yield chunk(pending or {"content": ""}, logprobs=e.items)
                        pending = None
                        continue
                    if pending is not None:
                        yield chunk(pending)
                        pending = None
                    if isinstance(e, Finish):
                        yield chunk({}, e.reason, looped=e.looped)
                        st.note(request, e.stats, e.reason, prompt)
                        if include_usage:
                            yield cv.sse(cv.usage_chunk(rid, created, st.model_id, e.stats, "chat.completion.chunk",
                                                        e.reasoning_tokens))
                    else:
                        pending = _stream_delta(e)
            except LocalrunError as e:
                yield cv.sse(error_info(e)[1])
            yield "data: [DONE]\n\n"

        return st.stream(job, events(), "text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        st, req = await reg.routed(request, CompletionRequest)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise RequestError("only one prompt per request is supported (send several requests: they are "
                                   "batched together)", param="prompt", code="unsupported_value")
            prompt = prompt[0]
        if req.suffix:
            raise RequestError("suffix (fill-in-the-middle) is not supported", param="suffix",
                               code="unsupported_value")
        # no max_tokens: until the model stops, a stop string or the context is full, as on chat and as
        # llama-server and Ollama do (n_predict / num_predict -1); OpenAI's legacy default of 16 tokens would
        # cut every local completion short without a word (docs/serve.md, Length and loops)
        max_tokens = req.max_tokens
        params = cv.sampling_from_openai(
            req, stop_loops=st.options.stop_loops, max_tokens=max_tokens, logprobs=req.logprobs
        )
        tokens = await st.text_tokens(prompt)
        job = await st.start(request, tokens, params)
        rid, created = cv.new_id("cmpl"), cv.now_s()
        echo = prompt if (req.echo and isinstance(prompt, str)) else ""
        log_prompt = prompt if isinstance(prompt, str) else None
        if not req.stream:
            text, last, lps = await st.collect(request, job)
            st.note(request, last.stats, last.finish_reason, log_prompt)
            lp = cv.completion_logprobs(lps, len(echo)) if req.logprobs is not None else None
            return cv.mark_incomplete(cv.completion_response(rid, created, st.model_id, echo + text,
                                                             last.finish_reason, last.stats, lp),
                                      params, last.finish_reason)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def piece(text: str, finish: str | None, lp=None) -> str:
            c = cv.mark_incomplete(cv.completion_response(rid, created, st.model_id, text, finish, None, lp),
                                   params, finish)
            if include_usage:  # OpenAI: with include_usage every other chunk carries "usage": null
                c["usage"] = None
            return cv.sse(c)

        async def events():
            try:
                if echo:
                    yield piece(echo, None)
                async for c in with_heartbeats(st.chunks(job)):
                    if c is None:  # a long prefill: an empty piece every client reads as a chunk
                        yield piece("", None)
                        continue
                    lp = cv.completion_logprobs(c.logprobs) if (c.logprobs and req.logprobs is not None) else None
                    if c.text or c.finish_reason is not None:
                        yield piece(c.text, c.finish_reason, lp)
                    if c.finish_reason is not None:
                        st.note(request, c.stats, c.finish_reason, log_prompt)
                        if include_usage:
                            yield cv.sse(cv.usage_chunk(rid, created, st.model_id, c.stats, "text_completion"))
            except LocalrunError as e:
                yield cv.sse(error_info(e)[1])
            yield "data: [DONE]\n\n"

        return st.stream(job, events(), "text/event-stream")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        st, req = await reg.routed(request, EmbeddingRequest)
        inp = req.input
        if isinstance(inp, str) or (isinstance(inp, list) and inp and isinstance(inp[0], int)):
            inp = [inp]
        dim = int(getattr(st.spec, "n_embd", 0) or 0)
        if req.dimensions is not None and req.dimensions != dim:
            # OpenAI truncates its v3 models' (Matryoshka) embeddings; a GGUF's pooled embedding is not
            # trained for that, so say so instead of returning a vector of another length
            raise RequestError(
                f"this model's embeddings have {dim} dimensions; 'dimensions' cannot change that",
                param="dimensions",
                code="unsupported_value",
            )
        vectors, n = await st.embed(request, inp, "input")
        return {
            "object": "list",
            "model": st.model_id,
            "data": [
                {"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)}
                for i, v in enumerate(vectors)
            ],
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }


def _encode(vec: list[float], fmt: str):
    """``float``: a JSON list; ``base64``: little-endian float32 bytes, base64 (what the openai client asks for)."""
    if fmt == "float":
        return vec
    import base64
    import struct

    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()


def _card(e, generic_tools: bool = False) -> dict:
    """One ``/v1/models`` entry (OpenAI's model object: ``id``, ``object``, ``created``, ``owned_by``; ``meta``
    is llama-server's extra field: ``listing.model_meta``, the capabilities included; ``generic_tools``: the
    server offers its generic tool format, ``ServeOptions.generic_tools``). Reads the header of a model not
    loaded: call it off the event loop."""
    from localrun.server.listing import model_meta

    r = e.resident
    meta = model_meta(e, generic_tools=generic_tools)
    if r is not None:
        meta.update(n_ctx=r.state.engine.n_ctx, n_parallel=r.state.engine.n_parallel)
    return {"id": e.name, "object": "model", "created": int(r.state.started_s if r is not None else e.mtime_s),
            "owned_by": "localrun", "meta": meta}


def _effort(effort: str | None) -> tuple[bool | None, str | None]:
    """OpenAI ``reasoning_effort`` → (think, level) for ``reply.prepare_chat``."""
    if effort is None:
        return None, None
    if effort == "none":
        return False, None
    return True, effort


def _stream_delta(e) -> dict | None:
    """A reply event → the ``delta`` of a ``chat.completion.chunk`` (None: nothing to send). Tool calls
    stream as OpenAI's: the call's index, id and name first, then pieces of the arguments string."""
    if isinstance(e, Delta):
        if not e.text:
            return None
        if e.channel == "thinking":
            return {"reasoning_content": e.text, "reasoning": e.text}
        return {"content": e.text}
    if isinstance(e, ToolCallStart):
        return {"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                "function": {"name": e.name, "arguments": ""}}]}
    if isinstance(e, ToolCallArgs) and e.text:
        return {"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]}
    return None  # ToolCallEnd: the arguments are all sent
