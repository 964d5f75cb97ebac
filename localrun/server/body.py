"""Request bodies: read under the size limit, parsed as strict JSON, validated against a wing's schema.

``BodyReader`` (one per app, shared by every model's ``ServerState``) checks the Content-Type and the size,
``parse_json_body`` turns the bytes into a JSON object or a 400 that names the field, and unknown fields are
logged once per client, never refused (a client's newer fields must not break it).
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

from starlette.requests import Request

from localrun.server.errors import RequestError

MAX_JSON_DEPTH = 64  # nesting levels a request body may have (OpenAI/Ollama bodies need fewer than 10)
MAX_INT_DIGITS = 4000  # digits an integer in a request body may have (under Python's own 4300-digit limit)
_MAX_WARNED = 10_000  # (client, field) pairs remembered for the once-per-client unknown-field warning

log = logging.getLogger("localrun.server")


class BodyReader:
    """Reads and validates request bodies under ``options`` (``max_body_bytes``); remembers which unknown
    fields it has warned about. One per app, shared by every model's ``ServerState``."""

    def __init__(self, options) -> None:  # a runtime.ServeOptions
        self.options = options
        self._warned: set[tuple[str, str, str]] = set()

    async def read_json(self, request: Request, *, lenient_type: bool = False) -> Any:
        """The body as JSON. 415 unless Content-Type is JSON (``lenient_type``: also none or curl's form
        default, as Ollama accepts); 413 past ``max_body_bytes``; 400 on malformed JSON."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        ok = ctype == "application/json" or ctype.endswith("+json")
        if lenient_type and ctype in ("", "application/x-www-form-urlencoded", "text/plain"):
            ok = True
        if not ok:
            raise RequestError(f"Content-Type must be application/json, got {ctype or 'none'!r}",
                               code="unsupported_media_type", status=415)
        limit = self.options.max_body_bytes
        try:
            declared = int(request.headers.get("content-length", "0"))
        except ValueError:
            declared = 0
        if declared > limit:
            raise _too_large(limit)
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise _too_large(limit)
        return parse_json_body(bytes(body))

    async def parse(self, request: Request, model, *, lenient_type: bool = False):
        """The body validated as ``model`` (a ``wire.WireModel``: a wing's schemas.py); fields it does not know
        are logged at WARNING, once per client address and field. Raises RequestError, pydantic's
        ValidationError."""
        from localrun.server.wire import unknown_fields

        data = await self.read_json(request, lenient_type=lenient_type)
        req = model.model_validate(data)
        client = (request.client.host if request.client else "-")
        for path, advice in unknown_fields(model, data):
            key = (client, request.url.path, path)
            if key in self._warned:
                continue
            if len(self._warned) < _MAX_WARNED:
                self._warned.add(key)
            log.warning("%s %s: ignored unknown field %r (%s)", client, request.url.path, path, advice)
        return req


def parse_json_body(body: bytes) -> Any:
    """A request body → its JSON object. Raises RequestError (400) for anything a strict JSON parser or
    UTF-8 rejects, naming the field where there is one: malformed JSON or UTF-8, nesting deeper than
    ``MAX_JSON_DEPTH``, ``NaN``/``Infinity`` or a number out of float range (``1e999``), a string holding a
    lone UTF-16 surrogate (``"\\ud800"``: valid JSON syntax, but no UTF-8 text), a body that is not an
    object."""
    bad: list = []

    def constant(name: str):
        bad.append(name)
        return _BadNumber(name)

    def number(text: str):
        x = float(text)
        if math.isfinite(x):
            return x
        bad.append(text)
        return _BadNumber(text)

    def integer(text: str):
        if len(text.lstrip("-")) <= MAX_INT_DIGITS:
            return int(text)
        bad.append(text)  # Python's own error here is a hint about sys.set_int_max_str_digits(), for its users
        return _BadNumber(text, f"an integer of {len(text.lstrip('-'))} digits is out of range (at most "
                                f"{MAX_INT_DIGITS} digits)")

    if _depth(body) > MAX_JSON_DEPTH:
        raise RequestError(f"the body is nested more than {MAX_JSON_DEPTH} levels deep", code="invalid_json")
    try:
        obj = json.loads(body, parse_constant=constant, parse_float=number, parse_int=integer)
    except UnicodeDecodeError as e:
        raise RequestError(f"the body is not valid UTF-8 (byte {e.start}): send JSON as UTF-8 text",
                           code="invalid_json") from None
    except (ValueError, RecursionError) as e:
        raise RequestError(f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise RequestError(f"the body must be a JSON object, got {type(obj).__name__ if obj is not None else 'null'}",
                           code="invalid_json")
    if bad or b"\\u" in body:  # a lone surrogate can only come from a \u escape
        path, why = _first_bad_value(obj, "")
        if path is not None:
            raise RequestError(f"{path or 'body'}: {why}", param=path or None, code="invalid_value")
    return obj


class _BadNumber:
    """Stands in for ``NaN``/``Infinity``/``1e999`` while parsing, so the field holding it can be named."""

    def __init__(self, text: str, why: str = "") -> None:
        self.text, self.why = text, why


def _first_bad_value(obj: Any, path: str) -> tuple[str | None, str]:
    """(dotted path, reason) of the first value that is not representable (see ``parse_json_body``)."""
    if isinstance(obj, _BadNumber):
        return path, obj.why or f"{obj.text} is not a JSON number (use a finite number)"
    if isinstance(obj, str):
        if _has_surrogate(obj):
            return path, "the text holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode"
        return None, ""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        name = str(k).encode("utf-8", "backslashreplace").decode()  # a bad key is named, escaped
        sub = f"{path}.{name}" if path else name
        if isinstance(k, str) and _has_surrogate(k):
            return sub, "the field name holds a lone UTF-16 surrogate, which is not valid Unicode"
        found = _first_bad_value(v, sub)
        if found[0] is not None:
            return found
    return None, ""


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _depth(body: bytes) -> int:
    """The deepest ``[``/``{`` nesting in ``body`` outside strings (checked before parsing: ``json.loads``
    raises RecursionError near 1,000 levels, and pydantic and the checks here recurse too)."""
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return 0
    depth = deepest = 0
    for ch in _BRACKETS.findall(_STRINGS.sub(b'""', body)):
        depth += 1 if ch in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    return deepest


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(rb"[\[\]{}]")


def _too_large(limit: int) -> RequestError:
    return RequestError(f"the request body is larger than {limit:,} bytes", code="request_too_large", status=413)
