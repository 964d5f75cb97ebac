"""The Responses API's response object: ``skeleton`` (what ``response.created`` carries, before any output)
and ``final`` (the finished response, with its output, status and usage). No I/O, no engine.

It has every field the Open Responses specification requires (its ``ResponseResource`` schema, vendored in
tests/data/openresponses/), in every event that carries it: the sampling settings the reply ran with
(``temperature``, ``top_p``, the penalties; never null), ``completed_at`` (null until completed),
``top_logprobs`` 0 (no logprobs are returned), the client's ``safety_identifier``/``prompt_cache_key``
echoed, each function tool with its ``description``, ``parameters`` and ``strict``, a ``json_schema`` text
format with its ``description`` and ``strict``.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from localrun.backends.base import SamplingParams, Stats
from localrun.server.responses import convert as cv
from localrun.server.wire import cut_message

if TYPE_CHECKING:
    from localrun.server.reply import Finish
    from localrun.server.responses.schemas import ResponsesRequest


def skeleton(req: ResponsesRequest, model_id: str, params: SamplingParams) -> dict:
    """The response object before its output: what ``response.created`` carries. ``params``: the sampling
    the reply runs with (the request's values over llama.cpp's defaults), echoed as numbers."""
    return {"id": cv.new_id("resp"), "object": "response", "created_at": int(time.time()), "completed_at": None,
            "status": "in_progress", "background": False, "error": None, "incomplete_details": None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "max_tool_calls": None,
            "model": model_id, "output": [],
            "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                          "summary": req.reasoning.summary if req.reasoning else None},
            "service_tier": "default", "store": req.store is not False,
            "temperature": float(params.temperature), "top_p": float(params.top_p),
            "presence_penalty": float(params.presence_penalty), "frequency_penalty": float(params.frequency_penalty),
            "top_logprobs": 0,  # no logprobs are returned on this route
            "text": {"format": _format_echo(req.text.format if req.text is not None else None)},
            "tool_choice": _choice_echo(req.tool_choice),
            "tools": _tools_echo(req.tools), "truncation": req.truncation or "disabled", "usage": None,
            "user": req.user, "metadata": dict(req.metadata or {}), "safety_identifier": req.safety_identifier,
            "prompt_cache_key": req.prompt_cache_key}


def _format_echo(fmt) -> dict:
    """``text.format`` as the response echoes it: a ``json_schema`` one with every field the specification
    requires (``description`` null and ``strict`` false when not sent)."""
    if fmt is None:
        return {"type": "text"}
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    return {"type": "json_schema", "name": fmt.name or "", "description": fmt.description, "schema": fmt.schema_,
            "strict": fmt.strict is True}


def _choice_echo(choice) -> str | dict:
    """``tool_choice`` as the response echoes it: ``auto`` when not sent; an ``allowed_tools`` choice with its
    ``mode`` (``auto`` when not sent, as ``convert.tool_setup`` reads it)."""
    if choice is None:
        return "auto"
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools" and "mode" not in choice:
        return dict(choice, mode="auto")
    return choice


def _tools_echo(tools: list[dict] | None) -> list[dict]:
    """The tools the model was offered, as the response echoes them: a function tool with ``description``
    and ``parameters`` (null when not sent) and ``strict`` (true only when the client asked: otherwise its
    schema is enforced as far as the constraint engine can, convert.py); custom and namespace tools as
    sent. Hosted tools (left out, ``convert.tool_setup``) are not echoed: the model never had them."""
    out = []
    for t in tools or []:
        kind = t.get("type")
        if kind == "function":
            out.append(dict(t, description=t.get("description"), parameters=t.get("parameters"),
                            strict=t.get("strict") is True))
        elif kind in ("custom", "namespace"):
            out.append(t)
    return out


def final(base: dict, output: list[dict], finish: Finish, params: SamplingParams | None = None) -> dict:
    """The finished response: status ``completed`` (with ``completed_at``), or ``incomplete``
    (``max_output_tokens``; its last item ``incomplete`` too, ``OutputBuilder.finish``) when the
    token limit or the context ended it, or the loop guard ended a ``text.format`` answer (``params``'
    constraint) before it completed (``wire.wire_reason``; ``incomplete_details.message`` says so, localrun's
    extension); usage in the Responses API's names."""
    s = finish.stats or Stats()
    resp = dict(base, output=json.loads(json.dumps(output)), status="completed", completed_at=int(time.time()))
    if finish.reason == "length":
        resp["status"], resp["completed_at"] = "incomplete", None
        resp["incomplete_details"] = {"reason": "max_output_tokens"}
        if finish.looped and params is not None and params.constraint is not None:
            resp["incomplete_details"]["message"] = cut_message(params, looped=True)
    resp["usage"] = {"input_tokens": s.prompt_tokens, "input_tokens_details": {"cached_tokens": s.cached_tokens},
                     "output_tokens": s.completion_tokens,
                     "output_tokens_details": {"reasoning_tokens": finish.reasoning_tokens},
                     "total_tokens": s.prompt_tokens + s.completion_tokens}
    return resp
