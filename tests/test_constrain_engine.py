"""Constrained decoding on the real llama.cpp engine (SmolLM2): schemas validated by ``jsonschema`` over
10 seeds at temperature 1.0, JSON mode ends right after the value, a cut value is a valid prefix, a
constrained and a free request batched together each get their solo text, and an unenforceable keyword is
a 400 naming it through a real server and the ``openai`` client."""

from __future__ import annotations

import json

import jsonschema
import pytest

from localrun.backends.base import Constraint, Message, SamplingParams

pytestmark = pytest.mark.model

N_SEQ = 10
N_FEW = 6  # seeds for the JSON-mode and tool-call draws: each validated one by one
NESTED = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 18, "maximum": 99},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "minItems": 1, "maxItems": 2},
    "address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["zip"], "additionalProperties": False}},
    "required": ["name", "age", "pets", "address"], "additionalProperties": False}
REFS = {"type": "object", "$defs": {"color": {"enum": ["red", "green", "blue"]}},
        "properties": {"color": {"$ref": "#/$defs/color"},
                       "when": {"type": "string", "format": "date"},
                       "size": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 9},
                                          {"enum": ["small", "large"]}]}},
        "required": ["color", "when", "size"], "additionalProperties": False}
ASK = [Message("user", "Describe a person as JSON.")]


@pytest.fixture(scope="module")
def engine(smollm_path):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(smollm_path), n_ctx=1024)
    plan.n_parallel = N_SEQ
    eng = load_engine(smollm_path, plan)
    yield eng
    eng.close()


def _batch(eng, prompt: list[int], params: list[SamplingParams]) -> list[tuple[str, str, list[int]]]:
    """Run one generation per ``params`` together (one slot each) → (text, finish, token ids)."""
    gens = [eng.start(prompt, p, slot=eng.slots[i]) for i, p in enumerate(params)]
    out = {id(g): ["", None, []] for g in gens}
    while not all(g.done for g in gens):
        for g, c in eng.step([g for g in gens if not g.done]):
            o = out[id(g)]
            o[0] += c.text
            o[2].append(c.token_id)
            o[1] = c.finish_reason or o[1]
    for g in gens:
        eng.release(g, keep_kv=False)
    return [tuple(out[id(g)]) for g in gens]


@pytest.mark.parametrize("schema", [NESTED, REFS], ids=["nested-arrays-enums-bounds-pattern", "ref-anyof-format"])
def test_schema_output_validates_over_10_seeds(engine, schema):
    _, prompt = engine.tokenize_chat(ASK)
    c = Constraint("json_schema", schema)
    outs = _batch(engine, prompt, [SamplingParams(temperature=1.0, seed=s, max_tokens=60, constraint=c)
                                   for s in range(N_SEQ)])
    for text, finish, _ in outs:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), schema)
        assert text == text.strip()  # nothing after the value
    assert len({t for t, _, _ in outs}) > 5  # temperature 1.0 really sampled (more than half differ)


def test_json_mode_ends_right_after_the_value_and_a_cut_is_a_prefix(engine):
    from localrun.constrain import GrammarControl
    from localrun.constrain.control import fresh_matcher
    from localrun.constrain.vocab import tokenizer_for

    _, prompt = engine.tokenize_chat([Message("user", "Give me a JSON object with one key.")])
    c = Constraint("json_object")
    outs = _batch(engine, prompt, [SamplingParams(temperature=1.0, seed=s, max_tokens=40, constraint=c)
                                   for s in range(N_FEW)])
    stopped = [t for t, f, _ in outs if f == "stop"]
    assert stopped
    for text in stopped:
        value, end = json.JSONDecoder().raw_decode(text)
        assert isinstance(value, dict) and end == len(text)  # ends right after the closing brace
    for text, finish, ids in outs:
        assert finish in ("stop", "length")
        if finish == "length":
            assert len(ids) == 40
    # max_tokens cutting a schema value: finish length, and the grammar still accepts what was written
    (text, finish, ids), = _batch(engine, prompt, [SamplingParams(temperature=0, max_tokens=6,
                                                                  constraint=Constraint("json_schema", NESTED))])
    assert finish == "length" and len(ids) == 6 and text.startswith('{"name": "')
    ctl = GrammarControl(fresh_matcher(Constraint("json_schema", NESTED), tokenizer_for(engine)), engine.n_vocab)
    for t in ids:
        ctl.accept(t)  # raises if the output left the grammar
    assert not ctl.accepting()


def test_constrained_and_free_requests_in_one_batch_get_their_solo_text(engine):
    _, prompt = engine.tokenize_chat(ASK)
    free = SamplingParams(temperature=0, max_tokens=24)
    cons = SamplingParams(temperature=0, max_tokens=24, constraint=Constraint("json_schema", NESTED))
    regex = SamplingParams(temperature=0, max_tokens=24, constraint=Constraint("regex", r"[A-Z][a-z]+ is [0-9]{2}\."))
    solo = [_batch(engine, prompt, [p])[0] for p in (free, cons, regex)]
    together = _batch(engine, prompt, [free, cons, regex])
    assert [t for t, _, _ in together] == [t for t, _, _ in solo]
    assert solo[0][0] != solo[1][0]  # the mask changed the constrained one's text


def test_hermes_tool_call_is_forced_on_smollm(engine):
    from localrun.constrain import tool_call_constraint
    from localrun.dialects import calls

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}]
    _, prompt = engine.tokenize_chat([Message("user", "What is the weather in Paris?")])
    c = tool_call_constraint("hermes", tools, None)
    for text, finish, _ in _batch(engine, prompt, [SamplingParams(temperature=1.0, seed=s, max_tokens=50,
                                                                  constraint=c) for s in range(N_FEW)]):
        assert finish == "stop", text
        ((name, args),) = calls.hermes(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert name == "get_weather" and isinstance(args["city"], str)


def test_a_strict_schemas_unsupported_keyword_is_a_400_naming_it_and_a_plain_one_is_relaxed(smollm_engine,
                                                                                            tmp_path):
    import openai
    from helpers import ServerThread

    from localrun.config import Settings
    from localrun.server.app import create_app

    srv = ServerThread(create_app(smollm_engine, Settings(home=tmp_path, models_dir=tmp_path / "models")))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
        with pytest.raises(openai.BadRequestError) as ei:
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                           response_format={"type": "json_schema", "json_schema": {
                                               "name": "t", "schema": schema, "strict": True}})
        err = ei.value.body
        assert "uniqueItems" in err["message"] and "/properties/tags" in err["message"]
        assert err["param"] == "response_format.json_schema.schema" and err["code"] == "unsupported_schema"
        # without strict the schema describes: enforced as far as it can be (uniqueItems left out), a 200
        r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Tags as JSON."}],
                                           max_tokens=30, temperature=0, response_format={
                                               "type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
        assert r.choices[0].finish_reason in ("stop", "length")
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
        r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "An age as JSON."}],
                                           max_tokens=30, temperature=0,
                                           extra_body={"json_schema": {"type": "object", "properties": {
                                               "age": {"type": "integer", "minimum": 1, "maximum": 99}},
                                               "required": ["age"]}})
        assert r.choices[0].finish_reason == "stop"
        assert 1 <= json.loads(r.choices[0].message.content)["age"] <= 99
    finally:
        srv.stop()
