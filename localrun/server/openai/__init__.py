"""The OpenAI wing: OpenAI's wire format, ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models`` (``routes.py``), its request bodies (``schemas.py``) and the pure converters between them
and the engine's data (``convert.py``). Its errors are the server's own shape (``server/errors.py``).

It may import the serving core (``localrun.server``'s modules, ``server/wire.py`` for what the wire formats
share), the backends' public API, ``localrun.dialects`` and ``localrun.errors``; never another wing.
"""

from __future__ import annotations

ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"})


def register(app, registry) -> None:
    """Add the OpenAI routes to the FastAPI ``app`` (``registry``: the server's ``ModelRegistry``)."""
    from localrun.server.openai import routes

    routes.register(app, registry)
