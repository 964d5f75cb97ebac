"""The llama-server wing: the endpoints of llama.cpp's HTTP server that RAG stacks and UIs call beside the
OpenAI ones — ``/tokenize``, ``/detokenize``, ``/apply-template`` and reranking (``/v1/rerank``, with
llama-server's aliases ``/rerank``, ``/reranking``, ``/v1/reranking``) — in llama-server's request and
response shapes (llama.cpp ``tools/server/README.md``): ``routes.py``, bodies in ``schemas.py``. Errors are
the server's own (OpenAI's) shape, as llama-server's are.

It may import the serving core (``localrun.server``'s modules, ``server/wire.py``), the backends' public
API, ``localrun.model`` and ``localrun.errors``; never another wing.
"""

from __future__ import annotations

ENDPOINTS = frozenset({"/tokenize", "/detokenize", "/apply-template", "/v1/rerank", "/rerank", "/reranking",
                       "/v1/reranking"})


def register(app, registry) -> None:
    """Add the llama-server routes to the FastAPI ``app`` (``registry``: the server's ``ModelRegistry``)."""
    from localrun.server.llamacpp_compat import routes

    routes.register(app, registry)
