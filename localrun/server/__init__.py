"""``localrun serve``: an OpenAI- and Ollama-compatible HTTP API with continuous batching and prefix caching.

``create_app(engine, settings, options)`` (app.py) builds the app; ``scheduler.py`` is the batching loop;
``schemas.py`` the request bodies; ``convert.py`` the pure converters; ``metrics.py`` Prometheus metrics.
Import the submodules directly (this package imports nothing heavy).
"""
