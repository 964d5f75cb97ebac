"""The request body of ``POST /v1/responses`` (OpenAI API reference, "Create a model response").

Items of ``input`` stay plain dicts here: their many types are checked one by one in ``convert.py``, where a
bad item is a 400 naming it (``input[2].type``). Fields OpenAI defines that localrun accepts without using
are listed in ``_ignored``; any other unknown field is logged once per client (never a 400).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import Field, StrictBool, StrictInt, StrictStr

from localrun.server.wire import INT32_MAX, WireModel


class TextFormat(WireModel):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (with ``schema``, ``name``, ``strict``)."""

    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr | None = None
    description: StrictStr | None = None  # echoed on the response (the model is not shown it)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(WireModel):
    _ignored = frozenset({"verbosity"})
    format: TextFormat | None = None


class ReasoningConfig(WireModel):
    """``reasoning``: ``effort`` (none|minimal|low|medium|high|xhigh) → the thinking budget; ``summary``
    (auto|concise|detailed) is accepted, and the thinking text is returned whole as ``reasoning_text``."""

    _ignored = frozenset({"generate_summary"})
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(WireModel):
    """``POST /v1/responses``. localrun's extensions (as on chat completions): ``top_k``, ``min_p``,
    ``seed``, ``stop``, the penalties."""

    _ignored = frozenset({"metadata", "user", "truncation", "prompt_cache_retention", "service_tier",
                          "stream_options", "parallel_tool_calls", "top_logprobs", "context_management",
                          "client_metadata"})
    model: StrictStr | None = None
    input: Union[StrictStr, list[dict[str, Any]]] | None = None
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[StrictStr, dict[str, Any]] | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    store: StrictBool | None = None
    stream: StrictBool | None = False
    background: StrictBool | None = None
    previous_response_id: StrictStr | None = None
    include: list[StrictStr] | None = None
    metadata: dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: StrictStr | None = None
    safety_identifier: StrictStr | None = None  # echoed on the response, otherwise unused
    prompt_cache_key: StrictStr | None = None  # echoed; the prefix cache needs no key
    conversation: Any = None  # the Conversations API: not built (a 400 says so)
    prompt: Any = None  # a prompt template stored at OpenAI: not available locally (a 400 says so)
    # localrun's extensions (the sampling fields chat completions take)
    top_k: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: StrictInt | None = None
    stop: Union[StrictStr, list[StrictStr]] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repeat_penalty: float | None = Field(default=None, ge=0)
    repeat_last_n: StrictInt | None = Field(default=None, ge=-1, le=INT32_MAX)
    dry_multiplier: float | None = Field(default=None, ge=0)
    dry_base: float | None = Field(default=None, ge=1)
    dry_allowed_length: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)
    dry_penalty_last_n: StrictInt | None = Field(default=None, ge=-1, le=INT32_MAX)
    stop_loops: StrictBool | None = None
