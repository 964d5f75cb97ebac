"""OpenAI's request bodies (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``).

Pydantic models validate types and ranges on the ``WireModel`` base (``server/wire.py``: unknown fields are
ignored and logged, ``_ignored`` lists the known ones localrun does not use; the chat message and tool
shapes live there too, as Ollama's ``/api/chat`` takes them as well). Integers that reach llama.cpp's C
``int`` parameters are bounded to ``INT32_MAX``. Validation failures become a 400 with an OpenAI-style
error object naming the offending field (see ``app.py``). Responses are built as plain dicts in
``convert.py``.

Source: OpenAI API reference (``chat/completions``, ``completions``, ``embeddings``), llama-server's
extensions (DRY, ``grammar``, ``json_schema``, ``reasoning_format``).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import Field, StrictBool, StrictInt, field_validator

from localrun.server.wire import INT32_MAX, ChatMessageIn, ToolDef, WireModel


class StreamOptions(WireModel):
    include_usage: StrictBool = False


class JsonSchemaFormat(WireModel):
    _ignored = frozenset({"description"})
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(WireModel):
    """OpenAI's ``response_format``; ``schema`` is llama-server's ``{"type": "json_object", "schema": ...}``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class _SamplingFields(WireModel):
    """Sampling fields shared by chat and text completions (OpenAI names, plus llama.cpp's extras)."""

    _ignored = frozenset({"user", "store", "metadata", "service_tier", "modalities", "audio", "prediction",
                          "web_search_options", "functions", "function_call", "best_of",
                          "cache_prompt", "safety_identifier", "prompt_cache_key", "verbosity"})
    model: str | None = None
    max_tokens: StrictInt | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: StrictInt | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repeat_penalty: float | None = Field(default=None, gt=0)
    repeat_last_n: StrictInt | None = Field(default=None, ge=-1, le=INT32_MAX)  # -1: the whole context
    # llama-server's DRY fields, and localrun's loop guard (off unless asked, or `serve --stop-loops`)
    dry_multiplier: float | None = Field(default=None, ge=0, le=100)
    dry_base: float | None = Field(default=None, ge=1, le=100)
    dry_allowed_length: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)
    dry_penalty_last_n: StrictInt | None = Field(default=None, ge=-1, le=INT32_MAX)
    stop_loops: StrictBool | None = None
    logit_bias: dict[str, float] | None = None
    stop: Union[str, list[str], None] = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1)
    ignore_eos: StrictBool = False  # llama-server's / vLLM's extension
    # how long the model stays loaded after this request (models.request_keep_alive): Ollama's keep_alive
    # ("5m", seconds, 0 = unload now, negative = never) and LM Studio's ttl (seconds), as extensions
    keep_alive: Any = None
    ttl: Any = None
    # structured output (at most one; convert.constraint_for): llama-server's JSON Schema and GBNF fields,
    # and localrun's regex extension (Rust regex syntax, the whole output must match)
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    regex: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        if v is None:
            return []
        v = [v] if isinstance(v, str) else v
        if len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        return [s for s in v if s]


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessageIn]
    max_completion_tokens: StrictInt | None = Field(default=None, gt=0)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None
    parallel_tool_calls: StrictBool | None = None
    # thinking (docs/architecture.md §3): "none" turns it off where the template can; a level the template does not take
    # becomes a thinking budget (server/reply.py EFFORT_BUDGET)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # llama-server's switch: "none" keeps the thinking, tags and all, in content; the others split it off
    reasoning_format: Literal["none", "auto", "deepseek", "parsed"] | None = None
    reasoning_budget: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)  # tokens; localrun's extension
    chat_template_kwargs: dict[str, Any] | None = None  # extra template variables (enable_thinking), as vLLM


class CompletionRequest(_SamplingFields):
    prompt: Union[str, list[str], list[int]]
    response_format: ResponseFormat | None = None  # applied as on chat (convert.constraint_for)
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    echo: StrictBool = False
    suffix: str | None = None


class EmbeddingRequest(WireModel):
    model: str | None = None
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
