"""Pure converters between OpenAI's wire format (``schemas.py``) and the engine's data (``backends/base.py``).

No I/O, no engine, no globals: request → (message dicts, ``SamplingParams``, grammar), and engine
``Chunk``/``Stats`` → OpenAI's response dicts (``chat.completion``, its stream chunks, ``text_completion``,
``usage``) and Server-Sent Events. What Ollama's converters share with these is in ``server/wire.py``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Sequence

from localrun.backends.base import Constraint, SamplingParams, Stats, TokenLogprob
from localrun.server.errors import RequestError
from localrun.server.wire import cut_message, finish_reason, message_dict, set_sampling_fields, speculative_usage

# ---------------------------------------------------------------------------------------------- requests


def messages_from_openai(msgs) -> list[dict]:
    """OpenAI messages → the chat template's message dicts: role (``developer`` → ``system``), content (text
    parts joined; null → ""), and where present name, tool_calls (arguments as sent: string or object),
    tool_call_id and reasoning_content (an earlier turn's thinking: ``reasoning_content`` or ``reasoning``).

    Raises RequestError on an empty list or a user/system message without content.
    """
    if not msgs:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    for i, m in enumerate(msgs):
        if m.content is None and m.role in ("system", "developer", "user"):
            raise RequestError(f"messages[{i}] ({m.role}) has no content", param=f"messages.{i}.content")
    return [message_dict(m, i) for i, m in enumerate(msgs)]


def constraint_for(req) -> tuple[Constraint | None, str | None]:
    """A request's structured-output fields → (``Constraint`` for llguidance, or None; GBNF for llama.cpp's
    own grammar sampler, or None). At most one of: OpenAI ``response_format`` (``json_object``,
    ``json_schema`` with ``strict``, llama-server's ``{"type": "json_object", "schema": ...}``), llama-server's
    ``json_schema`` and ``grammar`` (GBNF, converted to llguidance's Lark; one llguidance cannot take goes to
    llama.cpp's grammar sampler, llama.cpp backend only), localrun's ``regex``. Checked here, so what cannot
    be enforced is a 400 before anything runs (``ConstraintError``: keyword and JSON Pointer).

    A schema is always enforced exactly or refused; ``strict: true`` also closes every object and requires
    every property (OpenAI's Structured Outputs, ``constrain.grammar.strict_schema``).
    Raises RequestError when two are given or a json_schema has no schema, ConstraintError."""
    from localrun.constrain import check, gbnf_to_lark
    from localrun.errors import ConstraintError

    rf = getattr(req, "response_format", None)
    given = [(name, v) for name, v in (("response_format", rf if rf is not None and rf.type != "text" else None),
                                       ("json_schema", getattr(req, "json_schema", None)),
                                       ("grammar", getattr(req, "grammar", None) or None),
                                       ("regex", getattr(req, "regex", None) or None)) if v is not None]
    if len(given) > 1:
        raise RequestError(f"{given[0][0]} and {given[1][0]} both constrain the output: send one",
                           param=given[1][0])
    if not given:
        return None, None
    field, value = given[0]
    if field == "response_format":
        c = _response_format_constraint(value)
    elif field == "json_schema":
        c = Constraint("json_schema", value, param="json_schema")
    elif field == "regex":
        c = Constraint("regex", value, param="regex")
    else:
        try:
            c = Constraint("lark", gbnf_to_lark(value, param="grammar"), param="grammar")
            check(c)
        except ConstraintError:
            return None, value  # llama.cpp's grammar sampler reads it (or says it does not parse)
        return c, None
    check(c)
    return c, None


def _response_format_constraint(rf) -> Constraint:
    if rf.type == "json_object":
        if rf.schema_ is not None:  # llama-server: {"type": "json_object", "schema": {...}}
            return Constraint("json_schema", rf.schema_, param="response_format.schema")
        return Constraint("json_object", param="response_format")
    js = rf.json_schema
    if js is None or js.schema_ is None:
        raise RequestError("response_format json_schema needs json_schema.schema",
                           param="response_format.json_schema",
                           hint='send {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}')
    if js.strict:  # OpenAI Structured Outputs: every object closed, every property required
        from localrun.constrain.grammar import strict_schema

        return Constraint("json_schema", strict_schema(js.schema_), param="response_format.json_schema.schema",
                          strict=True)
    return Constraint("json_schema", js.schema_, param="response_format.json_schema.schema")


def _logit_bias(raw: dict | None) -> dict[int, float]:
    out = {}
    for k, v in (raw or {}).items():
        try:
            tok = int(k)
        except (TypeError, ValueError):
            raise RequestError(f"logit_bias key {k!r} is not a token id", param="logit_bias") from None
        bias = float(v)
        if not -100.0 <= bias <= 100.0:  # OpenAI's range; a value beyond it was clamped silently before
            raise RequestError(f"logit_bias[{k!r}] is {v!r}: a bias must be between -100 and 100 "
                               "(-100 bans the token, 100 all but forces it)", param=f"logit_bias.{k}")
        out[tok] = bias
    return out


def sampling_from_openai(req, *, max_tokens: int | None, logprobs: int | None,
                         stop_loops: bool = False) -> SamplingParams:
    """OpenAI sampling fields → ``SamplingParams``; unset fields keep llama.cpp's defaults (no DRY, no
    repeat penalty) and ``stop_loops`` (``serve --stop-loops``) unless the request sets it. The
    structured-output fields become ``constraint`` / ``grammar`` (``constraint_for``)."""
    if req.n != 1:
        raise RequestError("n > 1 is not supported: send separate requests (they are batched together)",
                           param="n", code="unsupported_value")
    constraint, grammar = constraint_for(req)
    p = SamplingParams(max_tokens=max_tokens, stop=list(req.stop or []), logprobs=logprobs, grammar=grammar,
                       logit_bias=_logit_bias(req.logit_bias), ignore_eos=bool(req.ignore_eos),
                       stop_loops=stop_loops, constraint=constraint)
    return set_sampling_fields(p, req)


# ---------------------------------------------------------------------------------------------- responses


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now_s() -> int:
    return int(time.time())


def usage(stats: Stats | None, reasoning_tokens: int = 0) -> dict:
    """OpenAI ``usage``; ``reasoning_tokens`` (completion tokens spent thinking) are part of
    ``completion_tokens``, as in OpenAI's ``completion_tokens_details``."""
    s = stats or Stats()
    out = {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
           "total_tokens": s.prompt_tokens + s.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
           "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}}
    if s.draft_tokens:  # localrun's extension: speculative decoding's drafted / accepted tokens
        out["speculative"] = speculative_usage(s)
    return out


def chat_logprobs(lps: Sequence[TokenLogprob]) -> dict:
    """Engine logprobs → OpenAI chat ``choices[].logprobs`` (``{"content": [...]}``). Every entry, the chosen
    token and each of its ``top_logprobs``, carries the token's own ``bytes``: a token that is only part of
    a UTF-8 sequence reads '\ufffd' as text, and its bytes tell it apart (OpenAI's reason for the field)."""
    return {"content": [
        {"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
         "top_logprobs": [{"token": s, "logprob": v, "bytes": _top_bytes(t, i, s)}
                          for i, (s, v) in enumerate(t.top)]}
        for t in lps]}


def _top_bytes(t: TokenLogprob, i: int, text: str) -> list[int]:
    """The bytes of ``t``'s ``i``-th alternative: the engine's, else its text's (no partial UTF-8 in it)."""
    return list(t.top_bytes[i]) if i < len(t.top_bytes) else list(text.encode())


def completion_logprobs(lps: Sequence[TokenLogprob], text_offset0: int = 0) -> dict:
    """Engine logprobs → legacy completions ``logprobs`` (parallel lists). A token that is only part of a
    UTF-8 sequence is written as OpenAI writes it, ``bytes:\\xe2\\x80``, so each token keeps its own entry
    (as '\ufffd' several alternatives would collapse into one key of ``top_logprobs``)."""
    offsets, off = [], text_offset0
    for t in lps:
        offsets.append(off)
        off += len(t.token)
    tops = []
    for t in lps:
        top: dict[str, float] = {}
        for i, (text, v) in enumerate(t.top):
            key = _legacy_token(text, t.top_bytes[i] if i < len(t.top_bytes) else None)
            if key in top and i < len(t.top_ids):  # still the same text: the token id tells them apart
                key = f"{key} (token {t.top_ids[i]})"
            top[key] = v
        tops.append(top)
    return {"tokens": [_legacy_token(t.token, t.bytes) for t in lps], "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": tops, "text_offset": offsets}


def _legacy_token(text: str, raw: list[int] | None) -> str:
    """A token's text for the legacy logprobs: ``bytes:\\x..`` when its bytes are not UTF-8 on their own."""
    if raw is None or "\ufffd" not in text:
        return text
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def chat_response(rid: str, created: int, model: str, text: str, finish: str, stats: Stats | None,
                  logprobs: list[TokenLogprob] | None = None, tool_calls: list[dict] | None = None, *,
                  thinking: str = "", reasoning_tokens: int = 0) -> dict:
    """A ``chat.completion``. ``thinking`` goes to ``message.reasoning_content`` (llama-server's name) and
    ``message.reasoning`` (Ollama's OpenAI route's), never into ``content``; ``tool_calls`` in OpenAI's
    shape (``openai_tool_call``) set finish_reason ``tool_calls``."""
    msg: dict = {"role": "assistant", "content": text if (text or not tool_calls) else None}
    if thinking:
        msg["reasoning_content"] = msg["reasoning"] = thinking
    if tool_calls:
        msg["tool_calls"] = tool_calls
        finish = "tool_calls"
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish_reason(finish),
                         "logprobs": chat_logprobs(logprobs) if logprobs is not None else None}],
            "usage": usage(stats, reasoning_tokens)}


def mark_incomplete(body: dict, params: SamplingParams, finish: str | None, *, looped: bool = False) -> dict:
    """A reply (``chat.completion``, ``text_completion`` or one of their chunks) under a constraint that was
    cut before the constraint completed. ``finish``: the engine's reason ("loop" counts as ``looped``);
    ``looped``: the loop guard ended it. Cut by the loop guard: ``finish_reason`` becomes "length" (the
    structured output is incomplete, as after a token-limit cut; ``wire.wire_reason``) and the choice gets
    an ``error`` (``code: incomplete_structured_output``) saying why. Cut by ``max_tokens`` or the
    context: a ``strict`` constraint gets that ``error``; the others say so by ``finish_reason: length``
    alone, as OpenAI does. docs/serve.md, Structured output."""
    c = params.constraint
    looped = looped or finish == "loop"
    if c is None or not body.get("choices") or not (looped or finish_reason(finish) == "length"):
        return body
    choice = body["choices"][0]
    if looped and choice.get("finish_reason") != "tool_calls":
        choice["finish_reason"] = "length"
    if looped or c.strict:
        choice["error"] = {"message": cut_message(params, looped), "type": "invalid_response_error",
                           "code": "incomplete_structured_output", "param": c.param}
    return body


def openai_tool_call(call_id: str, name: str, arguments: str) -> dict:
    """One entry of OpenAI's ``message.tool_calls``: ``arguments`` is the JSON **string**."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_chunk(rid: str, created: int, model: str, delta: dict, finish: str | None = None,
               logprobs: list[TokenLogprob] | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason(finish),
                         "logprobs": chat_logprobs(logprobs) if logprobs else None}]}


def usage_chunk(rid: str, created: int, model: str, stats: Stats | None, obj: str, reasoning_tokens: int = 0) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(stats, reasoning_tokens)}


def completion_response(rid: str, created: int, model: str, text: str, finish: str | None,
                        stats: Stats | None, logprobs: dict | None = None, *, obj: str = "text_completion") -> dict:
    d = {"id": rid, "object": obj, "created": created, "model": model,
         "choices": [{"index": 0, "text": text, "finish_reason": finish_reason(finish), "logprobs": logprobs}]}
    if stats is not None:
        d["usage"] = usage(stats)
    return d


def sse(obj) -> str:
    """One Server-Sent Event carrying ``obj`` as JSON (OpenAI's stream framing)."""
    return "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n"
