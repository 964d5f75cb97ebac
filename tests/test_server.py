"""`localrun serve` end to end: a real uvicorn server on a free loopback port, SmolLM2 in llama.cpp, the
real `openai` client and raw httpx for the Ollama endpoints and the bad inputs."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from helpers import ServerThread, metric_value, parse_labels, stream_and_full

pytestmark = pytest.mark.model  # every test here loads a real model

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

API_KEY = "test-key-123"
N_CTX = 512  # per sequence: the longest prompt here (the prefix-cache test's) is ≈ 340 tokens
N_PARALLEL = 4


@pytest.fixture(scope="module")
def server(smollm_path, tmp_path_factory):
    from localrun.backends import load_engine
    from localrun.config import Settings
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = simple_plan(read_gguf(smollm_path), n_ctx=N_CTX, n_parallel=N_PARALLEL)
    plan.n_threads = plan.n_threads_batch = 1  # 2 shared cores: more threads only spin
    engine = load_engine(smollm_path, plan)
    home = tmp_path_factory.mktemp("serve_home")
    app = create_app(engine, Settings(home=home, models_dir=home / "models"),
                     ServeOptions(api_key=API_KEY, plan=plan, max_body_bytes=1024 * 1024))
    srv = ServerThread(app)
    yield srv
    srv.stop()
    engine.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=300) as c:
        yield c


def metric(http, name: str, labels: str = "") -> float:
    return metric_value(http.get("/metrics").text, name, **parse_labels(labels))


def chat(client, content: str, **kw) -> str:
    r = client.chat.completions.create(model="smollm", messages=[{"role": "user", "content": content}],
                                       temperature=0, **kw)
    return r.choices[0].message.content


def test_streaming_equals_non_streaming(client):
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Name three "}, {"type": "text", "text": "colors."}]}]
    stream_and_full(client, msgs, 24)


def test_concurrent_greedy_requests_match_solo(client, http):
    # more prompts than N_PARALLEL: two wait in the queue and join the batch as sequences finish
    prompts = [f"Write one sentence about the number {n}." for n in (3, 7, 12, 25, 58, 256)]
    solo = [chat(client, p, max_tokens=20) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as ex:
        together = list(ex.map(lambda p: chat(client, p, max_tokens=20), prompts))
    assert together == solo
    assert metric(http, "localrun_active_sequences") == 0


def test_disconnect_after_first_chunk_frees_the_sequence(server, http):
    before = metric(http, "localrun_generations_total", '{finish_reason="cancelled"}')
    body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 800, "temperature": 0, "stream": True,
            "logit_bias": {"0": -100, "1": -100, "2": -100}}  # no EOS: it would run on without the cancel
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=300) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break
    deadline = time.monotonic() + 120
    while metric(http, "localrun_generations_total", '{finish_reason="cancelled"}') < before + 1:
        assert time.monotonic() < deadline, "the disconnected stream was never cancelled"
        time.sleep(0.2)
    assert metric(http, "localrun_active_sequences") == 0
    assert metric(http, "localrun_generated_tokens_total") > 0
    while metric(http, "localrun_requests_total", '{endpoint="/v1/completions",status="499"}') < 1:
        assert time.monotonic() < deadline, "the abandoned stream was never counted (499)"
        time.sleep(0.2)
    assert http.get("/health").json()["active_sequences"] == 0




def test_a_non_streaming_client_that_goes_away_frees_its_sequence(server, http):
    # the reply is collected on the server; the client gives up (read timeout) long before it would end
    before = metric(http, "localrun_generations_total", '{finish_reason="cancelled"}')
    body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 800, "temperature": 0,
            "logit_bias": {"0": -100, "1": -100, "2": -100}}  # no EOS: it would run on without the cancel
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=1.5) as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/completions", json=body)
    deadline = time.monotonic() + 120
    while metric(http, "localrun_generations_total", '{finish_reason="cancelled"}') < before + 1:
        assert time.monotonic() < deadline, "the abandoned request was never cancelled"
        time.sleep(0.2)
    assert metric(http, "localrun_active_sequences") == 0
    assert http.get("/health").json()["active_sequences"] == 0
BAD = [
    # (description, headers, body, status, code)
    ("malformed json", {"Content-Type": "application/json"}, b'{"messages": [', 400, "invalid_json"),
    ("wrong type", None, {"messages": "hello"}, 400, "invalid_value"),
    ("unknown role", None, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "invalid_value"),
    ("empty messages", None, {"messages": []}, 400, None),
    ("max_tokens 0", None, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "invalid_value"),
    ("max_tokens -5", None, {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -5}, 400,
     "invalid_value"),
    ("n=2", None, {"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "unsupported_value"),
    # tools on SmolLM2's template (no tool syntax) use the generic format: tests/test_generic_tools_server.py
    ("tool_choice without tools", None, {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"},
     400, None),
    ("too long", None, {"messages": [{"role": "user", "content": "hello " * (N_CTX + 50)}]}, 400,
     "context_length_exceeded"),
    ("too large", {"Content-Type": "application/json"},
     b'{"messages": [{"role": "user", "content": "' + b"x" * (1024 * 1024 + 10) + b'"}]}', 413, "request_too_large"),
    ("wrong content type", {"Content-Type": "text/plain"}, b'{"messages": []}', 415, "unsupported_media_type"),
    ("bad json schema", None, {"messages": [{"role": "user", "content": "hi"}],
                               "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400, None),
    ("max_tokens true", None, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": True}, 400,
     "invalid_value"),
    ("stream 'yes'", None, {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400, "invalid_value"),
    ("image part", None, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400, "invalid_image"),
]


@pytest.mark.parametrize("desc,headers,body,status,code", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_4xx_and_server_keeps_serving(http, client, desc, headers, body, status, code):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = http.post("/v1/chat/completions", headers=headers, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    extra = {"n_prompt_tokens", "n_ctx"} if code == "context_length_exceeded" else set()  # as llama-server's
    assert set(err) == {"message", "type", "param", "code"} | extra and err["message"]
    if extra:
        assert err["n_ctx"] == N_CTX and err["n_prompt_tokens"] > N_CTX
    if code:
        assert err["code"] == code
    assert ".str" not in err["message"] and "list[" not in err["message"]  # field names, not pydantic's unions
    if desc == "image part":
        assert err["param"] == "messages[0].content[1]" and "--mmproj" in err["message"]  # no projector loaded
    assert chat(client, "Say OK.", max_tokens=4)


def test_openai_client_sees_context_length_exceeded(client, caplog):
    with caplog.at_level(logging.INFO, logger="localrun.server"), pytest.raises(openai.BadRequestError) as ei:
        chat(client, "word " * (N_CTX + 10), max_tokens=4)
    assert ei.value.code == "context_length_exceeded"
    # the per-request log line says why it was refused (an operator reading the log of an agent's session)
    lines = [r.getMessage() for r in caplog.records if "POST /v1/chat/completions 400" in r.getMessage()]
    assert lines and lines[-1].endswith("error=context_length_exceeded"), lines


def test_api_key_required(server, http):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(server.url + "/api/tags", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and isinstance(r.json()["error"], str)
    assert httpx.get(server.url + "/health").status_code == 200  # health stays open for probes
    assert http.get("/v1/models").json()["data"][0]["object"] == "model"


def test_prefix_cache_hit_on_shared_system_prompt(client, http):
    rules = " ".join(f"Rule {i}: answer briefly." for i in range(40))
    system = "You are the archivist of the Zyxwv library. " + rules
    hits_before = metric(http, "localrun_prefix_cache_hits_total")
    usage = []
    for q in ("What is a book?", "What is a shelf?"):
        r = client.chat.completions.create(
            model="x",
            temperature=0,
            max_tokens=4,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": q}],
        )
        usage.append(r.usage)
    n_system = usage[0].prompt_tokens - 12  # the system prompt is most of the prompt
    assert usage[0].prompt_tokens_details.cached_tokens < 10
    assert usage[1].prompt_tokens_details.cached_tokens >= n_system
    assert metric(http, "localrun_prefix_cache_hits_total") >= hits_before + 1
    assert 0 < metric(http, "localrun_prefix_cache_hit_rate") <= 1


def test_sampling_features(client, http):
    r = client.chat.completions.create(
        model="x",
        temperature=0,
        max_tokens=5,
        logprobs=True,
        top_logprobs=3,
        messages=[{"role": "user", "content": "Hello"}],
    )
    lp = r.choices[0].logprobs.content
    assert lp and all(t.logprob <= 0 and len(t.top_logprobs) == 3 for t in lp)
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    r = client.chat.completions.create(
        model="x",
        temperature=0,
        max_tokens=30,
        messages=[{"role": "user", "content": "Give an age as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    assert isinstance(json.loads(r.choices[0].message.content)["age"], int)
    text = chat(client, "Count from 1 to 10, separated by commas.", max_tokens=40)
    cut = chat(client, "Count from 1 to 10, separated by commas.", max_tokens=40, stop=["5"])
    assert "5" in text and "5" not in cut and text.startswith(cut)
    seeded = [
        chat(
            client,
            "Tell me a word.",
            max_tokens=8,
            seed=42,
            top_p=0.9,
            frequency_penalty=0.5,
            presence_penalty=0.5,
            extra_body={"top_k": 20, "min_p": 0.01, "repeat_penalty": 1.1},
        )
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]
    c = client.completions.create(model="x", prompt="The capital of France is", max_tokens=6, temperature=0)
    assert c.choices[0].text and c.usage.completion_tokens <= 6
    e = client.embeddings.create(model="x", input=["a cat", "a dog"])
    v = e.data[0].embedding
    assert len(e.data) == 2 and len(v) == 576 and abs(sum(x * x for x in v) - 1) < 1e-3


def test_top_logprobs_keep_each_alternatives_bytes(client):
    """``top_logprobs`` alternatives that are each part of a UTF-8 character keep their own bytes (they were all
    '\ufffd' = [239, 191, 189], so distinct tokens looked alike)."""
    r = client.chat.completions.create(model="x", temperature=0, max_tokens=12, logprobs=True, top_logprobs=5,
                                       messages=[{"role": "user", "content": "Write the word café in Japanese: "}])
    partial = 0
    for t in r.choices[0].logprobs.content:
        alts = [tuple(a.bytes) for a in t.top_logprobs]
        assert len(set(alts)) == len(alts), t  # five tokens, five byte strings
        for a in t.top_logprobs:
            assert bytes(a.bytes).decode("utf-8", errors="replace") == a.token
            partial += a.token == "\ufffd"
    assert partial, "no alternative was part of a character: the prompt no longer tests this"


def test_streamed_logprobs_follow_the_text_around_a_stop_string(client):
    """While a stop string holds text back, each chunk carries the entries of the tokens whose text it shows
    (they rode with the wrong chunk before), the stop string's own tokens have none, streamed equals plain."""
    kw = dict(model="x", temperature=0, max_tokens=24, logprobs=True, stop=[", 4"],
              messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}])
    full = client.chat.completions.create(**kw)
    text = full.choices[0].message.content
    assert full.choices[0].finish_reason == "stop" and "3" in text and "4" not in text, text
    plain = [t.token for t in full.choices[0].logprobs.content]
    assert "".join(plain) == text  # the entries spell the reply: ", " of ", 4" has none
    streamed = []
    for ch in client.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            tokens = [t.token for t in (c.logprobs.content or [])] if c.logprobs else []
            assert "".join(tokens) == (c.delta.content or ""), (c.delta.content, tokens)  # each with its text
            streamed += tokens
    assert streamed == plain


def test_ollama_prompt_eval_count_is_the_prompt_on_a_cache_hit(http):
    """``prompt_eval_count`` is the prompt's length whether its KV came from the prefix cache or not, on
    /api/chat and /api/generate, streamed or not (through the ollama client); the cached part is localrun's
    ``prompt_cached_count``."""
    import ollama

    c = ollama.Client(host=str(http.base_url), headers={"Authorization": f"Bearer {API_KEY}"})
    msgs = [{"role": "user", "content": "Name a colour of the sky at dusk, in one word."}]
    opts = {"temperature": 0, "num_predict": 2}
    first = c.chat(model="m", messages=msgs, options=opts)
    again = c.chat(model="m", messages=msgs, options=opts)
    last = list(c.chat(model="m", messages=msgs, options=opts, stream=True))[-1]
    assert first.prompt_eval_count == again.prompt_eval_count == last.prompt_eval_count > 10
    raw = http.post("/api/chat", json={"messages": msgs, "options": opts, "stream": False}).json()
    assert raw["prompt_eval_count"] == first.prompt_eval_count
    assert raw["prompt_cached_count"] == first.prompt_eval_count - 1  # all of it but the last token
    g1 = c.generate(model="m", prompt="The sky at dusk is", options=opts, raw=True)
    g2 = list(c.generate(model="m", prompt="The sky at dusk is", options=opts, raw=True, stream=True))[-1]
    assert g1.prompt_eval_count == g2.prompt_eval_count > 1


def test_ignore_eos_generates_exactly_max_tokens(client):
    msgs = [{"role": "user", "content": "Reply with the single word: yes"}]
    short = client.chat.completions.create(model="x", temperature=0, max_tokens=48, messages=msgs)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 48
    full = client.chat.completions.create(
        model="x", temperature=0, max_tokens=48, messages=msgs, extra_body={"ignore_eos": True}
    )
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 48
    assert full.choices[0].message.content.startswith(short.choices[0].message.content)


def test_ollama_endpoints(http):
    assert "version" in http.get("/api/version").json()
    tags = http.get("/api/tags").json()["models"]
    assert tags[0]["details"]["format"] == "gguf" and tags[0]["details"]["quantization_level"] == "Q4_1"
    show = http.post("/api/show", json={"model": tags[0]["name"]}).json()
    assert show["details"]["family"] == "llama" and "im_start" in show["template"]
    ps = http.get("/api/ps").json()["models"][0]
    assert ps["localrun"]["plan"]["n_parallel"] == N_PARALLEL and ps["localrun"]["memory"]["rss_bytes"] > 0
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Say hi."}],
        "stream": False,
        "options": {"temperature": 0, "num_predict": 8},
    }
    r = http.post("/api/chat", json=body).json()
    assert r["done"] is True and r["message"]["role"] == "assistant" and r["message"]["content"]
    assert r["eval_count"] > 0 and r["total_duration"] > 0
    with http.stream("POST", "/api/chat", content=json.dumps(dict(body, stream=True))) as s:  # curl -d: no type
        assert s.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(ln) for ln in s.iter_lines() if ln]
    assert lines[-1]["done"] is True and all(ln["done"] is False for ln in lines[:-1])
    assert "".join(ln["message"]["content"] for ln in lines) == r["message"]["content"]
    g = http.post(
        "/api/generate",
        json={"prompt": "Why is the sky blue?", "stream": False, "options": {"temperature": 0, "num_predict": 6}},
    ).json()
    assert g["done"] and g["response"] and g["context"]
    bad = http.post("/api/chat", json={"messages": [{"role": "wizard", "content": "x"}]})
    assert bad.status_code == 400 and isinstance(bad.json()["error"], str)


def test_bad_ollama_context_fails_alone(server, http):
    """An out-of-vocabulary token id in /api/generate's ``context`` is a 400 for that request; a stream
    running alongside finishes normally (llama_decode would otherwise fail the whole batch)."""
    body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 40, "temperature": 0, "stream": True}
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=300) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = next(ln for ln in lines if ln.startswith("data: "))
            bad = http.post("/api/generate", json={"prompt": "hi", "raw": True, "context": [99999999], "stream": False})
            rest = [ln for ln in lines if ln.startswith("data: ")]
    assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]
    assert "error" not in first and rest[-1] == "data: [DONE]" and not any('"error"' in ln for ln in rest)
    for images in ({"images": ["iVBORw0KGgo="]},):
        r = http.post("/api/generate", json={"prompt": "Describe the picture.", "stream": False, **images})
        assert r.status_code == 400 and "image" in r.json()["error"]
        r = http.post(
            "/api/chat", json={"messages": [{"role": "user", "content": "Describe.", **images}], "stream": False}
        )
        assert r.status_code == 400 and "image" in r.json()["error"]


def test_model_lookup_and_embedding_dimensions(http, client):
    name = client.models.list().data[0].id
    assert client.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    assert http.post("/api/show", json={"model": name + ":latest"}).status_code == 200
    assert http.post("/api/show", json={"model": "llama3"}).status_code == 404
    with pytest.raises(openai.BadRequestError) as ei:
        client.embeddings.create(model="x", input=["a cat"], dimensions=10)
    assert "576" in str(ei.value)
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="x", prompt="word " * (N_CTX + 10), max_tokens=4)
    assert ei.value.body["param"] == "prompt" and ei.value.body["code"] == "context_length_exceeded"


def test_ollama_embed_endpoints(http, client):
    r = http.post("/api/embed", json={"model": "x", "input": ["a cat", "a dog"]})
    assert r.status_code == 200, r.text
    d = r.json()
    assert len(d["embeddings"]) == 2 and len(d["embeddings"][0]) == 576 and d["prompt_eval_count"] > 0
    openai_vec = client.embeddings.create(model="x", input=["a cat"]).data[0].embedding
    assert max(abs(a - b) for a, b in zip(d["embeddings"][0], openai_vec)) < 1e-5
    legacy = http.post("/api/embeddings", json={"model": "x", "prompt": "a cat"}).json()["embedding"]
    assert max(abs(a - b) for a, b in zip(legacy, openai_vec)) < 1e-5
    long = http.post("/api/embed", json={"input": "word " * (N_CTX + 10)})  # truncate defaults to true
    assert long.status_code == 200 and long.json()["prompt_eval_count"] == N_CTX - 1
    strict = http.post("/api/embed", json={"input": "word " * (N_CTX + 10), "truncate": False})
    assert strict.status_code == 400 and "context" in strict.json()["error"]
    assert http.post("/api/embed", json={"input": []}).status_code == 400


def test_ollama_generate_context_continues_the_conversation(http):
    """``context`` from one /api/generate is prepended to the next (chat template path too): the new turn
    starts right after it, with its own ``<|im_start|>`` (SmolLM2's BOS id, which the tokenizer does not add)."""
    opts = {"temperature": 0, "num_predict": 8}
    first = http.post("/api/generate", json={"prompt": "My name is Ada.", "stream": False, "options": opts}).json()
    ctx = first["context"]
    second = http.post(
        "/api/generate", json={"prompt": "What is my name?", "context": ctx, "stream": False, "options": opts}
    ).json()
    assert second["context"][: len(ctx)] == ctx and second["context"][len(ctx)] == 1
    assert second["prompt_eval_count"] > len(ctx)  # the whole prompt, the context included, cached or not
    uncached = second["prompt_eval_count"] - second["prompt_cached_count"]
    assert uncached < len(second["context"]) - len(ctx)  # the context came from the cache


def test_ollama_stream_ends_with_an_empty_final_line(http):
    body = {"prompt": "Why is the sky blue?", "options": {"temperature": 0, "num_predict": 6}}
    with http.stream("POST", "/api/generate", json=body) as s:
        lines = [json.loads(ln) for ln in s.iter_lines() if ln]
    assert lines[-1]["done"] is True and lines[-1]["response"] == "" and lines[-1]["context"]
    assert "".join(ln["response"] for ln in lines[:-1]) and all(not ln["done"] for ln in lines[:-1])


def test_metrics_exposes_the_counters(http):
    text = http.get("/metrics").text
    for name in (
        "localrun_requests_total",
        "localrun_prompt_tokens_total",
        "localrun_generated_tokens_total",
        "localrun_time_to_first_token_seconds_bucket",
        "localrun_inter_token_latency_seconds_bucket",
        "localrun_queue_depth",
        "localrun_active_sequences",
        "localrun_kv_cells_used",
        "localrun_prefix_cache_hit_rate",
    ):
        assert name in text, name
    assert metric(http, "localrun_kv_cells_used") > 0


def test_loop_guards_are_opt_in_over_http(http):
    """OpenAI semantics by default (a looping completion runs to max_tokens); `stop_loops` ends it early as
    "stop" (counted as "loop" in /metrics); llama-server's DRY fields are applied (the loop is broken)."""
    prompt = "The cat sat on the mat. " * 12  # the model continues this cycle by a wide margin
    # the guard ends a loop once it spans 64 tokens (LoopDetector.min_span; here at token 66): room past that
    n = 90
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
    plain = http.post("/v1/completions", json=body).json()
    assert plain["choices"][0]["finish_reason"] == "length" and plain["usage"]["completion_tokens"] == n
    loops_before = metric(http, "localrun_generations_total", '{finish_reason="loop"}')
    guarded = http.post("/v1/completions", json={**body, "stop_loops": True}).json()
    assert guarded["choices"][0]["finish_reason"] == "stop"
    assert guarded["usage"]["completion_tokens"] < n
    assert plain["choices"][0]["text"].startswith(guarded["choices"][0]["text"])
    assert metric(http, "localrun_generations_total", '{finish_reason="loop"}') == loops_before + 1
    dry = http.post("/v1/completions", json={**body, "dry_multiplier": 0.8}).json()
    assert dry["choices"][0]["text"] != plain["choices"][0]["text"]  # the repetition was penalised
    r = http.post(
        "/api/generate",
        json={
            "prompt": prompt,
            "raw": True,
            "stream": False,
            "options": {"num_predict": n, "temperature": 0, "stop_loops": True},
        },
    )
    assert r.status_code == 200 and r.json()["done_reason"] == "stop" and r.json()["eval_count"] < n
    assert http.post("/v1/completions", json={**body, "dry_base": 0.5}).status_code == 400  # base < 1
