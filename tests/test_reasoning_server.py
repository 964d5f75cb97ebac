"""Thinking through a real server (issue 13): SmolLM2 served with Qwen's QwQ-32B chat template
(tests/data/templates/Qwen-QwQ-32B.jinja: ChatML, SmolLM2's own markers; the generation prompt opens
``<think>`` itself; ``enable_thinking`` turns it off). Whatever SmolLM2 writes after the prompt is its
thinking until the engine's thinking budget runs out and forces ``\\n</think>\\n\\n``; then it answers. So the
splitter runs on token pieces the model really emitted, on real boundaries.

Asserted as properties (CPU-independent): streaming equals non-streaming at temperature 0, no closing tag in
the answer, the raw form (``reasoning_format: none``) is the split form with its tags, reasoning tokens stay
within the budget plus the injected close, thinking on/off per request."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from helpers import ServerThread

openai = pytest.importorskip("openai")

TEMPLATES = Path(__file__).parent / "data" / "templates"
STORY = [{"role": "user", "content": "Write a long story about a cat named Tom."}]
BUDGET = 10  # serve --reasoning-budget
CLOSE = "\n</think>\n\n"  # what the engine forces when the budget runs out (QwQ's transition)


@pytest.fixture(scope="module")
def server(smollm_path, tmp_path_factory):
    from localrun.backends import load_engine
    from localrun.config import Settings
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = simple_plan(read_gguf(smollm_path), n_ctx=1024, n_parallel=2)
    plan.n_threads = plan.n_threads_batch = 1
    engine = load_engine(smollm_path, plan, chat_template=(TEMPLATES / "Qwen-QwQ-32B.jinja").read_text())
    home = tmp_path_factory.mktemp("reasoning_home")
    app = create_app(engine, Settings(home=home, models_dir=home / "models"),
                     ServeOptions(plan=plan, reasoning_budget=BUDGET))
    srv = ServerThread(app)
    srv.engine = engine
    yield srv
    srv.stop()
    engine.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300, max_retries=0)


def _extra(obj, name: str):
    """A field the openai client's models do not declare (reasoning_content, reasoning)."""
    return (obj.model_extra or {}).get(name)


def full_and_streamed(client, **kw):
    """The same greedy request plain and streamed → (plain response, streamed content, thinking, finish,
    usage); the streamed ``reasoning`` must mirror ``reasoning_content`` piece by piece."""
    full = client.chat.completions.create(model="x", temperature=0, **kw)
    content, thinking, finish, usage = [], [], None, None
    for ch in client.chat.completions.create(model="x", temperature=0, stream=True,
                                             stream_options={"include_usage": True}, **kw):
        usage = ch.usage or usage
        for c in ch.choices:
            content.append(c.delta.content or "")
            piece = _extra(c.delta, "reasoning_content") or ""
            assert (_extra(c.delta, "reasoning") or "") == piece
            thinking.append(piece)
            finish = c.finish_reason or finish
    return full, "".join(content), "".join(thinking), finish, usage


def test_thinking_split_streaming_equals_full(client):
    full, content, thinking, finish, usage = full_and_streamed(client, messages=STORY, max_tokens=24)
    msg = full.choices[0].message
    think = _extra(msg, "reasoning_content")
    assert think and _extra(msg, "reasoning") == think  # both names, same text
    assert msg.content  # the model answered after the forced close
    assert "</think>" not in msg.content and "<think>" not in msg.content
    assert (content, thinking, finish) == (msg.content, think, full.choices[0].finish_reason)
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.completion_tokens_details.reasoning_tokens == full.usage.completion_tokens_details.reasoning_tokens


def _cut(text: str, stops) -> str:
    """``text`` up to the earliest of ``stops`` (what a stop string leaves)."""
    return text[:min([text.find(s) for s in stops if s in text], default=len(text))]


def test_stop_strings_apply_to_the_answer_only(client, server):
    """A stop string never cuts the thinking, never matches the close tag the engine forces when the budget
    runs out (nor the blank space after it); in the answer it cuts as always. On /v1/chat/completions
    (streamed too), /v1/messages and /api/chat, through each wire format's own client."""
    import anthropic
    import ollama

    n = 20  # the budget's 10 thinking tokens, the forced close, the start of the answer
    base = client.chat.completions.create(model="x", messages=STORY, temperature=0, max_tokens=n)
    think, answer = _extra(base.choices[0].message, "reasoning_content"), base.choices[0].message.content
    assert think and answer
    stops = ["</think>", "</", "think>", "\n", think.split()[0]]  # the last one is in the thinking
    full, content, thinking, finish, _ = full_and_streamed(client, messages=STORY, max_tokens=n, stop=stops)
    assert (_extra(full.choices[0].message, "reasoning_content"), full.choices[0].message.content) == \
        (thinking, content) == (think, _cut(answer, stops))
    assert finish == ("stop" if _cut(answer, stops) != answer else base.choices[0].finish_reason)

    ac = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)

    def blocks(**kw) -> tuple[str, str, object]:
        m = ac.messages.create(model="x", max_tokens=n, messages=STORY, extra_body={"temperature": 0}, **kw)
        by = {b.type: b for b in m.content}
        return by["thinking"].thinking, by["text"].text if "text" in by else "", m

    a_think, a_answer, _ = blocks()
    got_think, got_answer, m = blocks(stop_sequences=stops)
    assert (got_think, got_answer) == (a_think, _cut(a_answer, stops))
    hit = [s for s in stops if s in a_answer and a_answer.find(s) == len(got_answer)]
    assert (m.stop_reason, m.stop_sequence) == (("stop_sequence", hit[0]) if hit else ("max_tokens", None))

    oc = ollama.Client(host=server.url)
    opts = {"temperature": 0, "num_predict": n}
    o = oc.chat(model="x", messages=STORY, think=True, options=opts)
    cut = oc.chat(model="x", messages=STORY, think=True, options={**opts, "stop": stops})
    assert o.message.thinking and (cut.message.thinking, cut.message.content) == (o.message.thinking,
                                                                                  _cut(o.message.content, stops))


def test_the_answer_never_opens_a_second_thinking_block(client, server):
    """After the budget closes the block, "<think>" is masked in the answer as "</think>" is: a bias that
    makes SmolLM2 write "<think" over and over still never completes the tag (it did: 'answer<think><think>')."""
    bias = {str(t): 20 for t in server.engine.tokenize("<think>", add_special=False)}
    r = client.chat.completions.create(model="x", temperature=0, max_tokens=30, logit_bias=bias,
                                       extra_body={"reasoning_budget": 3},
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    content = r.choices[0].message.content
    assert "<think" in content and "<think>" not in content, content


def test_budget_bounds_the_thinking(client, server):
    n_close = len(server.engine.tokenize(CLOSE, add_special=False, parse_special=True))
    for budget in (4, 12):
        r = client.chat.completions.create(model="x", messages=STORY, temperature=0, max_tokens=budget + 16,
                                           extra_body={"reasoning_budget": budget})
        n = r.usage.completion_tokens_details.reasoning_tokens
        assert budget <= n <= budget + n_close, (budget, n)
        think = _extra(r.choices[0].message, "reasoning_content")
        assert len(server.engine.tokenize(think, add_special=False)) <= budget + 2
        assert r.choices[0].message.content and "</think>" not in r.choices[0].message.content


def test_reasoning_format_none_keeps_the_tags(client):
    split = client.chat.completions.create(model="x", messages=STORY, temperature=0, max_tokens=24)
    raw = client.chat.completions.create(model="x", messages=STORY, temperature=0, max_tokens=24,
                                         extra_body={"reasoning_format": "none"})
    think, answer, text = _extra(split.choices[0].message, "reasoning_content"), split.choices[0].message.content, \
        raw.choices[0].message.content
    assert _extra(raw.choices[0].message, "reasoning_content") is None
    assert "</think>" in text
    before, after = text.split("</think>", 1)
    assert think in before and after.strip() == answer.strip()


def test_thinking_off_per_request(client):
    on = client.chat.completions.create(model="x", messages=STORY, temperature=0, max_tokens=16)
    off = client.chat.completions.create(model="x", messages=STORY, temperature=0, max_tokens=16,
                                         reasoning_effort="none")
    kw = client.chat.completions.create(model="x", messages=STORY, temperature=0, max_tokens=16,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert _extra(on.choices[0].message, "reasoning_content")
    for r in (off, kw):
        assert _extra(r.choices[0].message, "reasoning_content") is None and r.choices[0].message.content
        assert r.usage.completion_tokens_details.reasoning_tokens == 0
        # QwQ's template writes "</think>" into the prompt when thinking is off
        assert r.usage.prompt_tokens > on.usage.prompt_tokens
    assert off.choices[0].message.content == kw.choices[0].message.content


def test_effort_level_is_a_budget(client):
    """QwQ takes no levels: "low" is a 512-token budget, more than max_tokens, so it thinks to the end."""
    r = client.chat.completions.create(model="x", messages=STORY, temperature=0, max_tokens=20,
                                       reasoning_effort="low")
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.content
    assert r.usage.completion_tokens_details.reasoning_tokens == r.usage.completion_tokens


def _ollama_stream(server, path: str, body: dict) -> tuple[dict, list[dict]]:
    with httpx.stream("POST", server.url + path, json=body, timeout=300) as resp:
        assert resp.status_code == 200
        lines = [json.loads(x) for x in resp.iter_lines() if x]
    return lines[-1], lines[:-1]


def test_ollama_think(server):
    body = {"messages": STORY, "options": {"temperature": 0, "num_predict": 24}}
    full = httpx.post(server.url + "/api/chat", json={**body, "stream": False, "think": True}, timeout=300).json()
    msg = full["message"]
    assert msg["thinking"] and msg["content"] and "</think>" not in msg["content"]
    last, lines = _ollama_stream(server, "/api/chat", {**body, "think": True})
    assert "".join(x["message"].get("thinking", "") for x in lines) == msg["thinking"]
    assert "".join(x["message"]["content"] for x in lines) == msg["content"]
    assert last["done"] and last["message"]["content"] == "" and last["eval_count"] == full["eval_count"]
    off = httpx.post(server.url + "/api/chat", json={**body, "stream": False, "think": False}, timeout=300).json()
    assert "thinking" not in off["message"] and off["message"]["content"]
    gen = {"prompt": STORY[0]["content"], "options": {"temperature": 0, "num_predict": 24}, "think": True}
    g = httpx.post(server.url + "/api/generate", json={**gen, "stream": False}, timeout=300).json()
    assert (g["thinking"], g["response"].strip()) == (msg["thinking"], msg["content"].strip())
    last, lines = _ollama_stream(server, "/api/generate", gen)
    assert "".join(x.get("thinking", "") for x in lines) == g["thinking"]
    assert "".join(x["response"] for x in lines) == g["response"]
    assert last["context"] == g["context"]


def test_bad_think_values(server):
    r = httpx.post(server.url + "/api/chat", json={"messages": STORY, "think": "max"}, timeout=60)
    assert r.status_code == 400 and "think" in r.json()["error"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": STORY, "reasoning_effort": "huge"},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort"


AGE_RX = "[A-Z][a-z]+ is [0-9]{2}\\."


@pytest.mark.parametrize("fmt", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "age", "schema": {
        "type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}}}},
    {"extra_body": {"regex": AGE_RX}},  # localrun's regex field
], ids=["json_schema", "regex"])
def test_a_response_format_comes_after_the_thinking(client, fmt):
    """A response format on a thinking model: the model thinks first (the template opened the block), the
    budget's forced close is part of what the constraint allows, and the answer matches the format. Before,
    the forced close broke the constraint (a 500: "breaks the output constraint"), or the answer was written
    inside the thinking block."""
    import re

    r = client.chat.completions.create(
        model="x", temperature=0, max_tokens=60, **fmt,
        messages=[{"role": "user", "content": "How old is Tom? Answer in the format asked."}])
    msg, finish = r.choices[0].message, r.choices[0].finish_reason
    thinking = _extra(msg, "reasoning_content")
    assert finish == "stop", (finish, msg)
    assert thinking and "</think>" not in msg.content  # thought (up to the budget), then answered
    if "extra_body" in fmt:
        assert re.fullmatch(AGE_RX, msg.content), msg.content
    else:
        assert isinstance(json.loads(msg.content)["age"], int)
    details = r.usage.completion_tokens_details
    assert details is not None and 0 < details.reasoning_tokens <= BUDGET + len(CLOSE)
