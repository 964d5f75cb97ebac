"""What is on disk: the GGUFs in localrun's store, and those found read-only in other tools' folders (the
Hugging Face cache, Ollama's blobs, LM Studio's models folder). Split from ``store/resolve.py``, which turns
a MODEL argument into one of them."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class LocalModel:
    """One GGUF on disk. ``source``: localrun (the store; pulled) | huggingface | ollama | lmstudio
    (found read-only in another tool's folder; localrun never modifies those)."""

    name: str  # catalog name / OWNER--REPO (localrun), OWNER/REPO (HF, LM Studio), model:tag (Ollama)
    quant: str | None
    size_bytes: int
    path: str
    source: str
    repo: str | None = None
    file: str | None = None
    read_only: bool = False

    @property
    def ref(self) -> str:
        """What to type to use it: ``name:QUANT`` (store, HF, LM Studio) or ``name`` (Ollama's own tag)."""
        if self.source == "ollama" or not self.quant:
            return self.name
        return f"{self.name}:{self.quant}"

    def to_dict(self) -> dict:
        return {**asdict(self), "ref": self.ref}


def is_primary_gguf(p: Path) -> bool:
    """A GGUF that is a model's file or first part: not a projector (mmproj), a later split part, a partial."""
    low = p.name.lower()
    return (
        low.endswith(".gguf")
        and "mmproj" not in low
        and not re.search(r"-0000[2-9]-of-|-000[1-9]\d-of-", low)
        and not low.endswith(".partial")
    )


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def ollama_models_dir() -> list[Path]:
    """Ollama's model store: OLLAMA_MODELS, else ~/.ollama/models and the Linux service's folder."""
    if os.environ.get("OLLAMA_MODELS"):
        return [Path(os.environ["OLLAMA_MODELS"]).expanduser()]
    return [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def lmstudio_models_dirs() -> list[Path]:
    """LM Studio's models folders (publisher/repo/file.gguf): ~/.lmstudio/models, ~/.cache/lm-studio/models."""
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def file_size(p: Path) -> int:
    """``p``'s size in bytes, 0 when it cannot be read."""
    try:
        return p.stat().st_size
    except OSError:
        return 0


def model_size(p: Path) -> int:
    """Bytes on disk of the model whose file (or split model's first shard) is ``p``: a split model's
    shards found beside it, summed (``model.gguf_split.shard_files``); 0 when none can be read."""
    from localrun.model.gguf_split import shard_files

    return sum(file_size(q) for q in shard_files(p))


def scan_store(models_dir: Path) -> list[LocalModel]:
    """GGUFs in localrun's own store, named by their pull sidecar when there is one."""
    from localrun.model.catalog import quant_from_filename
    from localrun.store.download import SIDECAR_SUFFIX

    out = []
    if not models_dir.is_dir():
        return out
    for p in sorted(models_dir.rglob("*.gguf")):
        if not is_primary_gguf(p):
            continue
        side = {}
        sp = p.with_name(p.name + SIDECAR_SUFFIX)
        if sp.is_file():
            try:
                side = json.loads(sp.read_text())
            except ValueError:
                side = {}
        rel = p.relative_to(models_dir)
        name = side.get("name") or (rel.parts[0] if len(rel.parts) > 1 else p.stem)
        size = side.get("size_bytes") if side.get("parts") else model_size(p)
        out.append(
            LocalModel(
                name,
                side.get("quant") or quant_from_filename(p.name),
                size,
                str(p),
                "localrun",
                side.get("repo"),
                side.get("file") or p.name,
            )
        )
    return out


def scan_hf_cache(cache: Path | None = None) -> list[LocalModel]:
    """GGUFs in the Hugging Face cache: models--OWNER--REPO/snapshots/REV/FILE (links into blobs/)."""
    from localrun.model.catalog import quant_from_filename

    cache = cache or hf_cache_dir()
    out, seen = [], set()
    if not cache.is_dir():
        return out
    for repo_dir in sorted(cache.glob("models--*")):
        repo = repo_dir.name[len("models--") :].replace("--", "/", 1)
        for p in sorted(repo_dir.glob("snapshots/*/**/*.gguf")):
            if not is_primary_gguf(p) or not p.exists():
                continue
            real = p.resolve()
            if real in seen:
                continue
            seen.add(real)
            file = "/".join(p.relative_to(repo_dir).parts[2:])
            out.append(
                LocalModel(repo, quant_from_filename(p.name), model_size(p), str(p), "huggingface", repo, file,
                           read_only=True)
            )
    return out


def scan_ollama(roots: list[Path] | None = None) -> list[LocalModel]:
    """Ollama models: manifests/REGISTRY/NAMESPACE/MODEL/TAG (OCI JSON) → the
    ``application/vnd.ollama.image.model`` layer's blob (blobs/sha256-HEX, a GGUF). The quant is the
    config blob's ``file_type``. Names drop ``registry.ollama.ai/library/`` as ``ollama list`` does."""
    out = []
    for root in roots if roots is not None else ollama_models_dir():
        mdir = root / "manifests"
        if not mdir.is_dir():
            continue
        for man in sorted(p for p in mdir.rglob("*") if p.is_file()):
            try:
                data = json.loads(man.read_text())
            except (OSError, ValueError):
                continue
            rel = man.relative_to(mdir).parts
            if len(rel) < 4:
                continue
            registry, ns, model, tag = rel[0], "/".join(rel[1:-2]), rel[-2], rel[-1]
            name = f"{model}:{tag}"
            if ns != "library":
                name = f"{ns}/{name}"
            if registry != "registry.ollama.ai":
                name = f"{registry}/{name}"
            blob, quant = None, None
            for layer in data.get("layers", []):
                if layer.get("mediaType") == "application/vnd.ollama.image.model":
                    blob = root / "blobs" / layer.get("digest", "").replace(":", "-")
            cfg = data.get("config", {}).get("digest")
            if cfg:
                try:
                    quant = json.loads((root / "blobs" / cfg.replace(":", "-")).read_text()).get("file_type")
                except (OSError, ValueError):
                    quant = None
            if blob is not None and blob.is_file():
                out.append(LocalModel(name, quant, file_size(blob), str(blob), "ollama", read_only=True))
    return out


def scan_lmstudio(roots: list[Path] | None = None) -> list[LocalModel]:
    """LM Studio models: PUBLISHER/REPO/FILE.gguf under its models folder."""
    from localrun.model.catalog import quant_from_filename

    out = []
    for root in roots if roots is not None else lmstudio_models_dirs():
        if not root.is_dir():
            continue
        for p in sorted(root.rglob("*.gguf")):
            if not is_primary_gguf(p):
                continue
            parts = p.relative_to(root).parts
            name = "/".join(parts[:2]) if len(parts) >= 3 else p.stem
            out.append(
                LocalModel(
                    name,
                    quant_from_filename(p.name),
                    model_size(p),
                    str(p),
                    "lmstudio",
                    name if len(parts) >= 3 else None,
                    p.name,
                    read_only=True,
                )
            )
    return out
