"""The Anthropic wing: Anthropic's Messages API, ``/v1/messages`` and ``/v1/messages/count_tokens``
(``routes.py``), its request bodies (``schemas.py``) and the pure converters, which also give its error shape
and its stream events (``convert.py``). Errors on its paths are Anthropic's
``{"type": "error", "error": {"type", "message"}}`` (a full queue: 529 ``overloaded_error``).

It may import the serving core (``localrun.server``'s modules, ``server/wire.py`` for what the wire formats
share), the backends' public API, ``localrun.dialects`` and ``localrun.errors``; never another wing.
"""

from __future__ import annotations

from localrun.server.anthropic import convert

ENDPOINTS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})


def register(app, registry) -> None:
    """Add the Messages API's routes to the FastAPI ``app`` (``registry``: the server's ``ModelRegistry``)."""
    from localrun.server.anthropic import routes

    routes.register(app, registry)


def owns(path: str) -> bool:
    """Errors on the Messages API's paths take Anthropic's shape (``convert.is_anthropic_path``)."""
    return convert.is_anthropic_path(path)


def error_response(status: int, body: dict, *, overloaded: bool = False) -> tuple[int, dict]:
    """The server's error body → Anthropic's (``convert.error_response``: status → error type; 529 when
    ``overloaded``). A prompt longer than the context gets Anthropic's own text for it, "prompt is too long:
    N tokens > M maximum", which Claude Code answers by compacting the conversation."""
    err = body["error"]
    if "n_prompt_tokens" in err:
        message = f"prompt is too long: {err['n_prompt_tokens']} tokens > {err['n_ctx']} maximum"
    else:
        message = err["message"]
    return convert.error_response(status, message, overloaded=overloaded)


def stream_error(body: dict) -> str:
    """Anthropic's ``event: error`` carrying ``body``."""
    return convert.sse_event("error", body)
