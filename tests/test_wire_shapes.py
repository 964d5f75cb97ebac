"""What web apps on a local runner (Open WebUI and its kind) and RAG stacks call, checked field by field against
the shapes of Ollama (``api/types.go``: ``ListModelResponse``, ``ShowResponse``, ``ChatResponse``, ``Message``,
``ModelDetails``), OpenAI (the ``openai`` SDK's ``Model``, ``ChatCompletionChunk``; the API reference's
``stream_options.include_usage``) and llama-server (``tools/server/README.md``: ``/tokenize``,
``/detokenize``, ``/apply-template``, ``/v1/rerank``) — issue 27 items 5, 6 and 7.

A live server (uvicorn in a thread) with no model at start, as ``localrun serve`` runs: SmolLM2 (ChatML, no
tool syntax), Gemma-3 base (no template) and the DeepSeek-R1 header (shown, never loaded) are named by path.
``think`` runs on a second server: SmolLM2 with QwQ's chat template (it thinks; tests/test_reasoning_server.py).
The protocol is judged, not the answers."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from helpers import ServerThread

pytestmark = pytest.mark.model  # loads real models

openai = pytest.importorskip("openai")

N_CTX = 1024
TEMPLATES = Path(__file__).parent / "data" / "templates"

# Ollama api/types.go: field → JSON type (time.Time is an RFC 3339 string)
LIST_MODEL = {"name": str, "model": str, "modified_at": str, "size": int, "digest": str, "details": dict}
MODEL_DETAILS = {"parent_model": str, "format": str, "family": str, "families": list, "parameter_size": str,
                 "quantization_level": str}
SHOW = {"license": str, "modelfile": str, "parameters": str, "template": str, "details": dict, "model_info": dict,
        "capabilities": list, "modified_at": str}
CHAT_LINE = {"model": str, "created_at": str, "message": dict, "done": bool}
CHAT_DONE = {**CHAT_LINE, "done_reason": str, "total_duration": int, "load_duration": int,
             "prompt_eval_count": int, "prompt_eval_duration": int, "eval_count": int, "eval_duration": int}
OLLAMA_CAPABILITIES = {"completion", "tools", "insert", "vision", "embedding", "thinking"}


def has_fields(obj: dict, fields: dict) -> None:
    for k, t in fields.items():
        assert k in obj, f"{k!r} missing from {sorted(obj)}"
        assert isinstance(obj[k], t) and not (t is int and isinstance(obj[k], bool)), (k, obj[k])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from localrun.commands.serve import make_registry
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    home = tmp_path_factory.mktemp("shapes_home")
    settings = Settings(home=home, models_dir=home / "models")
    opts = ServeOptions()
    reg = make_registry(settings, opts, parallel=2, ctx=N_CTX, threads=1)
    srv = ServerThread(create_app(None, settings, opts, registry=reg))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def think_http(smollm_path, tmp_path_factory):
    from localrun.backends import load_engine
    from localrun.config import Settings
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = simple_plan(read_gguf(smollm_path), n_ctx=N_CTX, n_parallel=1)
    plan.n_threads = plan.n_threads_batch = 1
    engine = load_engine(smollm_path, plan, chat_template=(TEMPLATES / "Qwen-QwQ-32B.jinja").read_text())
    home = tmp_path_factory.mktemp("think_home")
    srv = ServerThread(create_app(engine, Settings(home=home, models_dir=home / "models"),
                                  ServeOptions(plan=plan, reasoning_budget=6)))
    with httpx.Client(base_url=srv.url, timeout=300) as c:
        yield c
    srv.stop()
    engine.close()


def smol_caps() -> list[str]:
    """SmolLM2's capabilities on a server with the default options: ChatML has no tool syntax, so ``tools``
    only where the server offers its generic tool format (``ServeOptions.generic_tools``)."""
    from localrun.server.runtime import ServeOptions

    return ["completion"] + (["tools"] if ServeOptions().generic_tools else [])


def chat_body(model, **kw) -> dict:
    return {"model": str(model), "messages": [{"role": "user", "content": "Say hi."}], "stream": False,
            "options": {"temperature": 0, "num_predict": 6}, **kw}


# ---------------------------------------------------------------------------------------------- item 5
def test_api_show_capabilities_loaded_or_not(http, smollm_path, gemma_path, deepseek_header_path):
    """``/api/show`` carries Ollama's ``capabilities``, the same before and after the model loads; the
    DeepSeek-R1 header (tensor data cut short: never loadable) is shown from its header and thinks."""
    before = http.post("/api/show", json={"model": str(smollm_path)})
    assert before.status_code == 200, before.text
    has_fields(before.json(), SHOW)
    assert before.json()["capabilities"] == smol_caps()
    assert http.post("/api/chat", json=chat_body(smollm_path)).status_code == 200  # loads it
    after = http.post("/api/show", json={"model": str(smollm_path)}).json()
    has_fields(after, SHOW)
    has_fields(after["details"], MODEL_DETAILS)
    assert after["capabilities"] == before.json()["capabilities"]
    ds = http.post("/api/show", json={"model": str(deepseek_header_path)}).json()
    assert ds["capabilities"] == ["completion"] + smol_caps()[1:] + ["thinking"]
    gm = http.post("/api/show", json={"model": str(gemma_path)}).json()
    assert gm["capabilities"] == ["completion"] and gm["template"] == ""
    for caps in (after["capabilities"], ds["capabilities"], gm["capabilities"]):
        assert set(caps) <= OLLAMA_CAPABILITIES


def test_v1_models_meta_says_the_same(http, server, smollm_path):
    """``/v1/models``: OpenAI's model object (the SDK parses it), llama-server's ``meta`` with the model facts
    and the capabilities ``/api/show`` gives."""
    http.post("/api/chat", json=chat_body(smollm_path))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    page = client.models.list()
    assert page.data and all(m.object == "model" and isinstance(m.created, int) and m.owned_by for m in page.data)
    raw = http.get("/v1/models").json()
    assert raw["object"] == "list"
    for entry in raw["data"]:
        meta = entry["meta"]
        assert set(meta["capabilities"]) <= OLLAMA_CAPABILITIES
        for k in ("n_params", "n_ctx_train", "n_embd", "n_vocab", "size"):
            assert isinstance(meta[k], int) and meta[k] > 0, k
        assert set(meta) >= {"family", "thinking", "tool_calls", "vision", "embedding", "reranker", "loaded"}
        show = http.post("/api/show", json={"model": entry["id"]}).json()
        assert show["capabilities"] == meta["capabilities"], entry["id"]
    smol = next(e for e in raw["data"] if e["meta"]["path"] == str(smollm_path))
    assert smol["meta"]["loaded"] and smol["meta"]["family"] == "plain" and smol["meta"]["thinking"] is None
    assert smol["meta"]["capabilities"] == smol_caps()
    assert smol["meta"]["tool_calls"] == ("generic" if "tools" in smol_caps() else None)
    assert client.models.retrieve(smol["id"]).id == smol["id"]


# ---------------------------------------------------------------------------------------------- item 7
def test_api_tags_entries_are_ollama_list_models(http, smollm_path):
    http.post("/api/chat", json=chat_body(smollm_path))
    models = http.get("/api/tags").json()["models"]
    assert models
    for m in models:
        has_fields(m, LIST_MODEL)
        has_fields(m["details"], MODEL_DETAILS)
        assert m["modified_at"].endswith("Z") and "T" in m["modified_at"]


def test_api_chat_think_shapes(think_http, http, smollm_path):
    """``think``: the final non-streamed message carries ``thinking`` beside ``content``; streamed lines carry
    pieces of either; ``think: false`` leaves ``thinking`` out; a model that does not think answers 400 with
    Ollama's ``{"error": str}``."""
    body = {"messages": [{"role": "user", "content": "Write a story about a cat."}], "think": True,
            "stream": False, "options": {"temperature": 0, "num_predict": 16}}
    r = think_http.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    d = r.json()
    has_fields(d, CHAT_DONE)
    assert d["done"] is True and d["message"]["role"] == "assistant"
    assert isinstance(d["message"]["thinking"], str) and d["message"]["thinking"]
    assert "</think>" not in d["message"]["content"]
    with think_http.stream("POST", "/api/chat", json=dict(body, stream=True)) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(ln) for ln in s.iter_lines() if ln]
    for ln in lines[:-1]:
        has_fields(ln, CHAT_LINE)
        assert ln["done"] is False and set(ln["message"]) <= {"role", "content", "thinking", "tool_calls"}
    has_fields(lines[-1], CHAT_DONE)
    assert "".join(ln["message"].get("thinking", "") for ln in lines) == d["message"]["thinking"]
    off = think_http.post("/api/chat", json=dict(body, think=False)).json()
    assert "thinking" not in off["message"]
    no = http.post("/api/chat", json=chat_body(smollm_path, think=True))
    assert no.status_code == 400 and isinstance(no.json()["error"], str) and "thinking" in no.json()["error"]


def test_api_chat_format_schema(http, smollm_path):
    """Title/tag generation sends ``format`` as a JSON Schema: the content parses and validates."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40}},
              "required": ["title"]}
    body = chat_body(smollm_path, format=schema, options={"temperature": 0, "num_predict": 60})
    body["messages"] = [{"role": "user", "content": "Give this chat a title as JSON: 'how do cats purr'"}]
    r = http.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    d = r.json()
    has_fields(d, CHAT_DONE)
    jsonschema.validate(json.loads(d["message"]["content"]), schema)
    bad = http.post("/api/chat", json=dict(body, format={"type": "object", "properties": 5}))
    assert bad.status_code == 400 and isinstance(bad.json()["error"], str)


def _sse(http, body) -> list:
    with http.stream("POST", "/v1/chat/completions", json=body) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        events = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_streamed_chat_with_include_usage_is_openai_shaped(http, server, smollm_path):
    """OpenAI: with ``stream_options.include_usage`` every chunk carries ``usage: null`` but the last, which
    has ``choices: []`` and the usage; without it no chunk has ``usage``. The SDK parses each chunk."""
    from openai.types.chat import ChatCompletionChunk

    body = {"model": str(smollm_path), "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    chunks = _sse(http, body)
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
        assert c["object"] == "chat.completion.chunk" and "usage" in c
    *body_chunks, last = chunks
    assert all(c["usage"] is None and len(c["choices"]) == 1 for c in body_chunks)
    assert body_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert body_chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
    plain = _sse(http, {k: v for k, v in body.items() if k != "stream_options"})
    assert all("usage" not in c for c in plain)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    got = list(client.chat.completions.create(stream=True, **{k: v for k, v in body.items() if k != "stream"}))
    assert got[-1].usage is not None and all(c.usage is None for c in got[:-1])


# ---------------------------------------------------------------------------------------------- item 6
def test_tokenize_detokenize_round_trip(http, smollm_path):
    m = str(smollm_path)
    text = "Hello <|im_end|> wörld 🦙"
    r = http.post("/tokenize", json={"model": m, "content": text})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    assert ids and all(isinstance(t, int) for t in ids)
    assert 2 in ids  # parse_special defaults to true (llama-server): <|im_end|> is one control token
    plain = http.post("/tokenize", json={"model": m, "content": text, "parse_special": False}).json()["tokens"]
    assert 2 not in plain and len(plain) > len(ids)
    assert http.post("/detokenize", json={"model": m, "tokens": ids}).json() == {"content": text}
    pieces = http.post("/tokenize", json={"model": m, "content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    data = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert data.decode() == text  # a piece that is not UTF-8 on its own is its bytes, as llama-server sends it
    bad = http.post("/detokenize", json={"model": m, "tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert http.post("/tokenize", json={"model": m}).status_code == 400  # content is required


def test_apply_template_is_what_chat_prefills(http, smollm_path, gemma_path):
    m = str(smollm_path)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
    r = http.post("/apply-template", json={"model": m, "messages": msgs})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>") and prompt.endswith("<|im_start|>assistant\n")
    n = len(http.post("/tokenize", json={"model": m, "content": prompt}).json()["tokens"])
    c = http.post("/v1/chat/completions", json={"model": m, "messages": msgs, "max_tokens": 1}).json()
    assert c["usage"]["prompt_tokens"] == n
    g = http.post("/apply-template", json={"model": str(gemma_path), "messages": msgs})
    assert g.status_code == 400 and "chat template" in g.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/reranking", "/v1/reranking"])
def test_rerank_on_a_model_that_is_not_a_reranker(http, smollm_path, path):
    r = http.post(path, json={"model": str(smollm_path), "query": "What is a panda?",
                              "documents": ["hi", "The giant panda is a bear."], "top_n": 1})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "model" and err["code"] == "model_not_reranker"
    assert "SmolLM2" in err["message"] and "pooling" in err["message"] and "rank" in err["message"]
    assert http.post(path, json={"model": str(smollm_path), "documents": []}).status_code == 400  # no query
