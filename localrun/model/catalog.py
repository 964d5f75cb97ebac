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
    layer_pattern = "RRRA…"      # hybrids: A attention, R recurrent, F FFN-only, one letter per layer
    full_attention_interval = 4  # or: Qwen3.5/3.6's every-Nth-layer attention
    ssm_conv_kernel = 4          # ssm_*: the recurrent layers' sizes as the GGUF's ssm.* keys hold them
    shortconv_l_cache = 3        # LFM2's conv kernel
    shared_kv_layers = 20        # Gemma 4: the last N layers reuse earlier KV; head_dim_swa, n_head_kv_swa:
    n_embd_per_layer = 256       # the sliding layers' heads; per-layer embedding width
    file_bytes = { Q4_K_M = 1 }  # published GGUF sizes, bytes (cite the model card in a comment)
    tie_embeddings = false       # output.weight shares token_embd (HF tie_word_embeddings)
    license = "apache-2.0"
    chat_template = true
    [model.sources]              # quant → Hugging Face repo and file; "mlx" → an MLX repo
    # a split GGUF is named by its first part (…-00001-of-00003.gguf); pull fetches every part
    Q4_K_M = { repo = "Qwen/Qwen3-8B-GGUF", file = "Qwen3-8B-Q4_K_M.gguf" }
    mlx = { repo = "mlx-community/Qwen3-8B-4bit" }
    [model.mmproj]               # a multimodal model's projector: pulled beside the model file
    repo = "ggml-org/gemma-3-4b-it-GGUF"
    file = "mmproj-model-f16.gguf"  # named mmproj-*.gguf: the loader finds it beside the model
    bytes = 851251104            # the file's size on the hub
    projector = "gemma3"         # clip.projector_type
    image_size = 896             # clip.vision.*: pixels per side, patch pixels, width, FFN width, heads,
    patch_size = 14              # patches merged per side (offload/vision.py: compute buffer, tokens)
    n_embd = 1152
    n_ff = 4304
    n_head = 16
    n_merge = 4
    refused = "…"                # set: localrun cannot take this projector's images yet (the reason)
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
    # hybrid and Gemma-4 layouts (see ``localrun.model.synthetic.hybrid_meta`` for the header keys they become)
    layer_pattern: str = ""  # one letter per layer: A attention, R recurrent (delta-net, Mamba-2, short conv),
    #                          F FFN only (Nemotron-H's "-"); "" = all attention, or full_attention_interval
    full_attention_interval: int = 0  # qwen35/qwen35moe: every Nth layer (1-based) is attention
    ssm_conv_kernel: int = 0
    ssm_inner_size: int = 0  # delta-net: value heads × head size; Mamba-2: d_inner
    ssm_state_size: int = 0  # delta-net: head size; Mamba-2: d_state
    ssm_group_count: int = 0  # delta-net: key heads; Mamba-2: groups
    ssm_time_step_rank: int = 0  # delta-net: value heads; Mamba-2: heads
    shortconv_l_cache: int = 0  # LFM2's conv kernel length
    n_ff_shexp: int = 0  # shared expert FFN size
    shared_kv_layers: int = 0  # Gemma 4: the last N layers reuse earlier KV
    head_dim_swa: int = 0  # Gemma 4: the sliding layers' head size (head_dim = the global layers')
    n_head_kv_swa: int = 0  # Gemma 4: the sliding layers' KV heads (n_head_kv = the global layers')
    n_embd_per_layer: int = 0  # Gemma 4 E2B/E4B per-layer embeddings width
    file_bytes: dict = field(default_factory=dict)  # quant → bytes of a published GGUF (cited in models.toml)
    tie_embeddings: bool = False  # output projection shares the token-embedding matrix
    license: str = ""
    chat_template: bool = True
    description: str = ""
    sources: dict = field(default_factory=dict)
    mmproj: dict = field(default_factory=dict)  # the vision projector (module docstring), {} = text only

    @property
    def quants(self) -> list[str]:
        return [q for q in self.sources if q != "mlx"]


def catalog_path() -> Path:
    """models.toml: at the top of a source checkout, or shipped inside ``localrun/model/`` when installed."""
    here = Path(__file__).resolve().parent  # localrun/model
    for cand in (here.parent.parent / "models.toml", here / "models.toml"):
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


# --- quantization names and sizes ---------------------------------------------------------------

# Average bits per weight of a whole GGUF file of each llama.cpp file type (mixed tensor types included),
# from llama.cpp's tools/quantize/quantize.cpp QUANT_OPTIONS table (the "+x.xx ppl @ y.yy bpw" notes),
# rounded. Used only to estimate a download before the hub reports the real size.
QUANT_BPW: dict[str, float] = {
    "IQ1_S": 1.56, "IQ1_M": 1.75, "IQ2_XXS": 2.06, "IQ2_XS": 2.31, "IQ2_S": 2.5, "IQ2_M": 2.7,
    "Q2_K": 2.96, "Q2_K_L": 3.2, "IQ3_XXS": 3.06, "IQ3_XS": 3.3, "IQ3_S": 3.44, "IQ3_M": 3.66,
    "Q3_K_S": 3.41, "Q3_K_M": 3.74, "Q3_K_L": 4.03, "Q3_K_XL": 4.1, "IQ4_XS": 4.25, "IQ4_NL": 4.5,
    "Q4_0": 4.55, "Q4_1": 5.0, "Q4_K_S": 4.58, "Q4_K_M": 4.89, "Q4_K_L": 5.1, "Q4_K_XL": 5.0,
    "MXFP4": 4.25, "MXFP4_MOE": 4.25, "Q5_0": 5.5, "Q5_1": 6.0, "Q5_K_S": 5.54, "Q5_K_M": 5.69,
    "Q5_K_L": 5.9, "Q6_K": 6.56, "Q6_K_L": 6.8, "Q8_0": 8.5, "F16": 16.0, "BF16": 16.0, "F32": 32.0,
}
UNQUANTIZED = frozenset({"F16", "BF16", "F32"})

# longest names first so "Q4_K_M" wins over "Q4_K" and "IQ4_XS" over "Q4_X…"
_QUANT_NAMES = sorted(QUANT_BPW, key=len, reverse=True)


def quant_from_filename(filename: str) -> str | None:
    """The quantization named in a GGUF file name (``Qwen3-8B-Q4_K_M.gguf`` → ``Q4_K_M``), or None.

    Case-insensitive; the name must stand alone (delimited by ``-``, ``_``, ``.`` or the ends).
    """
    import re

    stem = filename.rsplit("/", 1)[-1]
    up = stem.upper()
    for q in _QUANT_NAMES:
        for m in re.finditer(re.escape(q), up):
            before = up[m.start() - 1] if m.start() > 0 else "-"
            after = up[m.end()] if m.end() < len(up) else "."
            if before in "-_." and after in "-_.":
                return q
    return None


def normalize_quant(quant: str) -> str:
    """``q4_k_m`` → ``Q4_K_M`` (the spelling llama.cpp and the catalog use)."""
    return quant.strip().upper().replace("-", "_")


def estimate_file_bytes(entry: CatalogEntry, quant: str) -> int:
    """GGUF size of ``entry`` at ``quant``: the published size when the catalog has one (``file_bytes``), else
    params_total × bits-per-weight / 8 (QUANT_BPW)."""
    q = normalize_quant(quant)
    if q in entry.file_bytes:
        return int(entry.file_bytes[q])
    bpw = QUANT_BPW.get(q, 8.5)
    return int(entry.params_total * bpw / 8)
