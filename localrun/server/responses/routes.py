"""The Responses routes: ``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items`` (package docstring).

A request runs as a chat request does (``reply.prepare_chat`` → the scheduler → ``reply.reply_events``);
``events.OutputBuilder`` turns the reply into output items, and the streaming answer sends each item's events
between ``response.created``/``response.in_progress`` and ``response.completed`` (``response.incomplete``
when ``max_output_tokens`` ended it, ``response.failed`` on an error), every event with its
``sequence_number``, and ends with ``data: [DONE]``. ``store`` (default true) keeps the response in
``store.ResponseStore``.

The response object itself (``response.created`` and the final one) is built in ``resource.py``.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from localrun.backends.base import SamplingParams
from localrun.errors import ContextOverflowError, LocalrunError
from localrun.server.errors import RequestError, error_info
from localrun.server.heartbeat import with_heartbeats
from localrun.server.models import ModelRegistry
from localrun.server.reply import Finish, prepare_chat, reply_events
from localrun.server.responses import convert as cv
from localrun.server.responses.events import OutputBuilder
from localrun.server.responses.resource import final, skeleton
from localrun.server.responses.schemas import ResponsesRequest
from localrun.server.responses.store import ResponseStore, owner_of
from localrun.server.wire import set_sampling_fields

log = logging.getLogger("localrun.server")


def register(app: FastAPI, reg: ModelRegistry) -> None:
    holder: dict = {}

    def store() -> ResponseStore:
        """The store, opened on first use (an app that never sees a Responses request writes no file)."""
        if "store" not in holder:
            path = getattr(reg.options, "responses_db", None) or reg.settings.home / "responses.db"
            holder["store"] = ResponseStore(path, scoped=bool(reg.options.api_key))
        return holder["store"]

    app.state.responses_store = store

    @app.post("/v1/responses")
    async def create(request: Request):
        st, req = await reg.routed(request, ResponsesRequest)
        _refuse_unbuilt(req)
        owner = owner_of(_api_key(request))
        context = await _context(store(), req, owner)
        items = cv.check_items(cv.input_items(req.input), cv.calls_in(context))
        if not items and not context:
            raise RequestError("'input' is required", param="input")
        setup = cv.tool_setup(req.tools, req.tool_choice)
        params = _sampling(req, st)
        think, level = cv.effort(req.reasoning)
        chat_tools, choice = setup.chat_tools, setup.choice
        if setup.forced_custom is not None:  # the whole reply is the tool's input, in its grammar
            if params.constraint is not None:
                raise RequestError("a forced custom tool cannot be combined with text.format", param="tool_choice")
            params.constraint = setup.custom[setup.forced_custom]
            think, choice = False, "auto"
            if not st.engine.supports_tools:
                chat_tools = None
        prompt, tokens, family, opts, dropped = await _prepare(st, req, context + items, chat_tools, choice,
                                                               think, level, params)
        if setup.forced_custom is not None:
            opts.tools, opts.tool_choice = None, None
        job = await st.start(request, tokens, params)
        if dropped:
            log.info("responses: truncation dropped the %d oldest input items", dropped)
        base = skeleton(req, st.model_id, params)
        builder = OutputBuilder(custom=set(setup.custom), forced_custom=setup.forced_custom,
                                encrypted_reasoning="reasoning.encrypted_content" in (req.include or []),
                                namespaces=setup.namespaces)

        def finished(finish: Finish) -> dict:
            """The response once the reply ended: logged, and stored unless ``store`` is false."""
            st.note(request, finish.stats, finish.reason, prompt)
            resp = final(base, builder.output, finish, params)
            if req.store is not False:
                store().put(resp, owner=owner, input_items=items)
            return resp

        if not req.stream:
            finish = None
            async for e in reply_events(st, job, family, opts, request):
                if isinstance(e, Finish):
                    finish = e
                else:
                    builder.feed(e)
            builder.finish(incomplete=finish.reason == "length")
            return finished(finish)
        return st.stream(job, _events(reply_events(st, job, family, opts), base, builder, finished),
                         "text/event-stream")

    @app.get("/v1/responses/{response_id}")
    async def retrieve(request: Request, response_id: str):
        row = await run_in_threadpool(store().get, response_id, owner_of(_api_key(request)))
        return _found(row, response_id)["response"]

    @app.delete("/v1/responses/{response_id}")
    async def delete(request: Request, response_id: str):
        if not store().delete(response_id, owner_of(_api_key(request))):
            _found(None, response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(request: Request, response_id: str, limit: int = 20, order: str = "desc",
                          after: str | None = None):
        row = _found(await run_in_threadpool(store().get, response_id, owner_of(_api_key(request))), response_id)
        if not 1 <= limit <= 100:
            raise RequestError("limit must be between 1 and 100", param="limit")
        if order not in ("asc", "desc"):
            raise RequestError("order must be 'asc' or 'desc'", param="order")
        data = row["input"] if order == "asc" else row["input"][::-1]
        if after is not None:
            ids = [d.get("id") for d in data]
            if after not in ids:
                raise RequestError(f"after {after!r} is not an item of this response", param="after")
            data = data[ids.index(after) + 1:]
        page = data[:limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(data) > limit}


DONE = "data: [DONE]\n\n"  # the stream's last line (Open Responses: "The terminal event MUST be [DONE]")


async def _events(replies, base: dict, builder: OutputBuilder, finished):
    """The SSE stream of one response: ``event:`` and ``data:`` lines, each event with its
    ``sequence_number`` (module docstring), then ``data: [DONE]``; ``finished(finish)`` makes the final
    response."""
    seq = 0

    def sse(event: dict) -> str:
        nonlocal seq
        event = dict(event, sequence_number=seq)
        seq += 1
        return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"

    yield sse({"type": "response.created", "response": base})
    yield sse({"type": "response.in_progress", "response": base})
    try:
        async for e in with_heartbeats(replies):
            if e is None:  # a long prefill: an event Codex's stream_idle_timeout_ms counts (heartbeat.py)
                yield sse({"type": "response.in_progress", "response": base})
                continue
            if isinstance(e, Finish):
                for ev in builder.finish(incomplete=e.reason == "length"):
                    yield sse(ev)
                resp = finished(e)
                kind = "response.completed" if resp["status"] == "completed" else "response.incomplete"
                yield sse({"type": kind, "response": resp})
                yield DONE
                return
            for ev in builder.feed(e):
                yield sse(ev)
    except LocalrunError as exc:
        err = error_info(exc)[1]["error"]
        failed = dict(base, status="failed", output=builder.output,
                      error={"code": err.get("code") or err["type"], "message": err["message"]})
        yield sse({"type": "response.failed", "response": failed})
        yield DONE


def _refuse_unbuilt(req: ResponsesRequest) -> None:
    """A 400 for what localrun does not build: background responses, conversations, stored prompts."""
    if req.background:
        raise RequestError("background responses are not supported: send the request without 'background' "
                           "(stream it to see progress)", param="background", code="unsupported_value")
    for name, why in (("conversation", "the Conversations API is not built: continue with previous_response_id"),
                      ("prompt", "prompt templates live at OpenAI: send the prompt as instructions and input")):
        if getattr(req, name) is not None:
            raise RequestError(f"'{name}' is not supported: {why}", param=name, code="unsupported_value")


async def _context(store: ResponseStore, req: ResponsesRequest, owner: str) -> list[dict]:
    """The conversation before this request's input: the items of ``previous_response_id``'s turns, its
    output included ([] without one). RequestError when it names no response ``owner`` may see."""
    if req.previous_response_id is None:
        return []
    items = await run_in_threadpool(store.conversation, req.previous_response_id, owner)
    if items is None:
        raise RequestError(f"previous_response_id {req.previous_response_id!r} names no stored response (or "
                           "one of the responses it continued was deleted)", param="previous_response_id",
                           code="previous_response_not_found",
                           hint="store the earlier responses (store: true, the default) and use the last one's id")
    return items


def _found(row: dict | None, response_id: str) -> dict:
    if row is None:
        raise RequestError(f"no stored response with id {response_id!r}", param="response_id", code="not_found",
                           status=404)
    return row


def _api_key(request: Request) -> str | None:
    """The API key the client sent (``Authorization: Bearer``, else ``x-api-key``)."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def _sampling(req: ResponsesRequest, st) -> SamplingParams:
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    fmt = req.text.format if req.text is not None else None
    p = SamplingParams(max_tokens=req.max_output_tokens, stop=stop, stop_loops=st.options.stop_loops,
                       constraint=cv.format_constraint(fmt))
    return set_sampling_fields(p, req)


async def _prepare(st, req, items, tools, choice, think, level, params):
    """``prepare_chat`` on the conversation; with ``truncation: auto`` the oldest items are dropped (whole
    turns: a tool's output never without its call) until it fits. → (prompt, tokens, family, options,
    items dropped). Raises ContextOverflowError naming ``input`` (truncation disabled, or one turn alone
    does not fit)."""
    dropped = 0
    while True:
        msgs = cv.messages_from_items(req.instructions, items[dropped:])
        try:
            prompt, tokens, family, opts = await prepare_chat(
                st, msgs, tools=tools, tool_choice=choice, think=think, level=level, budget=None, params=params,
                parallel_tool_calls=req.parallel_tool_calls is True)
            return prompt, tokens, family, opts, dropped
        except ContextOverflowError as e:
            nxt = _next_turn(items, dropped)
            if req.truncation != "auto" or nxt is None:
                e.param = "input"
                raise
            dropped = nxt


def _next_turn(items: list[dict], start: int) -> int | None:
    """Where the conversation's next user message after ``start`` begins (None: there is none)."""
    for i in range(start + 1, len(items)):
        it = items[i]
        if it["type"] == "message" and it["role"] == "user":
            return i
    return None
