"""Ollama's request bodies: ``/api/chat``, ``/api/generate`` (with their ``options``), ``/api/embed``,
``/api/show``.

They are ``WireModel``s (``server/wire.py``: unknown fields are ignored and logged; ``_ignored`` lists the
known ones localrun does not use); an /api/chat message is the OpenAI message shape (``wire.ChatMessageIn``)
plus Ollama's ``images`` and ``thinking``. A sampling field sent beside ``options`` instead of inside it is
logged with that advice (``OptionsBody.field_advice``).

Source: Ollama ``docs/api.md`` and ``api/types.go`` (``Options``: ``num_predict``, ``num_ctx``,
``repeat_last_n``...).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import Field, StrictBool, StrictInt

from localrun.server.wire import INT32_MAX, ChatMessageIn, ToolDef, WireModel


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


class OptionsBody(WireModel):
    """A body with Ollama's ``options``: a sampling field sent at the top level is advised to move there."""

    @classmethod
    def field_advice(cls, key: str) -> str | None:
        if key in OllamaOptions.model_fields:
            return f"Ollama reads {key!r} under 'options' ({{\"options\": {{\"{key}\": ...}}}})"
        return None


class OllamaChatRequest(OptionsBody):
    _ignored = frozenset({"logprobs", "top_logprobs", "truncate", "shift"})
    model: str | None = None
    messages: list[OllamaMessage] = Field(default_factory=list)
    stream: StrictBool = True
    format: Union[Literal["json", ""], dict[str, Any], None] = None
    options: OllamaOptions | None = None
    tools: list[ToolDef] | None = None
    think: OllamaThink = None
    keep_alive: Any = None


class OllamaGenerateRequest(OptionsBody):
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
