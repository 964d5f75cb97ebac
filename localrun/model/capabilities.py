"""What a model can be asked to do, from the chat template and the header the engine uses: ``Capabilities``
and Ollama's list of them (``/api/show`` ``capabilities``), the same facts in ``/v1/models``' ``meta``, and the
"capabilities" line of ``localrun show`` / ``inspect``.

Ollama's rules (``server/images.go`` ``Model.Capabilities``, ``types/model/capability.go``), applied to a GGUF
header and a Jinja template instead of a Go template:

- ``embedding`` when the header has ``{arch}.pooling_type`` (an embedding or reranking model), else
  ``completion``;
- ``vision`` when the loaded engine has a vision projector (``--mmproj``, or the ``mmproj-*.gguf`` beside
  the model): it takes images; ``vision_encoder`` keeps the header's own fact (``{arch}.vision.block_count``);
- ``tools`` when the template renders a ``tools`` list (``chat_template.template_supports_tools``), or when
  the server offers its generic tool format to any model with a chat template (``generic_tools``:
  ``ServeOptions.generic_tools``, off with ``serve --no-generic-tools``); ``localrun show``/``inspect`` say
  the file's own facts (no generic format);
- ``insert`` when the server fills in the middle (``suffix``), which localrun does not;
- ``thinking`` when the template has a thinking block (``dialects.detect_family``).

Pooling types (llama.cpp ``include/llama.h`` ``llama_pooling_type``): 0 none, 1 mean, 2 cls, 3 last, 4 rank
(a reranker: a classification head scores a query/document pair).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


@dataclass(frozen=True)
class Capabilities:
    """A model's capabilities. ``family``: the template family ("plain" without a template);
    ``thinking``: the family name when the model thinks, else None; ``tool_calls``: its tool-call syntax
    ("hermes", "llama3", "mistral", "deepseek", "harmony"; "generic" for the server's fallback; None);
    ``pooling``: the header's pooling type name (None: not set: a generative model)."""

    completion: bool
    embedding: bool
    tools: bool
    thinking: str | None
    tool_calls: str | None
    family: str
    vision: bool = False
    vision_encoder: bool = False
    insert: bool = False
    chat_template: bool = False
    pooling: str | None = None

    @property
    def reranker(self) -> bool:
        """A reranking model (pooling type RANK), what ``/v1/rerank`` needs."""
        return self.pooling == "rank"

    def ollama(self) -> list[str]:
        """Ollama's ``capabilities`` list, in Ollama's order (completion/embedding, vision, tools, insert,
        thinking)."""
        out = ["completion"] if self.completion else []
        out += ["embedding"] if self.embedding else []
        out += ["vision"] if self.vision else []
        out += ["tools"] if self.tools else []
        out += ["insert"] if self.insert else []
        out += ["thinking"] if self.thinking else []
        return out

    def to_dict(self) -> dict:
        """The facts as JSON (``/v1/models`` ``meta.capabilities`` carries ``ollama()``, this beside it)."""
        return {**asdict(self), "reranker": self.reranker, "capabilities": self.ollama()}

    def line(self) -> str:
        """One readable line: ``completion, tools (hermes), thinking (deepseek-r1)``."""
        parts = []
        for c in self.ollama():
            if c == "tools" and self.tool_calls:
                parts.append(f"tools ({self.tool_calls})")
            elif c == "thinking":
                parts.append(f"thinking ({self.thinking})")
            elif c == "embedding" and self.pooling:
                parts.append(f"embedding ({self.pooling} pooling{': a reranker' if self.reranker else ''})")
            else:
                parts.append(c)
        if self.vision_encoder and not self.vision:
            parts.append("vision tower in the file (images are not served)")
        if not self.chat_template and self.completion:
            parts.append("no chat template (raw completion)")
        return ", ".join(parts)


def header_pooling(header) -> str | None:
    """The pooling type a GGUF header (``ModelSpec``) sets, by name; None when it sets none or ``header``
    is not a GGUF spec (an MLX folder's facts)."""
    meta = getattr(header, "meta", None)
    if not callable(meta):
        return None
    v = meta(".pooling_type")
    if v is None:
        return None
    try:
        return POOLING_TYPES.get(int(v), str(v))
    except (TypeError, ValueError):
        return str(v)


def header_vision(header) -> bool:
    """Whether the header describes a vision tower (Ollama: ``{arch}.vision.block_count``; an MLX
    folder's ``vision``)."""
    meta = getattr(header, "meta", None)
    if callable(meta):
        return meta(".vision.block_count") is not None
    return bool(getattr(header, "vision", False))


def capabilities(header, template_source: str | None, *, generic_tools: bool = False,
                 vision: bool = False) -> Capabilities:
    """``Capabilities`` of a model from its ``header`` (a GGUF ``ModelSpec``, an MLX ``FolderFacts``, or None)
    and the chat template the engine uses (``engine.template_source``; the header's own when not loaded;
    None: no template). ``generic_tools``: the server offers tools to templates without tool syntax
    (its generic tool-call format). ``vision``: the engine loaded a vision projector (it takes images).
    Never raises."""
    from localrun.dialects.families import detect_family
    from localrun.model.chat_template import template_supports_tools

    family = detect_family(template_source)
    pooling = header_pooling(header) if header is not None else None
    templated = bool(template_source)
    own_tools = template_supports_tools(template_source)
    tools = own_tools or (generic_tools and templated and pooling is None)
    # the server's rule (server/reply.py prepare_chat): the family's own syntax, else the generic format
    syntax = family.tools or ("generic" if tools and generic_tools else None)
    return Capabilities(completion=pooling is None, embedding=pooling is not None, tools=tools,
                        thinking=family.name if family.thinking is not None else None, tool_calls=syntax,
                        family=family.name, vision=vision,
                        vision_encoder=header_vision(header) if header is not None else False,
                        insert=False, chat_template=templated, pooling=pooling)
