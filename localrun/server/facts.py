"""What the server shows of a model: an MLX folder's facts (``FolderFacts``, read from its ``config.json``) in
the fields a GGUF ``ModelSpec`` has (``ServerState.spec``, Ollama's ``/api/show``), and a model's
``Capabilities`` (``model_capabilities``, ``file_capabilities``: ``/api/show``, ``/v1/models``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class FolderFacts:
    """What the Ollama routes show of a model that has no GGUF header: an MLX folder (config.json +
    *.safetensors, the mlx-community layout). Sizes in bytes, lengths in tokens; 0 where unknown."""

    arch: str = "unknown"
    name: str = ""
    n_params: int = 0
    file_type: str = ""
    file_bytes: int = 0
    n_ctx_train: int = 0
    n_layer: int = 0
    n_embd: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    format: str = "mlx"
    vision: bool = False  # config.json has a vision tower (``vision_config``)


def folder_facts(path: str) -> FolderFacts:
    """``FolderFacts`` from an MLX folder's config.json (Hugging Face config names); never raises."""
    p = Path(path)
    try:
        cfg = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    if not isinstance(cfg, dict):
        cfg = {}
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    q = cfg.get("quantization") or cfg.get("quantization_config") or {}
    bits = q.get("bits") if isinstance(q, dict) else None
    try:
        size = sum(f.stat().st_size for f in p.glob("*.safetensors"))
    except OSError:
        size = 0

    def num(key: str) -> int:
        v = text.get(key, cfg.get(key))
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    return FolderFacts(arch=str(text.get("model_type") or cfg.get("model_type") or "unknown"), name=p.name,
                       file_type=f"{bits}-bit" if bits else str(cfg.get("torch_dtype") or ""), file_bytes=size,
                       n_ctx_train=num("max_position_embeddings"), n_layer=num("num_hidden_layers"),
                       n_embd=num("hidden_size"), n_head=num("num_attention_heads"),
                       n_head_kv=num("num_key_value_heads") or num("num_attention_heads"),
                       vision=isinstance(cfg.get("vision_config"), dict))


def model_capabilities(st):
    """The ``Capabilities`` of a loaded model (``ServerState``): from the header it was loaded from and the
    chat template its engine uses (``--chat-template`` included)."""
    from localrun.model.capabilities import capabilities

    return capabilities(st.spec, st.engine.template_source,
                        generic_tools=bool(getattr(st.options, "generic_tools", False)),
                        vision=getattr(st.engine, "projector", None) is not None)


def file_capabilities(path: str, *, generic_tools: bool = False):
    """The ``Capabilities`` of a model on disk, not loaded: its GGUF header and the template it carries (an
    MLX folder: ``config.json`` and ``tokenizer_config.json``'s ``chat_template``). Never raises (an
    unreadable file: completion only)."""
    from localrun.model.capabilities import capabilities

    p = Path(path)
    if p.is_dir():
        tpl = None
        try:
            tc = json.loads((p / "tokenizer_config.json").read_text())
            tpl = tc.get("chat_template") if isinstance(tc, dict) else None
            if tpl is None and (p / "chat_template.jinja").is_file():
                tpl = (p / "chat_template.jinja").read_text()
        except (OSError, ValueError):
            pass
        return capabilities(folder_facts(path), tpl if isinstance(tpl, str) else None, generic_tools=generic_tools)
    try:
        from localrun.model.gguf_info import read_gguf

        spec = read_gguf(path)
    except Exception:  # an unreadable header: what Ollama says when it cannot open the file
        return capabilities(None, None)
    return capabilities(spec, spec.chat_template, generic_tools=generic_tools)
