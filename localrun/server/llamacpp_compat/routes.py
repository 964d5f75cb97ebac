"""llama-server's utility routes (llama.cpp ``tools/server/README.md``):

- ``POST /tokenize`` ``{"content", "add_special"?, "parse_special"?, "with_pieces"?}`` → ``{"tokens": [id, …]}``,
  or with ``with_pieces`` ``{"tokens": [{"id", "piece"}, …]}`` (``piece``: the text, or its bytes as a list of
  ints when they are not valid UTF-8 on their own);
- ``POST /detokenize`` ``{"tokens": [id, …]}`` → ``{"content": "text"}`` (control tokens written out);
- ``POST /apply-template`` ``{"messages", "tools"?, "chat_template_kwargs"?}`` → ``{"prompt": "text"}``: what
  ``/v1/chat/completions`` would prefill for those messages, without generating;
- ``POST /v1/rerank`` (``/rerank``, ``/reranking``, ``/v1/reranking``) ``{"query", "documents", "top_n"?}`` →
  ``{"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"}, "results": [{"index",
  "relevance_score"}, …]}``, best first, cut to ``top_n``. It needs a reranking model (a GGUF whose header
  sets pooling type RANK, e.g. bge-reranker-v2-m3); any other model is a 400 that names it and says so.

``model`` picks the model as on the other routes (llama-server has one; localrun may have several).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from localrun.backends.base import SamplingParams
from localrun.server.errors import RequestError
from localrun.server.facts import model_capabilities
from localrun.server.llamacpp_compat.schemas import (
    ApplyTemplateRequest,
    DetokenizeRequest,
    RerankRequest,
    TokenizeRequest,
)
from localrun.server.models import ModelRegistry
from localrun.server.reply import prepare_chat
from localrun.server.wire import message_dict

RERANK_PATHS = ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking")


def register(app: FastAPI, reg: ModelRegistry) -> None:
    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        st, req = await reg.routed(request, TokenizeRequest)
        eng = st.engine
        ids = await run_in_threadpool(eng.tokenize, req.content, add_special=req.add_special,
                                      parse_special=req.parse_special)
        if not req.with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": piece_value(token_bytes(eng, t))} for t in ids]}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        st, req = await reg.routed(request, DetokenizeRequest)
        ids = st.check_token_ids(req.tokens, "tokens")
        eng = st.engine
        data = b"".join(token_bytes(eng, t) for t in ids)
        return {"content": data.decode("utf-8", errors="replace")}

    @app.post("/apply-template")
    async def apply_template(request: Request) -> dict:
        st, req = await reg.routed(request, ApplyTemplateRequest)
        if not st.engine.has_chat_template:
            raise RequestError(f"{st.model_id} has no chat template", param="messages",
                               hint="start the server with --chat-template NAME (e.g. chatml), or use a model "
                               "with a chat template")
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        prompt, _, _, _ = await prepare_chat(
            st, [message_dict(m, i) for i, m in enumerate(req.messages)], tools=tools, tool_choice=None, think=None,
            level=None, budget=None, params=SamplingParams(), template_kwargs=req.chat_template_kwargs)
        return {"prompt": prompt}

    async def rerank(request: Request) -> dict:
        st, req = await reg.routed(request, RerankRequest)
        caps = model_capabilities(st)
        if not caps.reranker:
            raise RequestError(not_a_reranker(st.model_id, st.spec, caps.pooling), param="model",
                               code="model_not_reranker",
                               hint="load a reranking GGUF (e.g. bge-reranker-v2-m3, whose header sets "
                               "pooling type rank) and name it in 'model'")
        raise RequestError(f"{st.model_id} is a reranker (pooling type rank), but scoring with a reranker is "
                           "not implemented in localrun yet", param="model", code="unsupported", status=501,
                           hint="run this model with llama-server --reranking for now")

    for path in RERANK_PATHS:
        app.add_api_route(path, rerank, methods=["POST"])


def not_a_reranker(model_id: str, spec, pooling: str | None) -> str:
    """The 400's message for ``/v1/rerank`` on a model that is not a reranker: which model, what its header
    says, and what a reranker's says."""
    arch = getattr(spec, "arch", "") or "unknown"
    what = (f"its GGUF header sets pooling type {pooling!r} ({arch}.pooling_type), an embedding model"
            if pooling else f"its header ({arch}) sets no pooling type: a text-generation model")
    return (f"{model_id} is not a reranking model: {what}. Reranking needs a reranker GGUF, whose header sets "
            f"{arch if pooling else '<arch>'}.pooling_type = 4 (rank) and which has a classification head "
            "(e.g. bge-reranker-v2-m3)")


def token_bytes(engine, token: int) -> bytes:
    """A token's bytes, control tokens written out (llama-server's ``common_token_to_piece`` with
    ``special``): the llama.cpp engine's ``token_bytes``, through the serial wrapper on MLX; else its
    ``detokenize``."""
    for eng in (engine, getattr(engine, "engine", None)):
        fn = getattr(eng, "token_bytes", None)
        if fn is not None:
            return fn(token, special=True)
    return engine.detokenize([token]).encode("utf-8")


def piece_value(data: bytes) -> str | list[int]:
    """llama-server's ``piece``: the text when ``data`` is valid UTF-8 on its own, else its bytes as ints."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)
