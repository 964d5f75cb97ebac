"""Anthropic Messages API request bodies (``POST /v1/messages``, ``/v1/messages/count_tokens``).

Source: Anthropic's API reference, "Messages" and "Count message tokens" (docs.anthropic.com/en/api/messages),
and the ``anthropic`` Python SDK's ``types/message_create_params.py``. Content blocks are validated per
``type``: ``text``, ``image`` (base64 or url source; the model needs its projector, ``--mmproj``),
``tool_use``, ``tool_result``, ``thinking``, ``redacted_thinking`` are read; ``document`` is refused with a
400. Fields an Anthropic client sends that have no local meaning (``metadata``, ``cache_control``,
``service_tier``, ``citations`` …) are accepted and ignored. Validation failures become Anthropic's
``invalid_request_error`` (see ``routes.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, StrictBool, StrictInt, TypeAdapter, ValidationError, field_validator, model_validator

from localrun.server.wire import INT32_MAX, WireModel

_BLOCK_EXTRAS = frozenset({"cache_control", "citations"})


class TextBlock(WireModel):
    _ignored = _BLOCK_EXTRAS
    type: Literal["text"]
    text: str


class ToolUseBlock(WireModel):
    """An earlier assistant turn's tool call: ``input`` is the arguments object."""

    _ignored = _BLOCK_EXTRAS | {"caller"}
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(WireModel):
    """A tool's answer, in a user turn: ``content`` is text or text blocks (an image block is refused)."""

    _ignored = _BLOCK_EXTRAS
    type: Literal["tool_result"]
    tool_use_id: str
    content: Union[str, list[dict[str, Any]], None] = None
    is_error: StrictBool | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, v):
        if isinstance(v, list):
            for part in v:
                _refuse_media(part.get("type"))
                if part.get("type") != "text":
                    raise ValueError(f"tool_result content blocks must be of type 'text', got {part.get('type')!r}")
                TextBlock.model_validate(part)
        return v

    def text(self) -> str:
        """The result as one string (text blocks joined with newlines)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part["text"] for part in self.content)


class ImageBlock(WireModel):
    """An image in a user turn: ``source`` ``{"type": "base64", "media_type", "data"}`` or ``{"type": "url",
    "url"}`` (fetched only under ``serve --allow-image-urls``)."""

    _ignored = _BLOCK_EXTRAS
    type: Literal["image"]
    source: dict[str, Any]

    @field_validator("source")
    @classmethod
    def _source(cls, v):
        kind = v.get("type")
        if kind == "base64" and isinstance(v.get("data"), str):
            return v
        if kind == "url" and isinstance(v.get("url"), str):
            return v
        raise ValueError("an image source is {\"type\": \"base64\", \"media_type\": ..., \"data\": ...} or "
                         "{\"type\": \"url\", \"url\": ...}")


class ThinkingBlock(WireModel):
    """An earlier assistant turn's thinking; ``signature`` is accepted and not verified."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(WireModel):
    """Encrypted thinking from Anthropic's servers: no local model can read it, so it is dropped."""

    type: Literal["redacted_thinking"]
    data: str = ""


ContentBlock = Annotated[Union[TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock,
                               RedactedThinkingBlock],
                         Field(discriminator="type")]
_BLOCK_ADAPTER: TypeAdapter = TypeAdapter(ContentBlock)
_KNOWN_BLOCKS = {"text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"}
_MEDIA_BLOCKS = {"document", "search_result", "container_upload"}


def _refuse_media(kind) -> None:
    if kind in _MEDIA_BLOCKS:
        raise ValueError(f"content blocks of type {kind!r} are not supported: localrun reads no documents; send "
                         "the text as a 'text' block")


class MessageParam(WireModel):
    """One turn. ``content`` as a string is read as one text block (as Anthropic does). A ``system`` turn
    inside ``messages`` (Claude Code sends them, and Anthropic's API of 2026 takes them) holds text blocks
    only; it is rendered where it stands when the chat template allows that, else merged into the leading
    system message (``model.chat_template``). Blocks are validated here, per ``type`` (the field is typed as
    plain objects so that the unknown-field log does not read one block type's fields as another's)."""

    _ignored = frozenset({"output_config", "cache_control"})  # Claude Code's per-turn control on a system turn
    role: Literal["user", "assistant", "system"]
    content: list[dict[str, Any]]

    @field_validator("content", mode="before")
    @classmethod
    def _text_or_blocks(cls, v):
        if isinstance(v, str):
            return [{"type": "text", "text": v}]
        if not isinstance(v, list):
            raise ValueError("content must be a string or a list of content blocks")
        return v

    @field_validator("content")
    @classmethod
    def _blocks(cls, v):
        """Each block → its model; images/documents get a message that says why, other unknown types name
        the ones read."""
        out = []
        for j, part in enumerate(v):
            kind = part.get("type")
            _refuse_media(kind)
            if kind not in _KNOWN_BLOCKS:
                raise ValueError(f"content block type {kind!r} is not supported (localrun reads "
                                 f"{', '.join(sorted(_KNOWN_BLOCKS))})")
            try:
                out.append(_BLOCK_ADAPTER.validate_python(part))
            except ValidationError as e:
                err = e.errors()[0]
                loc = ".".join(str(x) for x in err["loc"][1:])
                raise ValueError(f"content[{j}] ({kind}){' ' + loc if loc else ''}: "
                                 f"{err['msg'].removeprefix('Value error, ')}") from None
        return out


class ToolParam(WireModel):
    """A tool. A client tool (no ``type``, or ``custom``) has ``input_schema``; ``strict: true`` enforces it
    exactly (or refuses it). Anthropic's own tool types (server tools such as ``web_search_…``,
    ``code_execution_…``, ``web_fetch_…``; the schema-less ``bash_…``, ``text_editor_…``) are accepted and left
    out of the prompt (``convert.tools_from_anthropic`` logs them once): they run on Anthropic's side or
    have no schema to show a local model."""

    _ignored = frozenset({"cache_control", "defer_loading", "input_examples", "allowed_callers",
                          "eager_input_streaming"})
    type: str | None = None
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    strict: bool | None = None

    @property
    def is_client_tool(self) -> bool:
        return self.type in (None, "custom")

    @model_validator(mode="after")
    def _client_tools_have_a_schema(self):
        if self.is_client_tool and self.input_schema is None:
            raise ValueError(f"tool {self.name!r} needs 'input_schema' (a JSON Schema object)")
        return self


class ToolChoice(WireModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: StrictBool | None = None


class ThinkingConfig(WireModel):
    """``{"type": "enabled", "budget_tokens": N}`` (N ≥ 1; Anthropic asks for ≥ 1024, localrun takes any
    positive budget as small models think briefly), ``{"type": "disabled"}``, or ``adaptive`` /
    ``between_tools`` (the model decides: thinking on, no budget). ``display`` is accepted and ignored."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: StrictInt | None = Field(default=None, gt=0, le=INT32_MAX)
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(WireModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(WireModel):
    """``effort`` (a reasoning level: ``xhigh``/``max`` are read as ``high``) and ``format`` (structured
    output: the reply's text must match the JSON schema, enforced by constrained decoding)."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class _MessagesBase(WireModel):
    _ignored = frozenset({"metadata", "service_tier", "container", "mcp_servers", "context_management", "betas",
                          "inference_geo", "cache_control", "speed", "diagnostics", "user_profile_id",
                          "workspace_id"})
    model: str | None = None
    messages: list[MessageParam] = Field(min_length=1)
    system: Union[str, list[TextBlock], None] = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


class CountTokensRequest(_MessagesBase):
    """``/v1/messages/count_tokens``: the prompt half of a Messages request; the generation fields a client
    may send along (a whole ``messages.create`` body) are ignored."""

    _ignored = _MessagesBase._ignored | {"max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k"}


class MessagesRequest(_MessagesBase):
    """``/v1/messages``. ``max_tokens`` is required, as in Anthropic's API."""

    max_tokens: StrictInt = Field(gt=0, le=INT32_MAX)
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    stream: StrictBool = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0, le=INT32_MAX)
