"""What every wire format shares (the serving core's part of the wings ``openai/``, ``ollama/``, ``anthropic/``).

* ``WireModel``: the base of every request body. Unknown fields are ignored (clients send many we do not
  use, e.g. ``user``, ``store``, ``keep_alive``), but ``unknown_fields`` finds them so the server can log a
  warning (a misspelt ``temprature``; a field a body model's ``field_advice`` knows belongs elsewhere,
  such as Ollama's ``temperature`` outside ``options``). Fields listed in a model's ``_ignored`` are known
  and deliberately unused (logged at debug only). Integers that reach llama.cpp's C ``int`` parameters are
  bounded to ``INT32_MAX``. Validation failures become a 400 naming the offending field (``app.py``).
* The chat message and tool shapes OpenAI defined, which Ollama's ``/api/chat`` takes as they are
  (``ChatMessageIn``, ``TextPart``, ``ToolDef``, ``FunctionDef``).
* The converters more than one wing uses: a message → the chat template's dict (``message_dict``), the
  sampling fields OpenAI's and Ollama's bodies share (``SAMPLING_FIELDS``, ``set_sampling_fields``),
  localrun's finish reasons on the wire (``finish_reason``; ``wire_reason``: a loop-guard cut of
  structured output is a length cut, ``cut_message`` says why) and the speculative-decoding totals
  (``speculative_usage``).

Sources: OpenAI API reference (``chat/completions``), Ollama ``docs/api.md`` and ``api/types.go``.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, field_validator

from localrun.backends.base import SamplingParams, Stats
from localrun.backends.images import IMAGE_MARKER

INT32_MAX = 2**31 - 1  # llama.cpp's sampler parameters (top_k, penalty_last_n) are C ints
_LOGGED_ONCE: dict[str, None] = {}  # keys already logged by ``log_once`` (insertion-ordered, bounded)


def log_once(key: str, message: str) -> bool:
    """Log ``message`` (logger ``localrun.server``, info) the first time ``key`` is seen in this process
    (a client repeats its request shape every turn: one line, not one per request). → whether it logged."""
    if key in _LOGGED_ONCE:
        return False
    _LOGGED_ONCE[key] = None
    while len(_LOGGED_ONCE) > 1024:
        _LOGGED_ONCE.pop(next(iter(_LOGGED_ONCE)))
    import logging

    logging.getLogger("localrun.server").info("%s", message)
    return True


class WireModel(BaseModel):
    """The base of every request body: unknown fields are ignored (and logged once per client by
    ``ServerState.parse``); ``_ignored`` lists known fields localrun accepts without using them."""

    model_config = ConfigDict(extra="ignore")
    _ignored: ClassVar[frozenset[str]] = frozenset()  # known fields localrun accepts and does not use

    @classmethod
    def field_advice(cls, key: str) -> str | None:
        """What an unknown field ``key`` of this body probably meant, when the body knows better than a
        spelling match (e.g. a field that belongs under ``options``); None: no advice of its own."""
        return None


# ---------------------------------------------------------------------------------------------- chat messages
class TextPart(WireModel):
    type: Literal["text"]
    text: str


class ImagePart(WireModel):
    """OpenAI's ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,…" | "https://…"}}`` (a
    plain string ``image_url`` is taken too); ``detail`` is accepted and unused."""

    type: Literal["image_url"]
    image_url: Union[str, dict[str, Any]]

    @property
    def url(self) -> str:
        return self.image_url if isinstance(self.image_url, str) else str(self.image_url.get("url") or "")


class ChatMessageIn(WireModel):
    """One message. ``developer`` is OpenAI's newer name for ``system``; content may be a string or a list
    of text and ``image_url`` parts (images need a model loaded with its projector, ``--mmproj``)."""

    _ignored = frozenset({"refusal", "annotations", "audio", "function_call", "thinking"})
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[dict[str, Any]], None] = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # an earlier turn's thinking (llama-server's name; ``reasoning`` is Ollama's OpenAI route's)
    reasoning_content: str | None = None
    reasoning: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v):
        """List content → ``TextPart``s and ``ImagePart``s; an audio/file part is refused by name."""
        if not isinstance(v, list):
            return v
        parts = []
        for part in v:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind is None:
                raise ValueError("a content part has no 'type' (send text, or parts such as "
                                 "{\"type\": \"text\", \"text\": \"...\"})")
            if kind == "image_url":
                parts.append(ImagePart.model_validate(part))
                continue
            if kind != "text":
                raise ValueError(f"content parts of type {kind!r} are not supported (send parts of type 'text' "
                                 "or 'image_url')")
            parts.append(TextPart.model_validate(part))
        return parts


class FunctionDef(WireModel):
    """A function tool; ``strict: true`` enforces ``parameters`` exactly (or refuses it), any other schema is
    enforced as far as constrained decoding can (``constrain.grammar``)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(WireModel):
    type: Literal["function"]
    function: FunctionDef


def content_text(content) -> str:
    """A message's ``content`` (a string, ``TextPart``s and ``ImagePart``s, or None) → its text, with
    ``IMAGE_MARKER`` where each image goes."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(IMAGE_MARKER if isinstance(p, ImagePart) else p.text for p in content)


def message_images(m, index: int) -> list:
    """The images of message ``index`` (``ImageInput``s, in the order of its markers): its ``image_url``
    parts, then Ollama's ``images`` (base64, placed before the text). Raises ImageInputError."""
    from localrun.server.images import image_from_base64, image_from_url

    out = [image_from_base64(b64, f"messages[{index}].images[{j}]")
           for j, b64 in enumerate(getattr(m, "images", None) or [])]
    if isinstance(m.content, list):
        out += [image_from_url(p.url, f"messages[{index}].content[{j}]")
                for j, p in enumerate(m.content) if isinstance(p, ImagePart)]
    return out


def message_dict(m, index: int = 0) -> dict:
    """A ``ChatMessageIn`` (or a subclass) → the chat template's message dict: role (``developer`` →
    ``system``), content (text parts joined; null → ""), and where present name, tool_calls (arguments as
    sent), tool_call_id and reasoning_content (an earlier turn's thinking: ``reasoning_content``,
    ``reasoning`` or ``thinking``), and ``images`` (``message_images``; ``index`` names the message in errors)."""
    d: dict = {"role": "system" if m.role == "developer" else m.role, "content": content_text(m.content)}
    images = message_images(m, index)
    if images:
        d["images"] = images
        d["content"] = IMAGE_MARKER * len(getattr(m, "images", None) or []) + d["content"]
    if m.name:
        d["name"] = m.name
    if m.tool_calls:
        check_tool_call_arguments(m.tool_calls, index)
        d["tool_calls"] = m.tool_calls
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    thinking = m.reasoning_content or m.reasoning or getattr(m, "thinking", None)
    if thinking:
        d["reasoning_content"] = thinking
    return d


def check_tool_call_arguments(calls: list, index: int, param: str | None = None) -> None:
    """The ``arguments`` of an earlier turn's tool calls (message ``index``) must be a JSON object: an
    object (Ollama), a string holding one (OpenAI), or empty ("" or absent: a call without arguments, as a
    template writes ``{}``). Anything else (``"{"``, trailing text, ``"Paris"``, ``"[1]"``) is a
    RequestError naming ``messages[i].tool_calls[j].function.arguments``: the template can only write an
    object, and passing the text on as something else would show the model a call it never made (llama-server
    and vLLM refuse it too; docs/serve.md, Tools)."""
    import json

    from localrun.server.errors import RequestError

    for j, tc in enumerate(calls):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict):
            fn = tc if isinstance(tc, dict) else {}  # {"name", "arguments"} without the wrapper
        args = fn.get("arguments")
        if args is None or args == "" or isinstance(args, dict):
            continue
        where = param or f"messages[{index}].tool_calls[{j}].function.arguments"  # param: another wing's name
        hint = ("send the call's arguments as a JSON object (OpenAI: a string such as '{\"city\": \"Paris\"}'; "
                "'{}' for none), or leave the malformed call out of the history")
        if isinstance(args, str):
            try:
                value = json.loads(args)
            except ValueError as e:
                raise RequestError(f"{where} is not JSON ({getattr(e, 'msg', e)} at character "
                                   f"{getattr(e, 'pos', '?')} of {_clip(args)})", param=where,
                                   code="invalid_value", hint=hint) from None
            if isinstance(value, dict):
                continue
            raise RequestError(f"{where} must be a JSON object, got a JSON {type(value).__name__} ({_clip(args)})",
                               param=where, code="invalid_value", hint=hint)
        raise RequestError(f"{where} must be a JSON object or a string holding one, got {type(args).__name__}",
                           param=where, code="invalid_value", hint=hint)


def _clip(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "…")


# ---------------------------------------------------------------------------------------------- sampling
# the sampling fields OpenAI's bodies and Ollama's ``options`` share, by ``SamplingParams``' names
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                   "repeat_penalty", "repeat_last_n", "dry_multiplier", "dry_base", "dry_allowed_length",
                   "dry_penalty_last_n", "stop_loops")


def set_sampling_fields(p: SamplingParams, source) -> SamplingParams:
    """Copy every ``SAMPLING_FIELDS`` field ``source`` sets (not None) onto ``p``; the others keep ``p``'s
    values (llama.cpp's defaults: no DRY, no repeat penalty). Returns ``p``."""
    for f in SAMPLING_FIELDS:
        v = getattr(source, f)
        if v is not None:
            setattr(p, f, v)
    return p


# ---------------------------------------------------------------------------------------------- replies
def finish_reason(reason: str | None) -> str | None:
    """localrun's finish reasons on OpenAI's and Ollama's wire: a cancelled or loop-stopped generation is
    "stop" (the loop shows in the log and in /metrics' finish_reason label)."""
    return "stop" if reason in ("cancelled", "loop") else reason


def wire_reason(reason: str | None, params: SamplingParams | None) -> str | None:
    """A finish reason as every wire format reports it: a generation the loop guard ended (``loop``)
    under a constraint (``params.constraint``) is ``length``, since its structured output was cut before
    it completed: each wire format then says so as it says a token-limit cut (OpenAI ``finish_reason:
    length``, Responses ``status: incomplete``, Anthropic ``stop_reason: max_tokens``, Ollama
    ``done_reason: length``; docs/serve.md, Structured output). Other reasons pass unchanged."""
    if reason == "loop" and params is not None and params.constraint is not None:
        return "length"
    return reason


def cut_message(params: SamplingParams, looped: bool) -> str:
    """What a client is told when a constrained reply (``params.constraint``) was cut before it completed:
    by the loop guard (``looped``) or by ``max_tokens`` / the context. One sentence that says the output
    does not validate and what to change."""
    c = params.constraint
    kind = {"json_schema": "JSON schema", "json_object": "JSON object", "regex": "regex"}.get(c.kind, "grammar")
    what = f"{'strict ' if c.strict else ''}{kind} in {c.param or 'the request'}"
    if looped:
        return (f"the loop guard (stop_loops) ended the output, which was repeating itself, before it completed "
                f"the {what}: it does not validate; dry_multiplier (e.g. 0.8) or a higher temperature steers a "
                "small model out of such loops")
    return (f"the output was cut by the token limit before it completed the {what}: it does not validate; "
            "raise max_tokens")


def speculative_usage(s: Stats) -> dict:
    """localrun's extension to a reply's usage: speculative decoding's drafted / accepted tokens."""
    return {"draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
            "acceptance_rate": s.acceptance_rate}


# ---------------------------------------------------------------------------------------------- unknown fields
def unknown_fields(model: type[BaseModel], data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Fields of the JSON object ``data`` that ``model`` neither reads nor lists in ``_ignored`` →
    ``[(path, advice)]``; nested objects and lists of objects are searched (paths like
    ``options.temprature``, ``messages[].contnet``). ``advice`` says what was probably meant."""
    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    names = {n for n in fields} | {f.alias for f in fields.values() if f.alias}
    out = []
    for key, value in data.items():
        key = str(key)
        if key not in names:
            if key not in model._ignored:
                out.append((prefix + key, _advice(model, key, names)))
            continue
        sub, many = _nested_model(fields[key].annotation) if key in fields else (None, False)
        if sub is None:
            continue
        if many and isinstance(value, list):
            for item in value:
                out.extend(unknown_fields(sub, item, f"{prefix}{key}[]."))
        elif not many:
            out.extend(unknown_fields(sub, value, f"{prefix}{key}."))
    return list(dict.fromkeys(out))


def _advice(model: type[BaseModel], key: str, names: set[str]) -> str:
    own = model.field_advice(key) if issubclass(model, WireModel) else None
    if own:
        return own
    close = difflib.get_close_matches(key, sorted(names), n=1, cutoff=0.75)
    return f"did you mean {close[0]!r}?" if close else "not a field localrun knows"


def _nested_model(annotation) -> tuple[type[BaseModel] | None, bool]:
    """The BaseModel inside ``annotation`` (``X | None``, ``list[X]``) → (model, is a list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and args:
        sub, _ = _nested_model(args[0])
        return sub, sub is not None
    for a in args:
        sub, many = _nested_model(a)
        if sub is not None:
            return sub, many
    return None, False
