"""The wire formats the server speaks: one wing (a package ``localrun.server.<name>``) each, listed in
``WINGS``; adding a wire format is a folder under ``server/`` and one line there.

A wing's ``__init__`` imports nothing heavy (no FastAPI: ``localrun serve --help`` stays fast) and has:

* ``register(app, registry)``: add its routes to the FastAPI ``app`` (``create_app`` calls it; the routes
  module is imported there), ``registry`` being the ``ModelRegistry`` its routes ask for models;
* ``ENDPOINTS``: its paths that ``localrun_requests_total`` counts by name (any other path is ``other``);

and, when its errors do not take the server's own shape (``errors.error_body``: OpenAI's
``{"error": {"message", "type", "param", "code"}}``):

* ``owns(path)``: whether errors on ``path`` take the wing's shape;
* ``error_response(status, body, *, overloaded=False)``: the server's error ``body`` → (status, body) in the
  wing's shape (``overloaded``: the wait queue is full);
* ``stream_error(body)``: optional, the last event of a stream an error cut, in the wing's stream framing
  (default: an SSE ``data:`` event).

A wing imports the serving core (``server/*.py``), the backends' public API, ``dialects`` and ``errors``;
never another wing (tests/test_import_graph.py checks it).
"""

from __future__ import annotations

import importlib
import json
from types import ModuleType

WINGS = (
    "openai",  # /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models
    "ollama",  # /api/...
    "anthropic",  # /v1/messages
    "responses",  # /v1/responses (OpenAI's Responses API, stored responses)
    "llamacpp_compat",  # llama-server's /tokenize, /detokenize, /apply-template, /v1/rerank
    "web",  # /ui: the web page for people (chat, models, live numbers), /ui/api/plan
)


def wings() -> list[ModuleType]:
    """The wing packages, in ``WINGS``' order (the order their routes are added)."""
    return [importlib.import_module(f"localrun.server.{name}") for name in WINGS]


def register_all(app, registry) -> None:
    """Add every wing's routes to ``app``."""
    for wing in wings():
        wing.register(app, registry)


def endpoints() -> frozenset[str]:
    """Every wing's ``ENDPOINTS``."""
    return frozenset().union(*(w.ENDPOINTS for w in wings()))


def owner(path: str) -> ModuleType | None:
    """The wing whose error shape ``path`` takes; None: the server's own (OpenAI's)."""
    for wing in wings():
        owns = getattr(wing, "owns", None)
        if owns is not None and owns(path):
            return wing
    return None


def error_response(path: str, status: int, body: dict, *, overloaded: bool = False) -> tuple[int, dict]:
    """The server's error ``body`` (``errors.error_body``) → (status, body) in the shape of ``path``'s wire
    format."""
    wing = owner(path)
    if wing is None:
        return status, body
    return wing.error_response(status, body, overloaded=overloaded)


def stream_error(path: str, body: dict) -> str:
    """The last event of a Server-Sent Events stream on ``path`` that an error cut, carrying ``body`` (already
    in the wing's shape: ``error_response``)."""
    wing = owner(path)
    framing = getattr(wing, "stream_error", None)
    if framing is not None:
        return framing(body)
    return f"data: {json.dumps(body)}\n\n"
