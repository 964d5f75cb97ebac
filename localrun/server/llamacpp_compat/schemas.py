"""llama-server's request bodies for ``/tokenize``, ``/detokenize``, ``/apply-template`` and ``/v1/rerank``
(llama.cpp ``tools/server/README.md``; defaults as ``tools/server/server.cpp`` reads them). ``model`` is
localrun's addition (which model, on a server with several; llama-server serves one)."""

from __future__ import annotations

from typing import Any, Union

from pydantic import Field, StrictBool, StrictInt

from localrun.server.wire import ChatMessageIn, ToolDef, WireModel


class TokenizeRequest(WireModel):
    """``content``: the text. ``add_special``: insert BOS (default false); ``parse_special``: read
    control-token text (``<|im_end|>``) as control tokens (default true); ``with_pieces``: return
    ``{"id", "piece"}`` objects instead of ids."""

    model: str | None = None
    content: str
    add_special: StrictBool = False
    parse_special: StrictBool = True
    with_pieces: StrictBool = False


class DetokenizeRequest(WireModel):
    model: str | None = None
    tokens: list[StrictInt] = Field(default_factory=list)


class ApplyTemplateRequest(WireModel):
    """Chat turns as ``/v1/chat/completions`` takes them, plus what the template reads (``tools``,
    ``chat_template_kwargs``, ``add_generation_prompt``)."""

    _ignored = frozenset({"tool_choice", "parallel_tool_calls", "stream", "temperature", "max_tokens",
                          "response_format", "reasoning_format"})
    model: str | None = None
    messages: list[ChatMessageIn]
    tools: list[ToolDef] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: StrictBool = True


class RerankRequest(WireModel):
    """``query`` against ``documents`` (strings); ``top_n``: how many results (default all);
    ``return_text``/``return_documents``: each result carries its document's text."""

    model: str | None = None
    query: str
    documents: list[Union[str, dict[str, Any]]] = Field(default_factory=list)
    top_n: StrictInt | None = Field(default=None, ge=0)
    return_text: StrictBool = False
    return_documents: StrictBool = False
