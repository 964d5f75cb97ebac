"""Pure converters for Anthropic's Messages API (``routes.py`` routes them).

No I/O, no engine: an Anthropic request (``schemas.MessagesRequest``) → the OpenAI-shaped chat
history the chat templates take (``tool_calls``, ``role: tool`` with ``tool_call_id``, ``reasoning_content``),
the tools and ``tool_choice`` in OpenAI's shape, the reasoning control (think, budget) and ``SamplingParams``;
and the reply's ``ReplyEvent``s → Anthropic's content blocks and stream events (``MessageBuilder``), and
errors → Anthropic's error shape.

Source: Anthropic API reference, "Messages", "Streaming messages" (the event sequence message_start,
content_block_start/delta/stop, message_delta, message_stop, ping, error) and "Errors" (status → type).
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from typing import Any

from localrun.backends.base import Constraint, SamplingParams
from localrun.server.errors import RequestError

# ---------------------------------------------------------------------------------------------- requests


def history_from_anthropic(req) -> list[dict]:
    """``system`` + ``messages`` → OpenAI-shaped chat messages (dicts, as the chat templates read them).
    A ``system`` turn inside ``messages`` stays a system message where it stands (the chat template merges
    it into the leading one when it cannot render it there).

    A user turn's ``tool_result`` blocks become ``{"role": "tool", "tool_call_id", "name", "content"}``
    messages (in order, before the turn's text); an assistant turn's ``thinking`` blocks become its
    ``reasoning_content``, ``text`` its ``content``, ``tool_use`` its ``tool_calls`` (arguments as a JSON
    string, as OpenAI clients send them). ``redacted_thinking`` is dropped (no local model can read it).
    Raises RequestError for a ``tool_result`` in an assistant turn or a ``tool_use`` in a user turn."""
    out: list[dict] = []
    system = _system_text(req.system)
    if system:
        out.append({"role": "system", "content": system})
    tool_names: dict[str, str] = {}
    for i, m in enumerate(req.messages):
        if m.role == "system":
            out.append({"role": "system", "content": _system_turn(m.content, i)})
        elif m.role == "user":
            out.extend(_user_turn(m.content, i, tool_names))
        else:
            out.append(_assistant_turn(m.content, i, tool_names))
    return out


def _system_text(system) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    return "\n\n".join(b.text for b in system)


def _system_turn(blocks, i: int) -> str:
    """A ``system`` message inside ``messages`` → its text. Raises RequestError for a non-text block."""
    for j, b in enumerate(blocks):
        if b.type != "text":
            raise RequestError(f"messages[{i}].content[{j}]: a system message holds text blocks only, not {b.type!r}",
                               param=f"messages.{i}.content.{j}.type")
    return "\n\n".join(b.text for b in blocks)


def _user_turn(blocks, i: int, tool_names: dict[str, str]) -> list[dict]:
    out, texts, images = [], [], []
    for j, b in enumerate(blocks):
        if b.type == "image":  # its place in the text; the image itself for the projector (server/images.py)
            from localrun.backends.images import IMAGE_MARKER
            from localrun.server.images import image_from_base64, image_from_url

            part = f"messages[{i}].content[{j}]"
            src = b.source
            images.append(image_from_base64(src["data"], part) if src["type"] == "base64"
                          else image_from_url(src["url"], part))
            texts.append(IMAGE_MARKER)
        if b.type == "tool_result":
            text = b.text()
            if b.is_error:
                text = f"Error: {text}" if text else "Error"
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "name": tool_names.get(b.tool_use_id, ""),
                        "content": text})
        elif b.type == "text":
            texts.append(b.text)
        elif b.type in ("thinking", "redacted_thinking", "tool_use"):
            raise RequestError(f"messages[{i}].content[{j}]: a {b.type!r} block belongs in an assistant turn",
                               param=f"messages.{i}.content.{j}.type")
    if texts or not out:
        out.append({"role": "user", "content": "\n\n".join(texts)})
        if images:
            out[-1]["images"] = images
    return out


def _assistant_turn(blocks, i: int, tool_names: dict[str, str]) -> dict:
    texts, thoughts, calls = [], [], []
    for j, b in enumerate(blocks):
        if b.type == "text":
            texts.append(b.text)
        elif b.type == "thinking":
            thoughts.append(b.thinking)
        elif b.type == "tool_use":
            tool_names[b.id] = b.name
            calls.append({"id": b.id, "type": "function",
                          "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}})
        elif b.type == "tool_result":
            raise RequestError(f"messages[{i}].content[{j}]: a 'tool_result' block belongs in a user turn",
                               param=f"messages.{i}.content.{j}.type")
    msg: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts) if texts or not calls else None}
    if thoughts:
        msg["reasoning_content"] = "\n\n".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def prefill_text(req) -> str | None:
    """The text of a final assistant turn (Anthropic's "prefill": the reply continues it), None when the
    last turn is the user's. A final turn with tool calls is not a prefill (RequestError)."""
    last = req.messages[-1]
    if last.role != "assistant":
        return None
    if any(b.type == "tool_use" for b in last.content):
        raise RequestError(f"messages[{len(req.messages) - 1}]: the last turn has tool_use blocks; send their "
                           "tool_result blocks in a user turn after it", param=f"messages.{len(req.messages) - 1}")
    return "".join(b.text for b in last.content if b.type == "text")


def tools_from_anthropic(req) -> tuple[list[dict] | None, str | dict | None]:
    """``tools`` and ``tool_choice`` → OpenAI's (``[{"type": "function", "function": {name, description,
    parameters, strict}}]``, ``"auto" | "required" | "none" | {"type": "function", "function": {"name"}}``).
    ``any`` → ``required``; ``tool`` → the named function. Anthropic's own tool types (server tools,
    ``schemas.ToolParam``) are left out, logged once. Raises RequestError for a ``tool`` choice without
    a name or naming a tool left out, or a ``tool_choice`` other than none without tools."""
    from localrun.server.wire import log_once

    choice = req.tool_choice
    hosted = [t for t in req.tools or [] if not t.is_client_tool]
    if hosted:
        kinds = ", ".join(sorted({f"{t.name} ({t.type})" for t in hosted}))
        log_once("anthropic-hosted:" + kinds, f"/v1/messages: tools {kinds} run on Anthropic's servers or have no "
                 "schema: left out (the model is not shown them)")
    client = [t for t in req.tools or [] if t.is_client_tool]
    if choice is not None and choice.type == "tool" and choice.name in {t.name for t in hosted}:
        raise RequestError(f"tool_choice names {choice.name!r}, a tool that runs on Anthropic's servers and is not "
                           "available locally", param="tool_choice.name",
                           hint="name one of the client tools (name, description, input_schema)")
    if not client:
        if choice is not None and choice.type in ("any", "tool"):
            raise RequestError(f"tool_choice {choice.type!r} needs 'tools'", param="tool_choice")
        return None, None
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                               "parameters": t.input_schema}
              | ({"strict": True} if t.strict else {})} for t in client]
    if choice is None or choice.type == "auto":
        return tools, "auto"
    if choice.type == "any":
        return tools, "required"
    if choice.type == "none":
        return tools, "none"
    if not choice.name:
        raise RequestError("tool_choice of type 'tool' needs 'name'", param="tool_choice.name")
    return tools, {"type": "function", "function": {"name": choice.name}}


def reasoning_from_anthropic(req) -> tuple[bool | None, str | None, int | None]:
    """``thinking`` and ``output_config.effort`` → (think, level, budget tokens) for ``reply.prepare_chat``:
    ``enabled`` → (True, budget_tokens); ``disabled`` → think False; ``adaptive``/``between_tools`` → think
    True, no budget; absent → think None, the model's default. ``effort`` low/medium/high is the level
    (``xhigh``/``max`` → high). Raises RequestError when ``budget_tokens`` is missing or not below
    ``max_tokens`` (Anthropic's rule: thinking counts toward ``max_tokens``)."""
    effort = req.output_config.effort if req.output_config is not None else None
    level = {"xhigh": "high", "max": "high"}.get(effort, effort)
    t = req.thinking
    if t is None:
        return (True if level else None), level, None
    if t.type == "disabled":
        return False, None, None
    if t.type != "enabled":
        return True, level, None
    if t.budget_tokens is None:
        raise RequestError("thinking.budget_tokens is required when thinking is enabled",
                           param="thinking.budget_tokens")
    max_tokens = getattr(req, "max_tokens", None)
    if max_tokens is not None and t.budget_tokens >= max_tokens:
        raise RequestError(f"max_tokens ({max_tokens}) must be greater than thinking.budget_tokens "
                           f"({t.budget_tokens}): thinking counts toward max_tokens",
                           param="thinking.budget_tokens")
    return True, level, t.budget_tokens


def sampling_from_anthropic(req, *, stop_loops: bool = False) -> SamplingParams:
    """``max_tokens``, ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``output_config.format``
    (a JSON-schema ``Constraint``) → ``SamplingParams``.
    Anthropic's defaults where the request leaves them out: temperature 1.0, no top-p / top-k cut (top_k 0 is
    llama.cpp's "off", top_p 1.0), no min-p."""
    p = SamplingParams(max_tokens=req.max_tokens, stop=[s for s in (req.stop_sequences or []) if s],
                       temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, stop_loops=stop_loops)
    for name in ("temperature", "top_p", "top_k"):
        v = getattr(req, name)
        if v is not None:
            setattr(p, name, v)
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is not None:
        from localrun.constrain import check

        p.constraint = Constraint("json_schema", fmt.schema_, "output_config.format.schema")
        check(p.constraint)  # what cannot be enforced (an invalid pattern: its JSON Pointer) is a 400 here
    return p


# ---------------------------------------------------------------------------------------------- replies

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "loop": "end_turn",
                "cancelled": "end_turn"}


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def new_tool_use_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def thinking_signature(thinking: str) -> str:
    """The ``signature`` of a thinking block: a local value (base64 of the SHA-256 of the thinking text), not
    Anthropic's encrypted proof. Clients echo it back with the block; localrun does not check it."""
    return base64.b64encode(hashlib.sha256(("localrun:" + thinking).encode()).digest()).decode()


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens prefilled for this request, and
    ``cache_read_input_tokens`` the ones reused from the prefix cache (their sum is the prompt, as
    ``count_tokens`` reports it). localrun writes no billable cache, so ``cache_creation_input_tokens`` is 0."""
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached_tokens}


class MessageBuilder:
    """``ReplyEvent``s of one reply → Anthropic stream events, and the finished message they add up to.

    ``start()`` gives ``message_start``; ``feed(event)`` the events one ``ReplyEvent`` makes (a block opens
    when the channel changes: ``thinking`` → a thinking block, ``content`` → a text block, a tool call → a
    ``tool_use`` block, whose arguments stream as ``input_json_delta``); ``finish(...)`` closes the open
    block (a thinking block gets its ``signature_delta`` first) and gives ``message_delta`` and
    ``message_stop``. ``message()`` is the non-streamed response: the same blocks, so a client's stream
    accumulator rebuilds exactly what the non-streamed call returns. Events are ``(name, data)`` pairs."""

    def __init__(self, model: str, prompt_tokens: int, cached_tokens: int = 0) -> None:
        self.id = new_message_id()
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.blocks: list[dict] = []
        self._open: str | None = None  # "thinking" | "text" | "tool_use"
        self._tool_index: int | None = None  # the parser's index of the open tool call
        self._args: list[str] = []
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.output_tokens = 0

    def start(self) -> list[tuple[str, dict]]:
        msg = self._shell()
        msg["usage"] = usage(self.prompt_tokens, self.cached_tokens, 0)
        return [("message_start", {"type": "message_start", "message": msg})]

    def feed(self, ev) -> list[tuple[str, dict]]:
        kind = type(ev).__name__
        if kind == "Delta":
            if not ev.text:
                return []
            block = "thinking" if ev.channel == "thinking" else "text"
            out = [] if self._open == block else self._close() + self._begin(
                {"type": "thinking", "thinking": "", "signature": ""} if block == "thinking"
                else {"type": "text", "text": ""})
            b = self.blocks[-1]
            if block == "thinking":
                b["thinking"] += ev.text
                delta = {"type": "thinking_delta", "thinking": ev.text}
            else:
                b["text"] += ev.text
                delta = {"type": "text_delta", "text": ev.text}
            return out + [self._delta(delta)]
        if kind == "ToolCallStart":
            out = self._close() + self._begin({"type": "tool_use", "id": new_tool_use_id(), "name": ev.name,
                                               "input": {}})
            self._tool_index, self._args = ev.index, []
            return out
        if kind == "ToolCallArgs":
            if self._open != "tool_use" or not ev.text:
                return []
            self._args.append(ev.text)
            return [self._delta({"type": "input_json_delta", "partial_json": ev.text})]
        if kind == "ToolCallEnd":
            if self._open != "tool_use":
                return []
            self.blocks[-1]["input"] = ev.arguments if isinstance(ev.arguments, dict) else {}
            if not self._args:  # no argument pieces streamed: send the object whole
                self._args.append(json.dumps(self.blocks[-1]["input"], ensure_ascii=False))
                out = [self._delta({"type": "input_json_delta", "partial_json": self._args[0]})]
                return out + self._close()
            return self._close()
        return []

    def finish(self, reason: str, output_tokens: int, *, prompt_tokens: int | None = None,
               cached_tokens: int | None = None, stop_sequence: str | None = None) -> list[tuple[str, dict]]:
        """Close the message: ``reason`` is localrun's finish reason (stop, length, tool_calls, loop,
        cancelled); a ``stop_sequence`` that ended it makes ``stop_reason`` "stop_sequence"."""
        out = self._close()
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        if cached_tokens is not None:
            self.cached_tokens = cached_tokens
        self.output_tokens = output_tokens
        has_tool = any(b["type"] == "tool_use" for b in self.blocks)
        self.stop_reason = "tool_use" if (has_tool and reason in ("stop", "tool_calls")) else \
            STOP_REASONS.get(reason, "end_turn")
        if stop_sequence is not None and self.stop_reason == "end_turn":
            self.stop_reason, self.stop_sequence = "stop_sequence", stop_sequence
        out.append(("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
                                      "usage": usage(self.prompt_tokens, self.cached_tokens, output_tokens)}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def message(self) -> dict:
        """The finished message (after ``finish``), as ``POST /v1/messages`` returns it without ``stream``."""
        msg = self._shell()
        msg.update(content=self.blocks, stop_reason=self.stop_reason, stop_sequence=self.stop_sequence,
                   usage=usage(self.prompt_tokens, self.cached_tokens, self.output_tokens))
        return msg

    def _shell(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                "stop_reason": None, "stop_sequence": None}

    def _begin(self, block: dict) -> list[tuple[str, dict]]:
        self.blocks.append(block)
        self._open = block["type"]
        return [("content_block_start", {"type": "content_block_start", "index": len(self.blocks) - 1,
                                         "content_block": dict(block)})]

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return ("content_block_delta", {"type": "content_block_delta", "index": len(self.blocks) - 1,
                                        "delta": delta})

    def _close(self) -> list[tuple[str, dict]]:
        if self._open is None:
            return []
        out = []
        b = self.blocks[-1]
        if self._open == "thinking":
            b["signature"] = thinking_signature(b["thinking"])
            out.append(self._delta({"type": "signature_delta", "signature": b["signature"]}))
        elif self._open == "tool_use" and self._args and not b["input"]:
            b["input"] = _parse_args("".join(self._args))
        self._open, self._tool_index, self._args = None, None, []
        out.append(("content_block_stop", {"type": "content_block_stop", "index": len(self.blocks) - 1}))
        return out


def _parse_args(text: str) -> dict:
    try:
        obj = json.loads(text)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def sse_event(name: str, data: dict) -> str:
    """One Server-Sent Event in Anthropic's framing: ``event: NAME`` then ``data: {json}``."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n"


# ---------------------------------------------------------------------------------------------- errors

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
                429: "rate_limit_error", 529: "overloaded_error"}
OVERLOADED_STATUS = 529  # Anthropic's "overloaded" status; its SDK retries it (as every status ≥ 500)


def error_response(status: int, message: str, *, overloaded: bool = False) -> tuple[int, dict]:
    """(HTTP status, Anthropic's error body ``{"type": "error", "error": {"type", "message"}}``).
    ``overloaded`` (the wait queue is full) → 529 ``overloaded_error``, which Anthropic's SDKs retry after
    ``Retry-After``; other 4xx keep their status and get the matching type; 5xx are ``api_error``."""
    if overloaded:
        status = OVERLOADED_STATUS
    etype = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return status, {"type": "error", "error": {"type": etype, "message": message}}


def is_anthropic_path(path: str) -> bool:
    """Whether errors on ``path`` take Anthropic's shape (only the Messages API's routes do)."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")
