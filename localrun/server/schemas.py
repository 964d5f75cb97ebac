"""Wire formats the server accepts: OpenAI's (``/v1/...``) and Ollama's (``/api/...``) request bodies.

Pydantic models validate types and ranges; unknown fields are ignored (clients send many we do not use,
e.g. ``user``, ``store``, ``keep_alive``). Validation failures become a 400 with an OpenAI-style error
object naming the offending field (see ``app.py``). Responses are built as plain dicts in ``convert.py``.

Sources: OpenAI API reference (``chat/completions``, ``completions``, ``embeddings``), Ollama
``docs/api.md`` and ``api/types.go`` (``Options``: ``num_predict``, ``num_ctx``, ``repeat_last_n``...).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------------------------------------- OpenAI
class TextPart(_Base):
    type: Literal["text"]
    text: str


class ChatMessageIn(_Base):
    """One message. ``developer`` is OpenAI's newer name for ``system``; content may be a string or a list
    of text parts (images are not supported by the text-only backends)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[dict[str, Any]], None] = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

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


class StreamOptions(_Base):
    include_usage: StrictBool = False


class JsonSchemaFormat(_Base):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Base):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDef(_Base):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Base):
    type: Literal["function"]
    function: FunctionDef


class _SamplingFields(_Base):
    """Sampling fields shared by chat and text completions (OpenAI names, plus llama.cpp's extras)."""

    model: str | None = None
    max_tokens: StrictInt | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: StrictInt | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repeat_penalty: float | None = Field(default=None, gt=0)
    repeat_last_n: StrictInt | None = Field(default=None, ge=-1)
    logit_bias: dict[str, float] | None = None
    stop: Union[str, list[str], None] = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1)
    ignore_eos: StrictBool = False  # llama-server's / vLLM's extension

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


class CompletionRequest(_SamplingFields):
    prompt: Union[str, list[str], list[int]]
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    echo: StrictBool = False
    suffix: str | None = None


class EmbeddingRequest(_Base):
    model: str | None = None
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None


# ---------------------------------------------------------------------------------------------- Ollama
class OllamaOptions(_Base):
    """``options`` of /api/chat and /api/generate (Ollama api/types.go ``Options``)."""

    num_predict: StrictInt | None = None  # -1 = unlimited
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: StrictInt | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = Field(default=None, gt=0)
    repeat_last_n: StrictInt | None = Field(default=None, ge=-1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_ctx: StrictInt | None = None  # ignored: the context is fixed at load time


class OllamaMessage(_Base):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = None


class OllamaChatRequest(_Base):
    model: str | None = None
    messages: list[OllamaMessage] = Field(default_factory=list)
    stream: StrictBool = True
    format: Union[Literal["json", ""], dict[str, Any], None] = None
    options: OllamaOptions | None = None
    tools: list[ToolDef] | None = None
    keep_alive: Any = None


class OllamaGenerateRequest(_Base):
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
    keep_alive: Any = None


class OllamaEmbedRequest(_Base):
    """``/api/embed`` (``input``: a string or a list) and the older ``/api/embeddings`` (``prompt``)."""

    model: str | None = None
    input: Union[str, list[str], None] = None
    prompt: str | None = None
    truncate: StrictBool = True


class OllamaShowRequest(_Base):
    model: str | None = None
    name: str | None = None  # older clients
