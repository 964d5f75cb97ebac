"""models.toml: schema, unique names, parameter counts consistent with the dimensions, and with real GGUFs."""

from __future__ import annotations

import re
import tomllib

import pytest

from localrun.model.catalog import QUANT_BPW, CatalogEntry, catalog_path, get_entry, load_catalog, quant_from_filename

REQUIRED = ("name", "family", "arch", "params_total", "params_active", "n_layer", "n_embd", "n_ff", "n_head",
            "n_head_kv", "head_dim", "vocab_size", "n_ctx_train", "license", "sources")


def expected_params(e: CatalogEntry) -> tuple[int, int]:
    """(total, active) parameters from the dimensions: embeddings (+ untied output) + per layer
    attention (q, k, v, o) + FFN (gate, up, down; MoE: n_expert of them + router) + norms.

    The tensor list per architecture is llama.cpp's src/llama-arch.cpp LLM_TENSOR_NAMES; biases and
    sinks (qwen2 q/k/v bias, gpt-oss attention biases) are the small terms the tolerance absorbs.
    """
    d, hd = e.n_embd, e.head_dim
    emb = e.vocab_size * d * (1 if e.tie_embeddings else 2)
    attn = d * e.n_head * hd * 2 + d * e.n_head_kv * hd * 2
    norms = 2 * d + (2 * d if e.arch == "gemma3" else 0) + (2 * hd if e.arch in ("qwen3", "qwen3moe", "gemma3") else 0)
    if e.arch == "qwen2":
        attn += (e.n_head + 2 * e.n_head_kv) * hd  # q/k/v biases
    if e.n_expert:
        expert = 3 * d * e.n_ff_exp
        ffn_total = e.n_expert * expert + d * e.n_expert
        ffn_active = e.n_expert_used * expert + d * e.n_expert
    else:
        ffn_total = ffn_active = 3 * d * e.n_ff
    total = emb + e.n_layer * (attn + ffn_total + norms) + d
    active = total - e.n_layer * (ffn_total - ffn_active)
    if e.family == "gpt-oss":
        active -= e.vocab_size * d  # OpenAI's model card counts active parameters without the embedding table
    return total, active


def test_schema_and_unique_names():
    raw = tomllib.loads(catalog_path().read_text())["model"]
    names = [m["name"] for m in raw]
    assert len(names) == len(set(names)) >= 30
    for m in raw:
        missing = [k for k in REQUIRED if k not in m]
        assert not missing, (m["name"], missing)
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", m["name"]), m["name"]
    for e in load_catalog():
        assert e.params_active <= e.params_total
        assert e.n_head % e.n_head_kv == 0, e.name  # GQA groups
        assert (e.n_expert == 0) == (e.n_expert_used == 0 == e.n_ff_exp), e.name
        assert e.sliding_window == 0 or e.swa_pattern >= 2, e.name
        assert e.n_ctx_train >= 2048 and e.license and e.quants, e.name
        for q, src in e.sources.items():
            if q == "mlx":
                assert re.fullmatch(r"[\w.\-]+/[\w.\-]+", src["repo"]), (e.name, src)
                continue
            assert q in QUANT_BPW, (e.name, q)
            assert re.fullmatch(r"[\w.\-]+/[\w.\-]+", src["repo"]) and src["file"].endswith(".gguf"), (e.name, src)
            # the file name says the quantization it is listed under
            assert quant_from_filename(src["file"]) == q, (e.name, q, src["file"])


def test_files_unique_across_catalog():
    seen = set()
    for e in load_catalog():
        for q, src in e.sources.items():
            key = (src["repo"], src.get("file"))
            assert key not in seen, (e.name, q, key)
            seen.add(key)


@pytest.mark.parametrize("entry", load_catalog(), ids=lambda e: e.name)
def test_params_consistent_with_dimensions(entry):
    from localrun.model.synthetic_hybrid import HYBRID_ARCHS

    if entry.arch in HYBRID_ARCHS:  # counted from their layouts; held against the model cards in test_catalog_hybrids
        pytest.skip("hybrid / Gemma-4 layout: tests/test_catalog_hybrids.py")
    total, active = expected_params(entry)
    assert entry.params_total == pytest.approx(total, rel=0.02), (entry.name, total)
    assert entry.params_active == pytest.approx(active, rel=0.05), (entry.name, active)


def test_get_entry():
    assert get_entry("QWEN3-8B:Q4_K_M").name == "qwen3-8b"
    assert get_entry("nope") is None


def test_quant_from_filename():
    assert quant_from_filename("Qwen3-8B-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_from_filename("smollm2-135m-instruct-q4_1.gguf") == "Q4_1"
    assert quant_from_filename("gpt-oss-20b-mxfp4.gguf") == "MXFP4"
    assert quant_from_filename("x/Llama-3.3-70B-Instruct-IQ4_XS.gguf") == "IQ4_XS"
    assert quant_from_filename("model.gguf") is None


@pytest.mark.parametrize("fixture,name", [  # the packaged models' files: `model` as conftest marks their fixtures
    pytest.param("smollm_path", "smollm2-135m-instruct", marks=pytest.mark.model),
    pytest.param("gemma_path", "gemma-3-270m", marks=pytest.mark.model),
    ("deepseek_header_path", "deepseek-r1-distill-qwen-7b")])
def test_catalog_matches_gguf_header(request, fixture, name):
    from localrun.model.gguf_info import read_gguf

    spec = read_gguf(request.getfixturevalue(fixture))
    e = get_entry(name)
    assert e.params_total == spec.n_params
    assert (e.arch, e.n_layer, e.n_embd, e.n_ff, e.n_head, e.n_head_kv, e.head_dim, e.vocab_size) == (
        spec.arch, spec.n_layer, spec.n_embd, spec.n_ff, spec.n_head, spec.n_head_kv, spec.head_dim_k,
        spec.vocab_size)
    assert e.n_ctx_train == spec.n_ctx_train and e.sliding_window == spec.sliding_window
    assert e.tie_embeddings == (spec.tensor("output.weight") is None)
    assert e.chat_template == bool(spec.chat_template)


MULTIMODAL = {  # entry → (projector repo, file, bytes): the files on the hub (ggml-org's conversions)
    "gemma-3-4b-it": ("ggml-org/gemma-3-4b-it-GGUF", "mmproj-model-f16.gguf", 851251104),
    "gemma-3-12b-it": ("ggml-org/gemma-3-12b-it-GGUF", "mmproj-model-f16.gguf", 854200224),
    "gemma-3-27b-it": ("ggml-org/gemma-3-27b-it-GGUF", "mmproj-model-f16.gguf", 857739168),
    "qwen2.5-vl-3b-instruct": ("ggml-org/Qwen2.5-VL-3B-Instruct-GGUF", "mmproj-Qwen2.5-VL-3B-Instruct-Q8_0.gguf",
                               844757728),
    "qwen2.5-vl-7b-instruct": ("ggml-org/Qwen2.5-VL-7B-Instruct-GGUF", "mmproj-Qwen2.5-VL-7B-Instruct-Q8_0.gguf",
                               853119712),
    "smolvlm-500m-instruct": ("ggml-org/SmolVLM-500M-Instruct-GGUF", "mmproj-SmolVLM-500M-Instruct-Q8_0.gguf",
                              108783360),
}
IMAGE_TOKENS = {"gemma3": 256, "idefics3": 64}  # (896 / 14 / 4)², (512 / 16 / 4)²: clip_n_output_tokens


def test_multimodal_entries_name_their_projector():
    """Each multimodal entry names its projector file (mmproj-*.gguf: what the loader finds beside the model),
    its size, and either the vision dimensions the planner needs or why localrun refuses its images (M-RoPE)."""
    from localrun.offload.vision import MROPE, vision_from_catalog

    have = {e.name: e for e in load_catalog() if e.mmproj}
    assert set(have) == set(MULTIMODAL)
    vision_keys = {"image_size", "patch_size", "n_embd", "n_ff", "n_head", "n_merge"}
    for name, e in have.items():
        mm = e.mmproj
        assert (mm["repo"], mm["file"], mm["bytes"]) == MULTIMODAL[name]
        assert mm["file"].startswith("mmproj") and mm["file"].endswith(".gguf")
        assert set(mm) <= {"repo", "file", "bytes", "projector", "refused"} | vision_keys, name
        assert bool(mm.get("refused")) == (mm["projector"] in MROPE), name  # refused exactly for M-RoPE
        if mm.get("refused"):
            assert "M-RoPE" in mm["refused"] and "M-RoPE" in e.description, name
            continue
        assert vision_keys <= set(mm), name
        v = vision_from_catalog(mm, e.n_embd)
        assert v.image_tokens == IMAGE_TOKENS[mm["projector"]] and v.n_embd_text == e.n_embd
    assert all("vision projector not included" not in e.description for e in load_catalog())
