"""`localrun chat --backend mlx` and `localrun serve --backend mlx` on the real SmolLM2 GGUF through mlx[cpu]:
the same smoke tests as the llama.cpp ones (tests/test_chat_tty.py, tests/test_server.py).

On MLX the server batches requests (``mlx/batch.py MlxBatchEngine``: 8 slots here, continuous batching), so
concurrent greedy requests must each get exactly their solo answer while sharing forward passes; a cancelled
stream frees its row for a queued request; past the slots and the queue the server answers 503.
The in-process server's engine is loaded once for the module (an MLX load takes seconds on this box);
the chat tests and the CLI serve test load their own in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from helpers import ServerThread, drive_chat_session, metric_value, parse_labels, stream_and_full

pytestmark = pytest.mark.model  # every test here loads a real model

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

N_CTX = 1024
N_PARALLEL = 8
SYSTEM = "You are a helpful assistant."


def _env(home) -> dict:
    env = dict(os.environ, LOCALRUN_HOME=str(home), TERM="xterm", COLUMNS="120", LINES="40",
               PROMPT_TOOLKIT_NO_CPR="1")  # pexpect never answers a cursor-position request
    for k in ("LOCALRUN_MODELS", "LOCALRUN_API_KEY", "LOCALRUN_BACKEND", "LOCALRUN_PORT", "LOCALRUN_HOST"):
        env.pop(k, None)
    return env


# ------------------------------------------------------------------ chat
def test_one_shot_chat_answers_tokyo(smollm_path, isolated_home):
    r = subprocess.run([sys.executable, "-m", "localrun", "chat", str(smollm_path), "--backend", "mlx", "--temp", "0",
                        "-n", "24"], input="What is the capital of Japan?\n", capture_output=True, text=True,
                       env=_env(isolated_home), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Tokyo" in r.stdout
    assert "Traceback" not in r.stderr


def test_interactive_chat_session(smollm_path, isolated_home):
    """tests/test_chat_tty.py's session, on MLX: an answer, a slash command, Ctrl-C mid-answer, another
    answered question, /exit."""
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(sys.executable, ["-m", "localrun", "chat", str(smollm_path), "--backend", "mlx",
                                           "--temperature", "0"],
                          env=_env(isolated_home), encoding="utf-8", timeout=180, dimensions=(40, 120))
    try:
        drive_chat_session(child, expect_cached=True)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


# ------------------------------------------------------------------ serve, in process
@pytest.fixture(scope="module")
def mlx_server(smollm_path, tmp_path_factory):
    """`serve --backend mlx`'s loading path (load_for_serving → MlxBatchEngine, 8 slots, 1 queue place) behind
    a real uvicorn; ``state`` is the app's ServerState (its batch engine and scheduler)."""
    from localrun.commands.serve import load_for_serving
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    home = tmp_path_factory.mktemp("mlx_serve_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALRUN_HOME", str(home))
        settings = Settings(home=home, models_dir=home / "models")
        engine, plan, hw = load_for_serving(str(smollm_path), settings, parallel=N_PARALLEL, ctx=N_CTX, threads=1,
                                            force=False, chat_template=None, backend="mlx")
        app = create_app(engine, settings, ServeOptions(plan=plan, hardware=hw, max_queue=1))
        srv = ServerThread(app)
        srv.engine = engine
        srv.state = app.state.localrun
        yield srv
        srv.stop()
        engine.close()


@pytest.fixture(scope="module")
def client(mlx_server):
    return openai.OpenAI(base_url=mlx_server.url + "/v1", api_key="none", timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def http(mlx_server):
    with httpx.Client(base_url=mlx_server.url, timeout=300) as c:
        yield c


def metric(http, name: str, labels: str = "") -> float:
    return metric_value(http.get("/metrics").text, name, **parse_labels(labels))


def chat(client, content: str, **kw) -> str:
    r = client.chat.completions.create(model="smollm", temperature=0, **kw, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": content}])
    return r.choices[0].message.content


def test_engine_batches(mlx_server, http):
    eng = mlx_server.state.engine
    assert eng.backend == "mlx" and eng.n_parallel == N_PARALLEL and eng.n_ctx == N_CTX and not eng.serial
    assert http.get("/health").json()["n_parallel"] == N_PARALLEL
    ps = http.get("/api/ps").json()["models"][0]["localrun"]
    assert ps["backend"] == "mlx" and ps["serving"] == f"mlx, {N_PARALLEL} parallel sequences"
    assert ps["plan"]["n_parallel"] == N_PARALLEL and ps["plan"]["backend"] == "mlx"


def test_tokyo_and_streaming_equals_non_streaming(client):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of Japan?"}]
    full, usage = stream_and_full(client, msgs, 16)
    assert "Tokyo" in full.choices[0].message.content
    # the second run of the same prompt reused the first's KV (MLX's own prompt cache)
    assert usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 1


def stream_chat(client, content: str, max_tokens: int) -> str:
    parts = []
    for ch in client.chat.completions.create(model="smollm", temperature=0, max_tokens=max_tokens, stream=True,
                                             messages=[{"role": "system", "content": SYSTEM},
                                                       {"role": "user", "content": content}]):
        parts += [c.delta.content or "" for c in ch.choices]
    return "".join(parts)


def test_eight_concurrent_streams_match_solo_and_share_forward_passes(mlx_server, client, http):
    prompts = [f"Write one sentence about the number {n}." for n in (3, 7, 12, 25)] + [
        "Hi.", "Name a fruit.", "What colour is the sky on a clear day? Answer in one word, please.", "Count: 1, 2,"]
    solo = [stream_chat(client, p, 4) for p in prompts]
    eng = mlx_server.state.engine
    widths: list[int] = []
    step = eng.step

    def counted(gens):  # an observer: how many rows each decode step carried
        out = step(gens)
        widths.append(len(out))
        return out

    eng.step = counted
    try:
        with ThreadPoolExecutor(len(prompts)) as ex:
            together = list(ex.map(lambda p: stream_chat(client, p, 4), prompts))
    finally:
        del eng.step
    assert together == solo
    print("rows per step:", widths)
    assert max(widths) >= 2  # several streams decoded in one forward pass
    assert metric(http, "localrun_active_sequences") == 0


def test_cancelled_stream_frees_its_row_and_the_queue_is_bounded(mlx_server, http):
    """8 streams run (every slot), a 9th waits in the one queue place, a 10th is refused with 503; closing one
    running stream frees its row and the queued one starts while the other 7 keep running."""
    from contextlib import ExitStack

    body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 300, "temperature": 0, "stream": True,
            "logit_bias": {"0": -100, "1": -100, "2": -100}}  # no EOS: each runs until it is closed
    before = metric(http, "localrun_generations_total", '{finish_reason="cancelled"}')

    def first_data(lines) -> str:
        return next(ln for ln in lines if ln.startswith("data: "))

    with httpx.Client(base_url=mlx_server.url, timeout=300) as c, ExitStack() as stack:
        running = []
        for _ in range(N_PARALLEL):
            r = stack.enter_context(c.stream("POST", "/v1/completions", json=body))
            assert r.status_code == 200
            lines = r.iter_lines()  # kept: a dropped line iterator closes its stream
            first_data(lines)
            running.append((r, lines))
        got: list[str] = []

        def queued() -> None:  # answered (headers and first token) once a row is free
            with httpx.Client(base_url=mlx_server.url, timeout=300) as q, q.stream("POST", "/v1/completions",
                                                                                   json=body) as r:
                got.append(first_data(r.iter_lines()))

        waiter = threading.Thread(target=queued, daemon=True)
        waiter.start()
        while metric(http, "localrun_queue_depth") < 1:  # it holds the one queue place
            assert waiter.is_alive()
        refused = c.post("/v1/completions", json=dict(body, stream=False))
        assert refused.status_code == 503
        running[0][0].close()  # the client goes away: its row is freed, the queued request takes it
        waiter.join(300)
        assert got and http.get("/health").json()["active_sequences"] <= N_PARALLEL
    deadline = time.monotonic() + 120
    while http.get("/health").json()["active_sequences"] or \
            metric(http, "localrun_generations_total", '{finish_reason="cancelled"}') < before + N_PARALLEL + 1:
        assert time.monotonic() < deadline, "closed streams were never cancelled"
    assert mlx_server.state.engine.rows == []


def test_disconnect_after_first_chunk_leaves_server_serving(mlx_server, client, http):
    before = metric(http, "localrun_generations_total", '{finish_reason="cancelled"}')
    body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 300, "temperature": 0, "stream": True,
            "logit_bias": {"0": -100, "1": -100, "2": -100}}  # no EOS: it would run on without the cancel
    with httpx.Client(base_url=mlx_server.url, timeout=300) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break
    deadline = time.monotonic() + 120
    while metric(http, "localrun_generations_total", '{finish_reason="cancelled"}') < before + 1:
        assert time.monotonic() < deadline, "the disconnected stream was never cancelled"
        time.sleep(0.2)
    assert http.get("/health").json()["active_sequences"] == 0
    assert "Tokyo" in chat(client, "What is the capital of Japan?", max_tokens=16)  # still serving


def test_ollama_chat_endpoint(http):
    body = {"model": "smollm2", "messages": [{"role": "system", "content": SYSTEM},
                                             {"role": "user", "content": "What is the capital of Japan?"}],
            "stream": False, "options": {"temperature": 0, "num_predict": 16}}
    r = http.post("/api/chat", json=body).json()
    assert r["done"] is True and r["message"]["role"] == "assistant" and "Tokyo" in r["message"]["content"]
    assert r["eval_count"] > 0
    with http.stream("POST", "/api/chat", content=json.dumps(dict(body, stream=True))) as s:
        lines = [json.loads(ln) for ln in s.iter_lines() if ln]
    assert lines[-1]["done"] is True and all(ln["done"] is False for ln in lines[:-1])
    assert "".join(ln["message"]["content"] for ln in lines) == r["message"]["content"]


def test_embeddings_and_constraints_on_mlx(client):
    e = client.embeddings.create(model="x", input=["a cat", "a dog"])  # mlx/embed.py (issue 27)
    assert [len(d.embedding) for d in e.data] == [576, 576] and e.usage.prompt_tokens > 0
    assert abs(sum(v * v for v in e.data[0].embedding) - 1) < 1e-3
    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["age"], "additionalProperties": False}
    r = client.chat.completions.create(  # constrained decoding runs on MLX too (llguidance, issue 14)
        model="x", temperature=0, max_tokens=30, messages=[{"role": "user", "content": "An age as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content)["age"], int)
    assert "Tokyo" in chat(client, "What is the capital of Japan?", max_tokens=16)  # still serving


# ------------------------------------------------------------------ serve, the real command
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_command_with_backend_mlx(smollm_path, isolated_home):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "localrun", "serve", str(smollm_path), "--backend", "mlx",
                             "--port", str(port), "--ctx", "512", "--parallel", "1", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(isolated_home))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        ps = httpx.get(url + "/api/ps", timeout=30).json()["models"][0]["localrun"]
        assert ps["serving"] == "mlx, requests served one at a time" and ps["n_ctx"] == 512
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=300, max_retries=0)
        assert "Tokyo" in chat(c, "What is the capital of Japan?", max_tokens=16)
        # KV tiers on MLX (--cache-ram auto): a conversation that comes back after another client's prompt
        # took the one slot restores its prefix from the RAM tier instead of prefilling it
        # ≈ 100 tokens with the template: over the tiers' 32-token minimum, and cheap to prefill
        doc = " ".join(f"Fact {i}: the river number {i} flows into lake number {i + 1}." for i in range(5))

        def ask(question: str) -> None:
            c.chat.completions.create(model="smollm", temperature=0, max_tokens=2, messages=[
                {"role": "system", "content": doc}, {"role": "user", "content": question}])

        ask("Which lake does river 3 flow into?")
        chat(c, "Say hello.", max_tokens=2)  # another prompt takes the slot: the first one's KV goes to RAM
        ask("Which lake does river 5 flow into?")
        metrics = httpx.get(url + "/metrics", timeout=30).text
        assert metric_value(metrics, "localrun_kv_tier_hits_total", tier="ram") >= 1, metrics
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        reader.join(10)
    out = "".join(lines)
    assert "mlx, requests served one at a time" in out  # the start-up line (--parallel 1)
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "terminate called" not in out


# ------------------------------------------------------------------ serve an MLX folder
def test_ollama_routes_describe_an_mlx_folder(smollm_path, tmp_path, isolated_home):
    """An MLX folder has no GGUF header: /api/tags, /api/show and /api/ps describe it from config.json."""
    from localrun.backends.mlx.gguf import write_mlx_folder
    from localrun.commands.serve import load_for_serving
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    folder = write_mlx_folder(str(smollm_path), tmp_path / "smollm-mlx")
    settings = Settings(home=isolated_home, models_dir=isolated_home / "models")
    engine, plan, hw = load_for_serving(str(folder), settings, parallel=1, ctx=512, threads=1, force=False,
                                        chat_template=None, backend="mlx")
    srv = ServerThread(create_app(engine, settings, ServeOptions(plan=plan, hardware=hw)))
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as h:
            tag = h.get("/api/tags").json()["models"][0]
            assert tag["details"]["format"] == "mlx" and tag["details"]["family"] == "llama"
            assert tag["size"] == sum(f.stat().st_size for f in folder.glob("*.safetensors")) > 0
            show = h.post("/api/show", json={"model": tag["name"]})
            assert show.status_code == 200, show.text
            info = show.json()["model_info"]
            assert info["llama.block_count"] == 30 and info["llama.embedding_length"] == 576
            assert info["llama.attention.head_count_kv"] == 3
            ps = h.get("/api/ps")
            assert ps.status_code == 200 and ps.json()["models"][0]["size"] > 0
            r = h.post("/api/generate", json={"model": tag["name"], "prompt": "The capital of France is",
                                              "raw": True, "stream": False, "options": {"num_predict": 4}})
            assert r.status_code == 200 and r.json()["done"] is True
    finally:
        srv.stop()
        engine.close()
