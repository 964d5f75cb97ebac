"""The Responses wing: OpenAI's Responses API, ``POST /v1/responses`` (stateless and stateful),
``GET``/``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items`` (``routes.py``), its request
body (``schemas.py``), the pure converters between input/output items and the chat template's messages and
the reply events (``convert.py``, ``events.py``), and the local store of responses (``store.py``: SQLite).

Continuing a stored response (``previous_response_id``) renders the stored conversation plus the new input
through the chat template, so the prompt's tokens extend the previous prompt and reply: the prefix cache and
the KV tiers (RAM, disk) reuse them, and only the new tokens are prefilled
(``usage.input_tokens_details.cached_tokens``).

Its errors are the server's own shape (OpenAI's ``{"error": {...}}``). It imports the serving core, the
backends' public API, ``dialects``, ``constrain`` and ``errors``; never another wing.
"""

from __future__ import annotations

ENDPOINTS = frozenset({"/v1/responses"})


def register(app, registry) -> None:
    """Add the Responses routes to the FastAPI ``app`` (``registry``: the server's ``ModelRegistry``)."""
    from localrun.server.responses import routes

    routes.register(app, registry)
