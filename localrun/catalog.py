"""``models.toml`` → catalog entries: what the planner needs to plan a model with no file on disk, and
where each quantization can be downloaded.

Schema of one entry (``[[model]]`` table; see models.toml)::

    name = "qwen3-8b"            # unique key, used as `localrun pull qwen3-8b:Q4_K_M`
    family = "qwen3"
    arch = "qwen3"               # GGUF general.architecture
    params_total = 8.19e9        # parameters
    params_active = 8.19e9       # active per token (MoE < total)
    n_layer = 36
    n_embd = 4096
    n_ff = 12288                 # dense FFN size (MoE: the expert FFN size is n_ff_exp)
    n_ff_exp = 0
    n_head = 32
    n_head_kv = 8
    head_dim = 128               # per head, K and V (head_dim_v may override V)
    vocab_size = 151936
    n_ctx_train = 40960
    sliding_window = 0           # tokens; 0 = no SWA
    swa_pattern = 0              # llama.cpp set_swa_pattern(n): layer il is SWA iff il % n < n-1
    n_expert = 0
    n_expert_used = 0
    kv_lora_rank = 0             # MLA latent rank (DeepSeek-V2/V3)
    license = "apache-2.0"
    chat_template = true
    [model.sources]              # quant → Hugging Face repo and file; "mlx" → an MLX repo
    Q4_K_M = { repo = "Qwen/Qwen3-8B-GGUF", file = "Qwen3-8B-Q4_K_M.gguf" }
    mlx = { repo = "mlx-community/Qwen3-8B-4bit" }
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from localrun.errors import ConfigError


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    family: str
    arch: str
    params_total: float
    params_active: float
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    vocab_size: int
    n_ctx_train: int
    n_ff_exp: int = 0
    head_dim_v: int = 0
    sliding_window: int = 0
    swa_pattern: int = 0
    n_expert: int = 0
    n_expert_used: int = 0
    kv_lora_rank: int = 0
    license: str = ""
    chat_template: bool = True
    description: str = ""
    sources: dict = field(default_factory=dict)

    @property
    def quants(self) -> list[str]:
        return [q for q in self.sources if q != "mlx"]


def catalog_path() -> Path:
    """models.toml: next to the package in a source checkout, or shipped inside it when installed."""
    here = Path(__file__).resolve().parent
    for cand in (here.parent / "models.toml", here / "models.toml"):
        if cand.is_file():
            return cand
    raise ConfigError("models.toml not found", hint="reinstall localrun")


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[CatalogEntry, ...]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    known = {f.name for f in fields(CatalogEntry)}
    out = []
    for raw in data.get("model", []):
        unknown = set(raw) - known
        if unknown:
            raise ConfigError(f"{path}: model {raw.get('name')!r} has unknown keys {sorted(unknown)}")
        out.append(CatalogEntry(**raw))
    return tuple(out)


def load_catalog() -> list[CatalogEntry]:
    return list(_load(str(catalog_path())))


def get_entry(name: str) -> CatalogEntry | None:
    """The entry called ``name`` (case-insensitive; a ``:QUANT`` suffix is ignored), or None."""
    base = name.split(":", 1)[0].lower()
    for e in load_catalog():
        if e.name.lower() == base:
            return e
    return None
