"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Clients written for Anthropic (its SDKs, coding agents with ``ANTHROPIC_BASE_URL``) talk to the local model.
The request becomes the same chat history, tools and reasoning control as the OpenAI and Ollama routes
(``convert.py``), goes through ``reply.prepare_chat``, and the reply's events (``reply.reply_events``)
become Anthropic's content blocks: ``thinking`` (with a local ``signature``), ``text`` and ``tool_use``.
A streamed reply is Anthropic's event sequence (``event: NAME`` + ``data: {json}``): ``message_start``,
``ping``, per block ``content_block_start`` / ``content_block_delta`` (``text_delta``, ``thinking_delta``,
``signature_delta``, ``input_json_delta``) / ``content_block_stop``, then ``message_delta`` (stop_reason,
usage) and ``message_stop``. Every ``heartbeat.HEARTBEAT_S`` seconds without events (a long prefill) a ``ping``
goes out, and a ``message_delta`` that changes nothing (``HEARTBEAT_DELTA``): Claude Code's stream watchdog
(300 s) does not count pings, and Anthropic's stream may carry several ``message_delta`` events. An error
after the stream started is an ``event: error``.

Errors on these routes take Anthropic's shape (``convert.error_response``, through the wing's
``error_response``: ``server/wings.py``); the API key is accepted as ``x-api-key`` as well as
``Authorization: Bearer``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request

from localrun.backends.base import SamplingParams
from localrun.errors import LocalrunError
from localrun.server.anthropic import convert as ac
from localrun.server.anthropic.schemas import CountTokensRequest, MessagesRequest
from localrun.server.errors import QueueFullError, error_info
from localrun.server.heartbeat import with_heartbeats
from localrun.server.models import ModelRegistry
from localrun.server.runtime import ServerState

# a message_delta that changes nothing (no stop reason yet, no tokens): Anthropic's stream may carry several
HEARTBEAT_DELTA = {"type": "message_delta", "delta": {"stop_reason": None, "stop_sequence": None},
                   "usage": {"output_tokens": 0}}


def register(app: FastAPI, reg: ModelRegistry) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request):
        st, req = await reg.routed(request, MessagesRequest)
        tap = _TokenTap(st)
        prompt, tokens, family, opts, params = await _prepare(st, req)
        job = await st.start(request, tokens, params)
        cached = int(getattr(job.gen, "cached_tokens", 0) or 0)
        builder = ac.MessageBuilder(st.model_id, len(tokens), cached)
        from localrun.server.reply import Finish, reply_events

        if not req.stream:
            async for ev in reply_events(tap, job, family, opts, request):
                if isinstance(ev, Finish):
                    _finish(st, request, builder, ev, tap, params, prompt)
                else:
                    builder.feed(ev)
            return builder.message()

        async def events():
            for name, data in builder.start():
                yield ac.sse_event(name, data)
            yield ac.sse_event("ping", {"type": "ping"})
            try:
                async for ev in with_heartbeats(reply_events(tap, job, family, opts)):
                    if ev is None:  # a long prefill: Claude Code's stream watchdog skips pings (300 s)
                        yield ac.sse_event("ping", {"type": "ping"})
                        yield ac.sse_event("message_delta", HEARTBEAT_DELTA)
                        continue
                    out = _finish(st, request, builder, ev, tap, params, prompt) if isinstance(ev, Finish) \
                        else builder.feed(ev)
                    for name, data in out:
                        yield ac.sse_event(name, data)
            except LocalrunError as e:
                status, body = error_info(e)
                _, err = ac.error_response(status, body["error"]["message"], overloaded=isinstance(e, QueueFullError))
                yield ac.sse_event("error", err)

        return st.stream(job, events(), "text/event-stream")

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        st, req = await reg.routed(request, CountTokensRequest)
        _, tokens, _, _, _ = await _prepare(st, req)
        return {"input_tokens": len(tokens)}


async def _prepare(st: ServerState, req):
    """Request → (prompt text, prompt tokens, family, reply options, sampling params), through
    ``reply.prepare_chat``; a final assistant turn (prefill) is appended to the prompt as plain text."""
    from localrun.server.reply import prepare_chat

    history = ac.history_from_anthropic(req)
    prefill = ac.prefill_text(req)
    if prefill is not None:
        history = history[:-1]
    tools, choice = ac.tools_from_anthropic(req)
    think, level, budget = ac.reasoning_from_anthropic(req)
    params = ac.sampling_from_anthropic(req, stop_loops=st.options.stop_loops) if isinstance(req, MessagesRequest) \
        else SamplingParams()
    prompt, tokens, family, opts = await prepare_chat(st, history, tools=tools, tool_choice=choice, think=think,
                                                      level=level, budget=budget, params=params)
    if prefill:
        from starlette.concurrency import run_in_threadpool

        tokens = tokens + await run_in_threadpool(st.engine.tokenize, prefill, add_special=False, parse_special=False)
        prompt += prefill
        st.check_fits(tokens)
    return prompt, tokens, family, opts, params


def _finish(st: ServerState, request: Request, builder: ac.MessageBuilder, fin, tap: "_TokenTap",
            params: SamplingParams, prompt: str) -> list[tuple[str, dict]]:
    s = fin.stats
    st.note(request, s, fin.reason, prompt)
    stop_seq = tap.stop_sequence(params.stop, params) if fin.reason == "stop" else None
    return builder.finish(fin.reason, s.completion_tokens, prompt_tokens=s.prompt_tokens or None,
                          cached_tokens=s.cached_tokens if s.prompt_tokens else None, stop_sequence=stop_seq)


class _TokenTap:
    """``ServerState`` as ``reply_events`` sees it, keeping the ids of the generated tokens so that the stop
    sequence that ended a reply can be named (Anthropic's ``stop_sequence``; the engine cuts it from the text)."""

    def __init__(self, st: ServerState) -> None:
        self._st = st
        self.ids: list[int] = []

    def __getattr__(self, name):
        return getattr(self._st, name)

    async def chunks(self, job, request=None):
        async for c in self._st.chunks(job, request):
            if c.token_id is not None:
                self.ids.append(c.token_id)
            yield c

    def stop_sequence(self, stops, params=None) -> str | None:
        """The stop sequence that ended the generation, None when it ended on an end-of-generation token
        (or a satisfied constraint). The engine stops at the first hit, so it is the earliest one in the
        generated answer (list order breaks a tie, as ``backends.text.TextStream`` does; the thinking block
        is not searched, ``AnswerStart`` with ``params``' thinking markers)."""
        from localrun.backends.text import AnswerStart

        stops = [s for s in stops or () if s]
        eng = self._st.engine
        if not stops or not self.ids or eng.is_eog(self.ids[-1]):
            return None
        text = eng.detokenize(self.ids)
        at = AnswerStart(getattr(params, "think_open", ""), getattr(params, "think_close", ""),
                         bool(getattr(params, "starts_in_thinking", False))).update(text)
        if at is None:  # the answer never began: no stop sequence can have ended it
            return None
        hits = [(i, n) for n, i in enumerate(text.find(s, at) for s in stops) if i >= 0]
        return stops[min(hits)[1]] if hits else None
