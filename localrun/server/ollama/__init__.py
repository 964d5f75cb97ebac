"""The Ollama wing: Ollama's wire format, ``/api/chat``, ``/api/generate`` (NDJSON streams), ``/api/show``,
``/api/embed``, ``/api/version`` (``routes.py``), its model management routes (``/api/tags``, ``/api/ps``,
``/api/pull``, ``/api/delete``, ``/api/copy``: ``admin.py``), its request bodies (``schemas.py``) and the
pure converters (``convert.py``). Errors under ``/api/`` are Ollama's ``{"error": "message"}``.

It may import the serving core (``localrun.server``'s modules, ``server/wire.py`` for what the wire formats
share), the backends' public API, ``localrun.dialects``, ``localrun.errors`` and the model store
(``/api/pull``, ``/api/delete``); never another wing.
"""

from __future__ import annotations

ENDPOINTS = frozenset({"/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/ps", "/api/version",
                       "/api/embed", "/api/embeddings"})


def register(app, registry) -> None:
    """Add the Ollama routes to the FastAPI ``app`` (``registry``: the server's ``ModelRegistry``)."""
    from localrun.server.ollama import routes

    routes.register(app, registry)


def owns(path: str) -> bool:
    """Errors on Ollama's paths (``/api/...``) take Ollama's shape."""
    return path.startswith("/api/")


def error_response(status: int, body: dict, *, overloaded: bool = False) -> tuple[int, dict]:
    """The server's error body → Ollama's ``{"error": "message"}`` (the status is kept)."""
    return status, {"error": body["error"]["message"]}
