"""The loop guards inside structured output (docs/architecture.md §2, *Loop guards under a constraint*): DRY
steers among the tokens the grammar allows, the loop guard ends a JSON value that repeats itself, and a
reply cut before its constraint completed (by the loop guard or the token limit) says so on every wire
format that takes a response format. Protocol facts only: never the exact greedy text."""

from __future__ import annotations

import asyncio
import json

import pytest

from localrun.backends.base import Chunk, Constraint, SamplingParams, Stats

JSON_MODE = Constraint("json_object", param="response_format")


# ---------------------------------------------------------------------------------------------- no model
def test_a_loop_under_a_constraint_is_a_cut_on_the_wire():
    from localrun.server.wire import finish_reason, wire_reason

    assert wire_reason("loop", SamplingParams(constraint=JSON_MODE)) == "length"
    assert wire_reason("loop", SamplingParams()) == "loop" and finish_reason("loop") == "stop"
    for reason in ("stop", "length", "cancelled", None):
        assert wire_reason(reason, SamplingParams(constraint=JSON_MODE)) == reason


@pytest.mark.parametrize("strict", [False, True])
def test_openai_choice_cut_by_the_loop_guard_says_so(strict):
    from localrun.server.openai.convert import chat_response, completion_response, mark_incomplete

    p = SamplingParams(constraint=Constraint("json_schema", {}, "response_format.json_schema.schema", strict))
    # chat: the reply pipeline already says "length" (wire_reason) and marks it looped
    choice = mark_incomplete(chat_response("id", 0, "m", '{"a": "ha ha', "length", None), p, "length",
                             looped=True)["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["error"]["code"] == "incomplete_structured_output" and "loop guard" in choice["error"]["message"]
    assert choice["error"]["param"] == "response_format.json_schema.schema"
    # completions: the engine's own "loop"
    choice = mark_incomplete(completion_response("id", 0, "m", '{"a": "ha', "loop", None), p, "loop")["choices"][0]
    assert choice["finish_reason"] == "length" and "loop guard" in choice["error"]["message"]
    # a length cut: the error for strict only (as OpenAI: finish_reason alone says it otherwise)
    choice = mark_incomplete(chat_response("id", 0, "m", '{"a', "length", None), p, "length")["choices"][0]
    assert choice["finish_reason"] == "length" and ("error" in choice) == strict
    if strict:
        assert "token limit" in choice["error"]["message"]
    # free text that looped keeps "stop"; a completed constraint has no error
    free = mark_incomplete(chat_response("id", 0, "m", "ha ha", "loop", None), SamplingParams(), "loop")
    assert free["choices"][0]["finish_reason"] == "stop" and "error" not in free["choices"][0]
    done = mark_incomplete(chat_response("id", 0, "m", "{}", "stop", None), p, "stop")
    assert "error" not in done["choices"][0]


class _Plumbing:
    """The one method of ``ServerState`` that ``reply_events`` reads: the job's chunks."""

    def __init__(self, chunks):
        self._chunks = chunks

    async def chunks(self, job, request=None):
        for c in self._chunks:
            yield c


def _finish_of(params: SamplingParams, reason: str):
    from localrun.server.reply import Finish, ReplyOptions, family_of, reply_events
    from localrun.server.scheduler import Job

    job = Job(loop=None, queue=None, params=params)
    chunks = [Chunk('{"a": "ha', token_id=1), Chunk(" ha", token_id=2, finish_reason=reason, stats=Stats())]

    async def run():
        return [e async for e in reply_events(_Plumbing(chunks), job, family_of(None), ReplyOptions())]

    events = asyncio.run(run())
    assert isinstance(events[-1], Finish)
    return events[-1]


def test_every_wire_format_reports_a_constrained_loop_as_a_cut():
    from localrun.server.anthropic.convert import MessageBuilder
    from localrun.server.ollama.convert import ollama_final_fields
    from localrun.server.responses.resource import final

    p = SamplingParams(constraint=Constraint("json_schema", {}, "text.format.schema"))
    f = _finish_of(p, "loop")
    assert f.reason == "length" and f.looped
    r = final({"id": "resp_x", "output": []}, [], f, p)
    assert r["status"] == "incomplete" and r["incomplete_details"]["reason"] == "max_output_tokens"
    assert "loop guard" in r["incomplete_details"]["message"]
    b = MessageBuilder("m", 3)
    b.finish(f.reason, 1)
    assert b.message()["stop_reason"] == "max_tokens"
    assert ollama_final_fields(f.stats, f.reason, 0.0)["done_reason"] == "length"
    free = _finish_of(SamplingParams(), "loop")  # free text: the loop stays a loop ("stop" on the wire)
    assert free.reason == "loop" and free.looped
    assert final({"id": "resp_x", "output": []}, [], free, SamplingParams())["status"] == "completed"
    plain = _finish_of(p, "length")
    assert plain.reason == "length" and not plain.looped
    assert "message" not in final({"id": "resp_x", "output": []}, [], plain, p)["incomplete_details"]


def test_the_terminal_chat_says_a_cut_structured_answer_is_incomplete():
    from types import SimpleNamespace

    from localrun.chat.session import ChatSession

    def engine(reason: str):
        def generate(prompt, params, **kw):
            yield Chunk('{"a": "ha', token_id=1)
            yield Chunk(" ha", token_id=2, finish_reason=reason, stats=Stats(n_ctx=1024, n_ctx_used=40))

        return SimpleNamespace(model_path="m.gguf", template_source=None, generate=generate)

    schema = Constraint("json_schema", {}, param="--json-schema")
    for reason, notes in (("loop", 2), ("length", 1), ("stop", 0)):
        s = ChatSession(engine(reason), SamplingParams(constraint=schema, stop_loops=True))
        list(s.complete("x"))
        assert len(s.notices) == notes, s.notices
        if notes:
            assert "incomplete" in s.notices[-1] and "--json-schema" in s.notices[-1]
    s = ChatSession(engine("length"), SamplingParams())  # free text cut by --max-tokens: no notice, as before
    list(s.complete("x"))
    assert s.notices == []


# ---------------------------------------------------------------------------------------------- a live server
# SmolLM2-135M at temperature 0 answers this in JSON mode with one string value repeating "ha" until cut
LOOPS = [{"role": "user", "content": "Write a JSON object with a key \"text\" whose value is the word 'ha' "
                                    "written 200 times."}]
LOOP_CAP = 96  # the guard needs a cycle over >= 64 tokens (LoopDetector.min_span): it ends the reply before this


@pytest.fixture(scope="module")
def served(smollm_path, tmp_path_factory):
    """One server for the module, with the loop guard on for every request that does not say otherwise."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "clients"))
    from harness import Serve

    srv = Serve(smollm_path, tmp_path_factory.mktemp("constrained_loops"), "--stop-loops", "--ctx", "1024")
    try:
        yield srv
    finally:
        srv.close()


def _matcher(constraint: Constraint):
    """An llguidance matcher for ``constraint`` over a byte-level vocabulary (256 bytes + EOS = 256): reads
    any text the server sent back, token boundaries aside."""
    from llguidance import LLTokenizer, TokenizerWrapper

    from localrun.constrain.control import fresh_matcher

    class Bytes:
        eos_token_id, bos_token_id = 256, None
        tokens = [bytes([i]) for i in range(256)] + [b""]
        special_token_ids = [256]

        def __call__(self, s: bytes) -> list[int]:
            return list(s)

    return fresh_matcher(constraint, LLTokenizer(TokenizerWrapper(Bytes()), slices=[]))


def _prefix_of(constraint: Constraint, text: str) -> bool:
    """Whether ``text`` is what ``constraint`` allows so far and not yet complete."""
    m = _matcher(constraint)
    return m.consume_tokens(list(text.encode())) and not m.is_error() and not m.is_accepting()


def _loop_count(text: str) -> int:
    """How often the most frequent word of ``text`` occurs (a loop repeats one)."""
    words = text.replace('"', " ").split()
    return max((words.count(w) for w in set(words)), default=0)


def _metric(url: str, reason: str) -> float:
    import httpx

    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("localrun_generations_total{") and f'finish_reason="{reason}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.model
def test_a_json_mode_loop_is_cut_by_the_guard_and_dry_steers_it_out(served):
    """Two paths for the same JSON-mode request. Without DRY the value repeats one word until the loop guard
    (``serve --stop-loops``) ends it before ``max_tokens``: ``finish_reason: length`` with an
    ``incomplete_structured_output`` error naming the guard, the text a valid prefix of the grammar,
    /metrics counting a ``loop``. With DRY (``dry_multiplier``) the model is steered to other tokens the
    grammar allows: a different text with fewer repeats that stays inside the grammar (valid JSON once
    complete, a valid prefix when cut)."""
    import openai

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x")
    loops_before = _metric(served.url, "loop")
    r = client.chat.completions.create(model="m", messages=LOOPS, temperature=0, max_tokens=LOOP_CAP,
                                       response_format={"type": "json_object"}, logprobs=True, top_logprobs=2)
    choice = r.choices[0].model_dump()
    plain = r.choices[0].message.content
    # the loop is the model's greedy path on every CPU: each chosen token leads the next by a wide margin
    # (measured on SmolLM2: ≥ 0.60 nats at the first token, ≥ 2.7 inside the loop; rounding moves ~0.01)
    margins = [t.top_logprobs[0].logprob - t.top_logprobs[1].logprob for t in r.choices[0].logprobs.content
               if len(t.top_logprobs) > 1]
    assert margins and min(margins) > 0.3, min(margins)
    assert choice["finish_reason"] == "length", plain
    assert choice["error"]["code"] == "incomplete_structured_output" and "loop guard" in choice["error"]["message"]
    assert r.usage.completion_tokens < LOOP_CAP  # the guard, not the token limit, ended it
    assert _loop_count(plain) >= 10 and _prefix_of(JSON_MODE, plain)  # cut inside the value, inside the grammar
    assert _metric(served.url, "loop") == loops_before + 1  # /metrics keeps the engine's own reason

    d = client.chat.completions.create(model="m", messages=LOOPS, temperature=0, max_tokens=LOOP_CAP,
                                       response_format={"type": "json_object"}, extra_body={"dry_multiplier": 0.8})
    dry, finish = d.choices[0].message.content, d.choices[0].finish_reason
    print(f"without DRY ({r.usage.completion_tokens} tokens, loop guard): {plain!r}\n"
          f"with DRY ({d.usage.completion_tokens} tokens, {finish}): {dry!r}")
    if finish == "stop":
        assert isinstance(json.loads(dry), dict) and "error" not in d.choices[0].model_dump()
    else:
        assert finish == "length" and _prefix_of(JSON_MODE, dry), dry
    assert dry != plain and _loop_count(dry) < _loop_count(plain)


@pytest.mark.model
def test_a_streamed_loop_says_so_in_its_last_chunk(served):
    import httpx

    body = {"model": "m", "messages": LOOPS, "temperature": 0, "max_tokens": LOOP_CAP, "stream": True,
            "response_format": {"type": "json_object"}}
    events = []
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    last = events[-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["error"]["code"] == "incomplete_structured_output"
    assert all("error" not in e["choices"][0] for e in events[:-1])
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert _prefix_of(JSON_MODE, text)


def _cut_schema() -> dict:
    return {"type": "object", "properties": {"story": {"type": "string", "minLength": 40}}, "required": ["story"],
            "additionalProperties": False}


@pytest.mark.model
def test_a_length_cut_inside_a_value_says_so_on_every_wire_format(served):
    """max_tokens 6 ends each reply inside its first string value: OpenAI chat and completions
    ``finish_reason: length`` (strict: with the error), Responses ``incomplete``, Anthropic ``max_tokens``,
    Ollama ``done_reason: length``."""
    import httpx
    import openai

    ask = [{"role": "user", "content": "Tell a story as JSON."}]
    schema = _cut_schema()
    cons = Constraint("json_schema", schema)
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x")
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
    r = client.chat.completions.create(model="m", messages=ask, temperature=0, max_tokens=6, response_format=rf)
    choice = r.choices[0].model_dump()
    assert choice["finish_reason"] == "length" and choice["error"]["code"] == "incomplete_structured_output"
    assert _prefix_of(cons, r.choices[0].message.content)

    c = client.completions.create(model="m", prompt="A story as JSON: ", temperature=0, max_tokens=6,
                                  extra_body={"response_format": rf})
    choice = c.choices[0].model_dump()
    assert choice["finish_reason"] == "length" and choice["error"]["code"] == "incomplete_structured_output"
    assert _prefix_of(cons, c.choices[0].text)

    resp = client.responses.create(model="m", input="Tell a story as JSON.", temperature=0, max_output_tokens=6,
                                   text={"format": {"type": "json_schema", "name": "s", "schema": schema}})
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert _prefix_of(cons, resp.output_text)

    a = httpx.post(served.url + "/v1/messages", timeout=300, headers={"x-api-key": "x"}, json={
        "model": "m", "max_tokens": 6, "temperature": 0, "messages": ask,
        "output_config": {"format": {"type": "json_schema", "schema": schema}}}).json()
    assert a["stop_reason"] == "max_tokens", a
    assert _prefix_of(cons, "".join(b["text"] for b in a["content"] if b["type"] == "text"))

    o = httpx.post(served.url + "/api/chat", timeout=300, json={
        "model": "m", "messages": ask, "stream": False, "format": schema,
        "options": {"temperature": 0, "num_predict": 6}}).json()
    assert o["done_reason"] == "length", o
    assert _prefix_of(cons, o["message"]["content"])
