"""Capabilities (issue 27 item 5): one function (``model/capabilities.py``) from the chat template and the GGUF
header, said as Ollama lists them (``server/images.go`` ``Model.Capabilities``) by ``/api/show``, in
``/v1/models``' ``meta``, and on the "capabilities" line of ``localrun show`` / ``inspect``.

The real headers: SmolLM2 (ChatML, no tool syntax), Gemma-3 base (no template), the DeepSeek-R1 header
(thinking). Synthetic headers (``gguf.GGUFWriter``) for what no installed model has: an embedding model's
and a reranker's pooling type, a vision tower."""

from __future__ import annotations

import json

import pytest

from localrun.model.capabilities import capabilities
from localrun.model.gguf_info import read_gguf


def caps_of(path):
    spec = read_gguf(path)
    return capabilities(spec, spec.chat_template)


def test_smollm2_chatml_completes_without_tools(smollm_path):
    c = caps_of(smollm_path)
    assert c.ollama() == ["completion"]
    assert (c.family, c.thinking, c.tool_calls, c.chat_template, c.embedding) == ("plain", None, None, True, False)
    assert c.line() == "completion"


def test_gemma_base_has_no_template(gemma_path):
    c = caps_of(gemma_path)
    assert c.ollama() == ["completion"] and not c.chat_template
    assert "no chat template" in c.line()


def test_deepseek_r1_header_thinks(deepseek_header_path):
    c = caps_of(deepseek_header_path)
    assert c.ollama() == ["completion", "thinking"]
    assert c.thinking == "deepseek-r1" and c.family == "deepseek-r1"
    assert c.line() == "completion, thinking (deepseek-r1)"


def test_template_overrides_and_generic_tools(smollm_path):
    """The engine's template decides (``--chat-template``), and the server's generic tool format adds
    ``tools`` to a templated model without tool syntax (never to a model without a template)."""
    from pathlib import Path

    spec = read_gguf(smollm_path)
    qwen3 = (Path(__file__).parent / "data" / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
    c = capabilities(spec, qwen3)
    assert c.ollama() == ["completion", "tools", "thinking"] and c.tool_calls == "hermes"
    g = capabilities(spec, spec.chat_template, generic_tools=True)
    assert g.ollama() == ["completion", "tools"] and g.tool_calls == "generic"
    assert capabilities(spec, None, generic_tools=True).ollama() == ["completion"]


def _header(path, *, pooling: int | None = None, vision: bool = False):
    """A small GGUF header (architecture ``bert`` or ``gemma3``) with the given pooling type / vision tower."""
    import numpy as np
    from gguf import GGUFWriter

    arch = "gemma3" if vision else "bert"
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(512)
    w.add_embedding_length(8)
    w.add_head_count(1)
    if pooling is not None:
        w.add_uint32(f"{arch}.pooling_type", pooling)
    if vision:
        w.add_uint32(f"{arch}.vision.block_count", 2)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("pooling,name,reranker", [(1, "mean", False), (2, "cls", False), (4, "rank", True)])
def test_pooling_type_makes_an_embedding_model(tmp_path, pooling, name, reranker):
    c = caps_of(_header(tmp_path / "m.gguf", pooling=pooling))
    assert c.ollama() == ["embedding"] and c.pooling == name and c.reranker is reranker
    assert not c.completion and name in c.line()


def test_vision_tower_is_reported_but_not_listed(tmp_path):
    """Ollama lists ``vision`` for ``{arch}.vision.block_count``; localrun takes no images, so the fact is
    kept (``vision_encoder``) and the list leaves ``vision`` out (a client would send images and get 400)."""
    c = caps_of(_header(tmp_path / "v.gguf", vision=True))
    assert c.vision_encoder and not c.vision and c.ollama() == ["completion"]
    assert "vision tower" in c.line()
    d = c.to_dict()
    assert d["capabilities"] == ["completion"] and d["vision_encoder"] is True
    json.dumps(d)


def test_cli_show_and_inspect_print_capabilities(deepseek_header_path, gemma_path):
    from helpers import localrun_inprocess

    r = localrun_inprocess("inspect", str(deepseek_header_path))
    assert r.returncode == 0, r.stderr
    assert "capabilities" in r.stdout and "thinking (deepseek-r1)" in r.stdout
    r = localrun_inprocess("inspect", str(deepseek_header_path), "--json")
    assert json.loads(r.stdout)["capabilities"]["capabilities"] == ["completion", "thinking"]
    r = localrun_inprocess("show", str(gemma_path), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["capabilities"]["capabilities"] == ["completion"]
    assert ["capabilities", "completion, no chat template (raw completion)"] in info["summary"]


def test_ollama_order_and_facts_without_a_header():
    """Ollama's order (completion/embedding, vision, tools, insert, thinking); no header: completion only."""
    from localrun.model.capabilities import Capabilities

    c = Capabilities(completion=True, embedding=False, tools=True, thinking="qwen3", tool_calls="hermes",
                     family="qwen3", vision=True, insert=True, chat_template=True)
    assert c.ollama() == ["completion", "vision", "tools", "insert", "thinking"]
    assert c.line() == "completion, vision, tools (hermes), insert, thinking (qwen3)"
    assert capabilities(None, None).ollama() == ["completion"]


def test_llama_server_piece_and_rerank_message():
    from types import SimpleNamespace

    from localrun.server.llamacpp_compat.routes import not_a_reranker, piece_value

    assert piece_value("é".encode()) == "é"
    assert piece_value("🦙".encode()[:2]) == list("🦙".encode()[:2])  # half a character: its bytes
    msg = not_a_reranker("smol", SimpleNamespace(arch="llama"), None)
    assert "smol is not a reranking model" in msg and "pooling_type = 4 (rank)" in msg
    msg = not_a_reranker("bge", SimpleNamespace(arch="bert"), "cls")
    assert "'cls'" in msg and "bert.pooling_type" in msg
