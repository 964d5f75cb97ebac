"""The real Ollama Python client (``ollama``, pinned in pyproject's ``test`` extra) against a live ``localrun
serve`` subprocess (issue 27): list, chat (plain and streamed), generate, show (capabilities), ps, embed,
tools, think, format, keep_alive and pull progress.

One server per module: SmolLM2 (ChatML, no tool syntax) at an 8k context, with ``HF_ENDPOINT`` pointing at a
loopback stand-in for the Hugging Face Hub (tests/test_pull_fakehub.py) so that ``/api/pull`` downloads
without a network. ``think`` needs a template that thinks: a second server runs SmolLM2 with QwQ-32B's chat
template (tests/test_reasoning_server.py does the same).

What is judged is the protocol — the status, the shapes, and that the client's own pydantic types parse every
answer (or raise its ``ResponseError``) — not what the 135M model says. No timing is asserted.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.model  # spawns `localrun serve` on a real model

ollama = pytest.importorskip("ollama")

TESTS = Path(__file__).resolve().parent.parent
QWQ_TEMPLATE = TESTS / "data" / "templates" / "Qwen-QwQ-32B.jinja"
MODEL = "smollm"
PULLED = "smollm2-135m-instruct:Q4_1"  # the catalog name test_pull.py's fake hub serves
OLLAMA_CAPABILITIES = {"completion", "tools", "insert", "vision", "embedding", "thinking"}
OPTS = {"temperature": 0, "num_predict": 8}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(home: Path, model: Path, *args: str, env: dict | None = None):
    """``localrun serve MODEL --alias smollm`` in a subprocess with its own LOCALRUN_HOME → (process, url, log)."""
    port = free_port()
    log = home / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "localrun", "serve", str(model), "--alias", MODEL,
                             "--port", str(port), "--threads", "1", *args],
                            env=dict(os.environ, LOCALRUN_HOME=str(home), **(env or {})),
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "localrun serve did not start"
        time.sleep(0.05)


def stop_serve(proc, log: Path) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


@pytest.fixture(scope="module")
def hub(smollm_path):
    from test_pull import FILE, REPO
    from test_pull_fakehub import FakeHub, sha256_file

    h = FakeHub({REPO: {FILE: smollm_path}}, shas={smollm_path: sha256_file(smollm_path)})
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(smollm_path, hub, tmp_path_factory):
    home = tmp_path_factory.mktemp("ollama_client_home")
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1", "HF_TOKEN": ""}
    proc, url, log = start_serve(home, smollm_path, "--ctx", "8192", "--parallel", "2", env=env)
    yield ollama.Client(host=url, timeout=300)
    stop_serve(proc, log)


@pytest.fixture(scope="module")
def think_client(smollm_path, tmp_path_factory):
    home = tmp_path_factory.mktemp("ollama_think_home")
    proc, url, log = start_serve(home, smollm_path, "--ctx", "2048", "--parallel", "1",
                                 "--chat-template", str(QWQ_TEMPLATE), "--reasoning-budget", "6")
    yield ollama.Client(host=url, timeout=300)
    stop_serve(proc, log)


def say_hi() -> list[dict]:
    return [{"role": "user", "content": "Say hi."}]


def test_list(client):
    r = client.list()
    assert isinstance(r, ollama.ListResponse) and r.models
    m = next(m for m in r.models if m.model == MODEL)
    assert m.size > 0 and m.digest and m.modified_at is not None
    assert m.details.format == "gguf" and m.details.quantization_level == "Q4_1"


def test_chat(client):
    r = client.chat(model=MODEL, messages=say_hi(), options=OPTS)
    assert isinstance(r, ollama.ChatResponse)
    assert r.done is True and r.done_reason in ("stop", "length") and r.model == MODEL
    assert r.message.role == "assistant" and isinstance(r.message.content, str) and r.message.content
    assert r.eval_count > 0 and r.prompt_eval_count > 0 and r.total_duration > 0
    assert r.message.thinking is None and not r.message.tool_calls


def test_chat_stream(client):
    full = client.chat(model=MODEL, messages=say_hi(), options=OPTS)
    parts = list(client.chat(model=MODEL, messages=say_hi(), options=OPTS, stream=True))
    assert len(parts) >= 2 and all(isinstance(p, ollama.ChatResponse) for p in parts)
    assert all(p.done is False for p in parts[:-1]) and parts[-1].done is True
    assert parts[-1].eval_count == full.eval_count
    assert "".join(p.message.content or "" for p in parts) == full.message.content


def test_generate(client):
    r = client.generate(model=MODEL, prompt="Why is the sky blue?", options=OPTS)
    assert isinstance(r, ollama.GenerateResponse) and r.done and r.response
    assert r.context and all(isinstance(t, int) for t in r.context)
    parts = list(client.generate(model=MODEL, prompt="Why is the sky blue?", options=OPTS, stream=True))
    assert parts[-1].done and "".join(p.response for p in parts) == r.response
    again = client.generate(model=MODEL, prompt="And the sea?", context=r.context, options=OPTS)
    assert again.done and len(again.context) > len(r.context)


def test_show_capabilities(client):
    r = client.show(MODEL)
    assert isinstance(r, ollama.ShowResponse)
    assert r.capabilities and set(r.capabilities) <= OLLAMA_CAPABILITIES and r.capabilities[0] == "completion"
    assert "thinking" not in r.capabilities  # ChatML has no thinking block
    assert r.modelinfo["general.architecture"] == "llama" and "im_start" in r.template
    assert r.details.family == "llama" and r.details.parameter_size
    with pytest.raises(ollama.ResponseError) as ei:
        client.show("no-such-model")
    assert ei.value.status_code == 404


def test_ps(client):
    client.generate(model=MODEL, prompt="Hi", options=OPTS)
    r = client.ps()
    assert isinstance(r, ollama.ProcessResponse)
    m = next(m for m in r.models if m.model == MODEL)
    assert m.size > 0 and m.expires_at is not None and m.size_vram is not None
    assert m.details.format == "gguf"


def test_embed(client):
    r = client.embed(model=MODEL, input=["a cat", "a dog"])
    assert isinstance(r, ollama.EmbedResponse) and len(r.embeddings) == 2
    assert all(len(v) == 576 for v in r.embeddings)
    assert abs(sum(x * x for x in r.embeddings[0]) - 1.0) < 1e-3  # L2-normalized
    legacy = client.embeddings(model=MODEL, prompt="a cat")
    assert max(abs(a - b) for a, b in zip(legacy.embedding, r.embeddings[0])) < 1e-5


def test_tools_get_a_well_formed_answer_or_error(client):
    """SmolLM2's template has no tool syntax: the server either answers through its generic tool format or
    refuses (``--no-generic-tools``); either way the client parses it: calls name a given tool with an
    object of arguments, or a refusal is a ``ResponseError`` 400. Which one follows ``capabilities``."""
    def get_weather(city: str) -> str:
        """Get the weather in a city.

        Args:
          city: The city's name
        """
        return "sunny"

    caps = client.show(MODEL).capabilities
    msgs = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    try:
        r = client.chat(model=MODEL, messages=msgs, tools=[get_weather], options={"temperature": 0, "num_predict": 64})
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "tools" in str(e.error)
        assert "tools" not in caps
        return
    assert "tools" in caps
    assert isinstance(r, ollama.ChatResponse) and r.done
    for call in r.message.tool_calls or []:
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    if r.message.tool_calls:  # a tool result goes back in, as the client's loop sends it
        msgs += [r.message, {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
        r2 = client.chat(model=MODEL, messages=msgs, tools=[get_weather], options=OPTS)
        assert r2.done and isinstance(r2.message.content, str)
    else:
        assert isinstance(r.message.content, str)


def test_think(think_client, client):
    r = think_client.chat(model=MODEL, messages=[{"role": "user", "content": "Write a story about a cat."}],
                          think=True, options={"temperature": 0, "num_predict": 16})
    assert r.done and isinstance(r.message.thinking, str) and r.message.thinking
    assert "</think>" not in (r.message.content or "")
    parts = list(think_client.chat(model=MODEL, messages=[{"role": "user", "content": "Write a story."}],
                                   think=True, stream=True, options={"temperature": 0, "num_predict": 16}))
    assert any(p.message.thinking for p in parts) and parts[-1].done
    assert "thinking" in think_client.show(MODEL).capabilities
    off = think_client.chat(model=MODEL, messages=say_hi(), think=False, options=OPTS)
    assert off.message.thinking is None
    with pytest.raises(ollama.ResponseError) as ei:  # SmolLM2's own ChatML does not think
        client.chat(model=MODEL, messages=say_hi(), think=True, options=OPTS)
    assert ei.value.status_code == 400 and "thinking" in str(ei.value.error)


def test_format_json_schema(client):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                               "age": {"type": "integer"}}, "required": ["name", "age"],
              "additionalProperties": False}
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Invent a person as JSON."}],
                    format=schema, options={"temperature": 0, "num_predict": 60})
    assert r.done_reason == "stop", r.message.content  # the schema closes the object
    jsonschema.validate(json.loads(r.message.content), schema)
    g = client.generate(model=MODEL, prompt="A JSON object with a key 'ok':", format="json",
                        options={"temperature": 0, "num_predict": 60})
    if g.done_reason == "stop":  # "json" is any object: a long one may be cut by num_predict
        assert isinstance(json.loads(g.response), dict)
    else:
        assert g.done_reason == "length" and g.response.lstrip().startswith("{")


def test_pull_progress_then_keep_alive_zero_unloads(client, smollm_path):
    """``pull`` streams Ollama's progress from the fake hub (first ``pulling manifest``, byte counts with a
    sha256 digest, last ``success``); the pulled model answers by its name; ``keep_alive=0`` unloads it and
    ``ps`` no longer lists it (the server's own model stays)."""
    events = list(client.pull(PULLED, stream=True))
    assert all(isinstance(e, ollama.ProgressResponse) for e in events)
    assert events[0].status == "pulling manifest" and events[-1].status == "success"
    progress = [e for e in events if e.completed is not None]
    assert progress and progress[-1].completed == progress[-1].total == smollm_path.stat().st_size
    assert all(e.digest.startswith("sha256:") for e in progress)
    assert client.pull(PULLED).status == "success"  # not streamed: the last status; already there
    assert any(m.model == PULLED for m in client.list().models)
    assert client.generate(model=PULLED, prompt="Hi", options=OPTS, keep_alive="10m").done
    assert {MODEL, PULLED} <= {m.model for m in client.ps().models}
    r = client.generate(model=PULLED, keep_alive=0)  # an empty prompt with keep_alive 0: unload
    assert r.done and r.done_reason == "unload"
    names = {m.model for m in client.ps().models}
    assert PULLED not in names and MODEL in names
    with pytest.raises(ollama.ResponseError) as ei:
        list(client.pull("no-such-model-xyz", stream=True))
    assert "no-such-model-xyz" in str(ei.value.error)
