"""`localrun serve` faults from issues 11 and 19, on SmolLM2 in a real uvicorn server (--parallel 4,
--max-queue 4): queue admission counts free slots, /metrics is current when a response ends, Ollama's
root, bodies that a strict JSON parser or UTF-8 rejects (400 naming the field, never 500), unknown fields
logged, the unknown-role value quoted, ``repeat_last_n: -1``, Ollama histories with tool calls."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest
from helpers import ServerThread, metric_value, parse_labels

pytest.importorskip("uvicorn")

N_CTX = 1024
N_PARALLEL = 4
MAX_QUEUE = 4


@pytest.fixture(scope="module")
def server(smollm_path, tmp_path_factory):
    from localrun.backends import load_engine
    from localrun.config import Settings
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = simple_plan(read_gguf(smollm_path), n_ctx=N_CTX, n_parallel=N_PARALLEL)
    plan.n_threads = plan.n_threads_batch = 1
    engine = load_engine(smollm_path, plan)
    home = tmp_path_factory.mktemp("faults_home")
    app = create_app(engine, Settings(home=home, models_dir=home / "models"),
                     ServeOptions(plan=plan, max_queue=MAX_QUEUE))
    srv = ServerThread(app)
    yield srv
    srv.stop()
    engine.close()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


def metric(http, name: str, labels: str = "") -> float:
    return metric_value(http.get("/metrics").text, name, **parse_labels(labels))


def _wait_idle(http, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        h = http.get("/health").json()
        if h["active_sequences"] == 0 and h["queued"] == 0:
            return
        assert time.monotonic() < deadline, f"the server did not go idle: {h}"
        time.sleep(0.1)


# ------------------------------------------------------------------------------------------- 19.8
def test_a_burst_gets_exactly_parallel_plus_queue_accepted(server, http):
    """32 requests at once: 4 run, 4 wait, 24 get 503 — the free slots count as room even while the
    scheduler is busy inside llama_decode."""
    n = 32
    statuses: list[int] = []
    lock, release = threading.Lock(), threading.Event()
    body = {"prompt": "Once upon a time", "max_tokens": 5000, "ignore_eos": True, "stream": True}
    finished_before = metric(http, "localrun_generations_total", '{finish_reason="length"}')
    go = threading.Barrier(n)

    def one():
        with httpx.Client(base_url=server.url, timeout=300) as c:
            go.wait()
            with c.stream("POST", "/v1/completions", json=body) as r:
                with lock:
                    statuses.append(r.status_code)
                if r.status_code == 200:
                    release.wait(300)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(statuses) < n - MAX_QUEUE:  # the queued ones answer only once they hold a slot
        assert time.monotonic() < deadline, f"statuses so far: {statuses}"
        time.sleep(0.05)
    time.sleep(0.5)
    try:
        h = http.get("/health").json()
        assert sorted(statuses) == [200] * N_PARALLEL + [503] * (n - N_PARALLEL - MAX_QUEUE), statuses
        assert h["active_sequences"] == N_PARALLEL and h["queued"] == MAX_QUEUE, h
        # nothing finished during the burst (else a freed slot would rightly take one more)
        assert metric(http, "localrun_generations_total", '{finish_reason="length"}') == finished_before
    finally:
        release.set()  # the running streams close: the 4 queued get their slots, answer 200 and close too
        for t in threads:
            t.join(120)
    assert sorted(statuses) == [200] * (N_PARALLEL + MAX_QUEUE) + [503] * (n - N_PARALLEL - MAX_QUEUE)
    _wait_idle(http)


# ------------------------------------------------------------------------------------------- 11.4
def test_metrics_are_current_when_the_response_ends(http):
    """Right after a response (plain or streamed) /metrics shows no active sequence, and the request
    already counted."""
    for i in range(6):
        stream = i % 2 == 1
        before = metric(http, "localrun_requests_total", '{endpoint="/v1/completions",status="200"}')
        body = {"prompt": f"Count to {i + 3}:", "max_tokens": 6, "temperature": 0, "stream": stream}
        if stream:
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = [ln for ln in r.iter_lines() if ln]
            assert lines[-1] == "data: [DONE]"
        else:
            assert http.post("/v1/completions", json=body).status_code == 200
        text = http.get("/metrics").text
        assert metric_value(text, "localrun_active_sequences") == 0, i
        after = metric_value(text, "localrun_requests_total", endpoint="/v1/completions", status="200")
        assert after == before + 1
        assert http.get("/health").json()["active_sequences"] == 0


# ------------------------------------------------------------------------------------------- 11.13
def test_root_answers_like_ollama(server, http):
    r = http.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert r.headers["content-type"].startswith("text/plain")
    h = http.head("/")
    assert h.status_code == 200 and h.content == b""


def test_root_stays_open_with_an_api_key(smollm_engine, tmp_path):
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    app = create_app(smollm_engine, Settings(home=tmp_path, models_dir=tmp_path / "m"), ServeOptions(api_key="k"))
    srv = ServerThread(app)
    try:
        assert httpx.get(srv.url + "/").text == "Ollama is running"
        assert httpx.get(srv.url + "/api/tags").status_code == 401
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------- 19.5
HI = [{"role": "user", "content": "hi"}]
BAD_BODIES = [
    # (id, path, raw body, the field the 400 must name (None: a syntax error, no field))
    ("lone surrogate", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
     "messages.0.content"),
    ("lone low surrogate ollama", "/api/chat", b'{"messages": [{"role": "user", "content": "\\udc00"}]}',
     "messages.0.content"),
    ("surrogate in a key", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "\\ud800": 1}',
     r"\ud800"),
    ("surrogate in a completion prompt", "/v1/completions", b'{"prompt": "x\\ud83d"}', "prompt"),
    ("NaN", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
     "temperature"),
    ("Infinity in ollama options", "/api/chat",
     b'{"messages": [{"role": "user", "content": "hi"}], "options": {"presence_penalty": -Infinity}}',
     "options.presence_penalty"),
    ("1e999", "/api/generate", b'{"prompt": "hi", "options": {"frequency_penalty": 1e999}}',
     "options.frequency_penalty"),
    ("huge top_k", "/v1/chat/completions", json.dumps({"messages": HI, "top_k": 10**30}).encode(), "top_k"),
    ("huge ollama top_k", "/api/chat", json.dumps({"messages": HI, "options": {"top_k": 2**40}}).encode(),
     "options.top_k"),
    ("huge repeat_last_n", "/api/generate",
     json.dumps({"prompt": "hi", "options": {"repeat_last_n": 2**31, "repeat_penalty": 1.1}}).encode(),
     "options.repeat_last_n"),
    ("invalid utf-8", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', None),
    ("deep nesting", "/v1/chat/completions", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
    ("deep nesting in a schema", "/v1/chat/completions",
     b'{"messages": [], "response_format": {"type": "json_schema", "json_schema": {"schema": '
     + b'{"a": ' * 500 + b"1" + b"}" * 500 + b"}}}", None),
    ("a list body", "/v1/chat/completions", b"[1, 2]", None),
    ("a string body", "/api/chat", b'"hello"', None),
    ("null body", "/api/generate", b"null", None),
    ("number for a string", "/api/chat", b'{"messages": [{"role": "user", "content": 5}]}', "messages.0.content"),
    ("huge integer literal", "/v1/completions", b'{"prompt": "hi", "max_tokens": 1' + b"0" * 5000 + b"}", None),
]


@pytest.mark.parametrize("path,body,field", [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES])
def test_bodies_the_parser_rejects_are_400s_naming_the_field(http, path, body, field):
    r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    msg = err if path.startswith("/api/") else err["message"]
    assert msg and "internal error" not in msg
    if field is not None:
        assert field in msg, msg
        if not path.startswith("/api/"):
            assert err["param"] == field
    ok = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
    assert ok.status_code == 200  # the server keeps serving


def test_text_the_encoding_accepts_is_served(http):
    """A NUL character and a valid surrogate pair (an emoji written as \\ud83d\\ude00) are text, not errors."""
    for content in ('"a\\u0000b"', '"smile \\ud83d\\ude00"'):
        body = b'{"messages": [{"role": "user", "content": ' + content.encode() + b'}], "max_tokens": 2}'
        r = http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text


# ------------------------------------------------------------------------------------------- 19.6
def test_unknown_fields_are_logged_once_per_client(http, caplog):
    with caplog.at_level(logging.WARNING, logger="localrun.server"):
        for _ in range(2):
            r = http.post("/api/chat", json={"messages": HI, "stream": False, "temperature": 0,
                                             "options": {"num_predict": 2, "temprature": 0}})
            assert r.status_code == 200
            r = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2, "temprature": 0,
                                                        "user": "known and unused"})
            assert r.status_code == 200
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    top = [w for w in warnings if "/api/chat" in w and "field 'temperature'" in w]
    assert len(top) == 1 and "options" in top[0], warnings
    nested = [w for w in warnings if "/api/chat" in w and "field 'options.temprature'" in w]
    assert len(nested) == 1 and "did you mean 'temperature'" in nested[0], warnings
    oa = [w for w in warnings if "/v1/chat/completions" in w and "field 'temprature'" in w]
    assert len(oa) == 1 and "did you mean 'temperature'" in oa[0], warnings
    assert not any("'user'" in w for w in warnings)  # OpenAI's own field: known, deliberately unused


def test_applied_sampling_is_logged_at_debug(http, caplog):
    with caplog.at_level(logging.DEBUG, logger="localrun.server"):
        r = http.post("/api/generate", json={"prompt": "hi", "stream": False,
                                             "options": {"num_predict": 2, "temperature": 0.3, "top_k": 7,
                                                         "repeat_last_n": -1, "repeat_penalty": 1.2}})
        assert r.status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "sampling" in r.getMessage()]
    assert lines, [r.getMessage() for r in caplog.records]
    assert "temperature=0.3" in lines[-1] and "top_k=7" in lines[-1] and "max_tokens=2" in lines[-1]
    assert f"repeat_last_n={N_CTX}" in lines[-1]  # -1 resolved to the context


# ------------------------------------------------------------------------------------------- 19.9
def test_unknown_role_quotes_the_value(http):
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.role"
    assert '"wizard"' in r.json()["error"]["message"]  # quoted as JSON, as the client wrote it
    r = http.post("/api/chat", json={"messages": [{"role": "sorcerer", "content": "hi"}]})
    assert r.status_code == 400 and '"sorcerer"' in r.json()["error"] and "messages.0.role" in r.json()["error"]


# ------------------------------------------------------------------------------------------- 19.12
def test_repeat_last_n_minus_one_is_the_whole_context(http):
    """Ollama and llama.cpp read ``repeat_last_n: -1`` as the whole context; llama.cpp's penalties sampler
    itself would read it as 0 (off). Greedy on a prompt that invites repetition: -1 with a strong penalty
    differs from no penalty, and equals ``repeat_last_n = n_ctx``."""
    prompt = "cat cat cat cat cat cat cat cat cat cat cat cat"

    def ollama(**opts):
        r = http.post("/api/generate", json={"prompt": prompt, "raw": True, "stream": False,
                                             "options": {"temperature": 0, "num_predict": 12, **opts}})
        assert r.status_code == 200, r.text
        return r.json()["response"]

    def openai(**extra):
        r = http.post("/v1/completions", json={"prompt": prompt, "temperature": 0, "max_tokens": 12, **extra})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    for run in (ollama, openai):
        plain = run(repeat_penalty=1.0)
        whole = run(repeat_penalty=2.0, repeat_last_n=-1)
        assert whole != plain, run.__name__
        assert whole == run(repeat_penalty=2.0, repeat_last_n=N_CTX), run.__name__
        assert plain.count("cat") > whole.count("cat"), (plain, whole)


# ------------------------------------------------------------------------------------------- 19.17
def test_ollama_chat_takes_an_openai_style_tool_history(http):
    history = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees and rain"},
        {"role": "user", "content": [{"type": "text", "text": "So, do I need an umbrella?"}]},
    ]
    oa = http.post("/v1/chat/completions", json={"messages": history, "max_tokens": 4, "temperature": 0})
    assert oa.status_code == 200, oa.text
    ol = http.post(
        "/api/chat", json={"messages": history, "stream": False, "options": {"num_predict": 4, "temperature": 0}}
    )
    assert ol.status_code == 200, ol.text
    assert ol.json()["done"] is True
    # both routes rendered the same prompt: the Ollama request found all of it in the prefix cache (all but
    # the last token, which is evaluated again for its logits); prompt_eval_count is still the whole prompt
    assert ol.json()["prompt_eval_count"] == oa.json()["usage"]["prompt_tokens"]
    assert ol.json()["prompt_cached_count"] == ol.json()["prompt_eval_count"] - 1


def test_tool_call_history_whose_arguments_are_not_a_json_object_is_a_400(http):
    """An earlier turn's tool call with arguments that are not a JSON object is refused naming the field, on
    the OpenAI route (through the openai client) and Ollama's; "" is a call without arguments (as "{}")."""
    import openai

    def history(args):
        return [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]

    client = openai.OpenAI(base_url=str(http.base_url).rstrip("/") + "/v1", api_key="x", max_retries=0)
    where = "messages[1].tool_calls[0].function.arguments"
    for args in ("{", '{"city": "Paris"} x', "Paris", '"Paris"', "[1]"):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="m", messages=history(args), max_tokens=2)
        assert e.value.body["param"] == where and where in e.value.body["message"], (args, e.value.body)
        r = http.post("/api/chat", json={"messages": history(args), "stream": False})
        assert r.status_code == 400 and where in r.json()["error"], (args, r.text)
    r = client.chat.completions.create(model="m", messages=history(""), max_tokens=2)  # a valid object: 19.17
    assert r.choices[0].finish_reason == "length"


# ------------------------------------------------------------------------------------------- 19.7
SMALL_CTX = 256  # llama.cpp's smallest context (it pads a smaller n_ctx to 256)


@pytest.fixture
def small_ctx_http(smollm_path, tmp_path):
    """SmolLM2 served with a context of SMALL_CTX tokens: a prompt that nearly fills it is a short prefill."""
    from localrun.backends import load_engine
    from localrun.config import Settings
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = simple_plan(read_gguf(smollm_path), n_ctx=SMALL_CTX, n_parallel=1)
    plan.n_threads = plan.n_threads_batch = 1
    engine = load_engine(smollm_path, plan)
    assert engine.n_ctx == SMALL_CTX
    srv = ServerThread(create_app(engine, Settings(home=tmp_path, models_dir=tmp_path / "models"),
                                  ServeOptions(plan=plan)))
    try:
        with httpx.Client(base_url=srv.url, timeout=300) as c:
            yield c
    finally:
        srv.stop()
        engine.close()


def test_max_tokens_past_the_context_runs_to_its_end(small_ctx_http):
    """No ``max_tokens``, or more than the context has room for: the generation runs until the sequence's
    context is full and ends with ``length`` (README and `serve --help` say so). ``ignore_eos`` keeps the
    model from stopping first; a long prompt leaves a short way to the end."""
    prompt = "hello " * (SMALL_CTX - 40)
    for extra in ({"max_tokens": 100_000}, {}):
        r = small_ctx_http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": prompt}], "ignore_eos": True, "temperature": 0, **extra},
        )
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert u["prompt_tokens"] + u["completion_tokens"] == SMALL_CTX, u
        assert u["completion_tokens"] > 1, u  # it generated on to the end, not refused a full prompt
    # /v1/completions too (llama-server's and Ollama's default, not OpenAI's legacy 16 tokens), via the openai client
    import openai

    client = openai.OpenAI(base_url=str(small_ctx_http.base_url).rstrip("/") + "/v1", api_key="x", max_retries=0)
    c = client.completions.create(model="m", prompt=prompt, temperature=0, extra_body={"ignore_eos": True})
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens > 16, c.usage
    assert c.usage.prompt_tokens + c.usage.completion_tokens == SMALL_CTX, c.usage


def test_serve_help_says_how_long_a_generation_runs():
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "localrun", "serve", "--help"],
        capture_output=True,
        text=True,
        env=dict(os.environ, COLUMNS="200"),
        timeout=120,
    ).stdout
    assert "without max_tokens" in out and 'finish_reason "length"' in out and "--max-body" in out
