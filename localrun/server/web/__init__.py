"""The web wing: a page for people at ``/ui`` (docs/serve.md "Web page"), plain HTML/CSS/JS files inside
the package (``static/``: no CDN, no build step), that talks only to the server's own API: chat through
``/v1/chat/completions`` (streamed, each request naming its model: the one picked, else ``/v1/models``'
``meta.default``), the models from ``/v1/models``, loads and unloads through Ollama's
``/api/generate``, pulls through ``/api/pull``, live numbers from ``/api/ps`` and ``/metrics``. Its one
route of its own, ``/ui/api/plan``, says how a model would load here before it loads (``plan.py``).

``/ui``, ``/ui/`` and ``/ui/static/*`` are open without the API key (the page asks for the key and sends it on every
API request); the page carries a strict Content-Security-Policy (``routes.py``).

It may import the serving core (``localrun.server``'s modules), ``localrun.units`` and ``localrun.errors``;
never another wing.
"""

from __future__ import annotations

ENDPOINTS = frozenset({"/ui", "/ui/", "/ui/api/plan"})


def register(app, registry) -> None:
    """Add the web page's routes to the FastAPI ``app`` (``registry``: the server's ``ModelRegistry``)."""
    from localrun.server.web import routes

    routes.register(app, registry)
