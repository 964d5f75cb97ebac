"""Wire formats the server accepts: OpenAI's (``/v1/...``) and Ollama's (``/api/...``) request bodies.

Pydantic models validate types and ranges; unknown fields are ignored (clients send many we do not use,
e.g. ``user``, ``store``, ``keep_alive``), but ``unknown_fields`` finds them so the server can log a
warning (a misspelt ``temprature``, Ollama's ``temperature`` outside ``options``). Fields listed in a
model's ``_ignored`` are known and deliberately unused (logged at debug only). Integers that reach
llama.cpp's C ``int`` parameters are bounded to ``INT32_MAX``. Validation failures become a 400 with an
OpenAI-style error object naming the offending field (see ``app.py``). Responses are built as plain dicts
in ``convert.py``.

Sources: OpenAI API reference (``chat/completions``, ``completions``, ``embeddings``), Ollama
``docs/api.md`` and ``api/types.go`` (``Options``: ``num_predict``, ``num_ctx``, ``repeat_last_n``...).
"""

from __future__ import annotations

import difflib
import typing
from typing import Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

INT32_MAX = 2**31 - 1  # llama.cpp's sampler parameters (top_k, penalty_last_n) are C ints


class WireModel(BaseModel):
    """The base of every request body: unknown fields are ignored (and logged once per client by
    ``ServerState.parse``); ``_ignored`` lists known fields localrun accepts without using them."""

    model_config = ConfigDict(extra="ignore")
    _ignored: ClassVar[frozenset[str]] = frozenset()  # known fields localrun accepts and does not use


# ---------------------------------------------------------------------------------------------- OpenAI
class TextPart(WireModel):
    type: Literal["text"]
    text: str


class ChatMessageIn(WireModel):
    """One message. ``developer`` is OpenAI's newer name for ``system``; content may be a string or a list
    of text parts (images are not supported by the text-only backends)."""

    _ignored = frozenset({"refusal", "annotations", "audio", "function_call", "thinking"})
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[dict[str, Any]], None] = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # an earlier turn's thinking (llama-server's name; ``reasoning`` is Ollama's OpenAI route's)
    reasoning_content: str | None = None
    reasoning: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v):
        """List content → ``TextPart``s; an image/audio/file part is refused by name (text-only models)."""
        if not isinstance(v, list):
            return v
        parts = []
        for part in v:
            kind = part.get("type")
            if kind != "text":
                raise ValueError(f"content parts of type {kind!r} are not supported: localrun serves text-only "
                                 "models (send text, or parts of type 'text')")
            parts.append(TextPart.model_validate(part))
        return parts


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


class FunctionDef(WireModel):
    _ignored = frozenset({"strict"})
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(WireModel):
    type: Literal["function"]
    function: FunctionDef


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
    # thinking (issue 13): "none" turns it off where the template can; a level the template does not take
    # becomes a thinking budget (server/reply.py EFFORT_BUDGET)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # llama-server's switch: "none" keeps the thinking, tags and all, in content; the others split it off
    reasoning_format: Literal["none", "auto", "deepseek", "parsed"] | None = None
    reasoning_budget: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)  # tokens; localrun's extension
    chat_template_kwargs: dict[str, Any] | None = None  # extra template variables (enable_thinking), as vLLM


class CompletionRequest(_SamplingFields):
    prompt: Union[str, list[str], list[int]]
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    echo: StrictBool = False
    suffix: str | None = None


class EmbeddingRequest(WireModel):
    model: str | None = None
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None


# ---------------------------------------------------------------------------------------------- Ollama
class OllamaOptions(WireModel):
    """``options`` of /api/chat and /api/generate (Ollama api/types.go ``Options``). Load-time options
    (``num_gpu``, ``num_thread``, ``use_mmap``...) are fixed when the server starts and ignored here."""

    _ignored = frozenset({"num_keep", "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "vocab_only",
                          "use_mmap", "use_mlock", "num_thread", "f16_kv", "logits_all", "embedding_only"})
    num_predict: StrictInt | None = None  # -1 = unlimited
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: StrictInt | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = Field(default=None, gt=0)
    repeat_last_n: StrictInt | None = Field(default=None, ge=-1, le=INT32_MAX)  # -1: the whole context
    dry_multiplier: float | None = Field(default=None, ge=0, le=100)  # as llama-server's fields
    dry_base: float | None = Field(default=None, ge=1, le=100)
    dry_allowed_length: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)
    dry_penalty_last_n: StrictInt | None = Field(default=None, ge=-1, le=INT32_MAX)
    stop_loops: StrictBool | None = None  # localrun's loop guard
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_ctx: StrictInt | None = None  # tokens per sequence: a resident with another context reloads (models.py)


class OllamaMessage(ChatMessageIn):
    """An /api/chat message: everything the OpenAI route accepts (``content: null`` with ``tool_calls``,
    text parts, ``tool_call_id``, ``developer``), plus Ollama's ``images`` and ``thinking``."""

    images: list[str] | None = None
    thinking: str | None = None


OllamaThink = Union[StrictBool, Literal["low", "medium", "high"], None]


class OllamaChatRequest(WireModel):
    _ignored = frozenset({"logprobs", "top_logprobs", "truncate", "shift"})
    model: str | None = None
    messages: list[OllamaMessage] = Field(default_factory=list)
    stream: StrictBool = True
    format: Union[Literal["json", ""], dict[str, Any], None] = None
    options: OllamaOptions | None = None
    tools: list[ToolDef] | None = None
    think: OllamaThink = None
    keep_alive: Any = None


class OllamaGenerateRequest(WireModel):
    _ignored = frozenset({"template", "logprobs", "top_logprobs", "truncate", "shift"})
    model: str | None = None
    prompt: str = ""
    system: str | None = None
    suffix: str | None = None
    raw: StrictBool = False
    stream: StrictBool = True
    format: Union[Literal["json", ""], dict[str, Any], None] = None
    options: OllamaOptions | None = None
    context: list[int] | None = None
    images: list[str] | None = None
    think: OllamaThink = None
    keep_alive: Any = None


class OllamaEmbedRequest(WireModel):
    """``/api/embed`` (``input``: a string or a list) and the older ``/api/embeddings`` (``prompt``)."""

    model: str | None = None
    input: Union[str, list[str], None] = None
    prompt: str | None = None
    truncate: StrictBool = True


class OllamaShowRequest(WireModel):
    model: str | None = None
    name: str | None = None  # older clients


# ---------------------------------------------------------------------------------------------- unknown fields
def unknown_fields(model: type[BaseModel], data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Fields of the JSON object ``data`` that ``model`` neither reads nor lists in ``_ignored`` →
    ``[(path, advice)]``; nested objects and lists of objects are searched (paths like
    ``options.temprature``, ``messages[].contnet``). ``advice`` says what was probably meant."""
    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    names = {n for n in fields} | {f.alias for f in fields.values() if f.alias}
    out = []
    for key, value in data.items():
        key = str(key)
        if key not in names:
            if key not in model._ignored:
                out.append((prefix + key, _advice(model, key, names)))
            continue
        sub, many = _nested_model(fields[key].annotation) if key in fields else (None, False)
        if sub is None:
            continue
        if many and isinstance(value, list):
            for item in value:
                out.extend(unknown_fields(sub, item, f"{prefix}{key}[]."))
        elif not many:
            out.extend(unknown_fields(sub, value, f"{prefix}{key}."))
    return list(dict.fromkeys(out))


def _advice(model: type[BaseModel], key: str, names: set[str]) -> str:
    opts = model.model_fields.get("options")
    if opts is not None and key in OllamaOptions.model_fields:
        return f"Ollama reads {key!r} under 'options' ({{\"options\": {{\"{key}\": ...}}}})"
    close = difflib.get_close_matches(key, sorted(names), n=1, cutoff=0.75)
    return f"did you mean {close[0]!r}?" if close else "not a field localrun knows"


def _nested_model(annotation) -> tuple[type[BaseModel] | None, bool]:
    """The BaseModel inside ``annotation`` (``X | None``, ``list[X]``) → (model, is a list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and args:
        sub, _ = _nested_model(args[0])
        return sub, sub is not None
    for a in args:
        sub, many = _nested_model(a)
        if sub is not None:
            return sub, many
    return None, False
