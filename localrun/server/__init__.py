"""``localrun serve``: an OpenAI-, Ollama- and Anthropic-compatible HTTP API with continuous batching and
prefix caching.

The serving core is this folder's modules: ``create_app(engine, settings, options)`` (app.py) builds the app;
``models.py`` the registry of resident models (``residency.py`` decides what fits and what is evicted),
``loader.py`` plans and loads them; ``runtime.py`` one model's state, ``scheduler.py`` its batching loop,
``reply.py`` a reply's events; ``wire.py`` what the wire formats share (request-body base, chat message
shapes, converters); ``errors.py`` errors → HTTP status; ``metrics.py`` Prometheus metrics.

Each wire format is a wing, a folder: ``openai/``, ``ollama/``, ``anthropic/`` (routes, schemas, convert),
registered by one line in ``wings.py``. A wing imports the core, never another wing.
Import the submodules directly (this package imports nothing heavy).
"""
