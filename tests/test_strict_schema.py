"""Structured output that is what was asked (issue 34, item 2): OpenAI ``strict: true`` closes every object
and requires every property; an invalid ``pattern`` is a 400 naming its JSON Pointer; a reply cut by length
before a strict constraint completes says so; ``/v1/completions`` applies ``response_format``."""

from __future__ import annotations

import pytest

from localrun.errors import ConstraintError

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
    "meta": {"type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2]}}, "required": []},
}}


def _rf(schema, strict):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}


def test_strict_closes_every_object_and_requires_every_property():
    from localrun.constrain.grammar import strict_schema

    s = strict_schema(SCHEMA)
    assert s["additionalProperties"] is False and s["required"] == ["name", "tags", "meta"]
    assert s["properties"]["tags"]["items"] == {"type": "object", "properties": {"k": {"type": "string"}},
                                                "additionalProperties": False, "required": ["k"]}
    assert s["properties"]["meta"]["required"] == ["n"] and s["properties"]["meta"]["additionalProperties"] is False
    assert s["properties"]["meta"]["properties"]["n"]["enum"] == [1, 2]  # data untouched
    assert SCHEMA["properties"]["meta"]["required"] == []  # the request's own schema is not changed


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_openai_strict_reaches_the_constraint_on_chat_and_completions(route):
    from localrun.server.openai.convert import sampling_from_openai
    from localrun.server.openai.schemas import ChatCompletionRequest, CompletionRequest

    base = {"messages": []} if route == "chat" else {"prompt": "x"}
    model = ChatCompletionRequest if route == "chat" else CompletionRequest
    p = sampling_from_openai(model.model_validate({**base, "response_format": _rf(SCHEMA, True)}),
                             max_tokens=None, logprobs=None)
    assert p.constraint.strict and p.constraint.source["additionalProperties"] is False
    p = sampling_from_openai(model.model_validate({**base, "response_format": _rf(SCHEMA, False)}),
                             max_tokens=None, logprobs=None)
    assert not p.constraint.strict and "additionalProperties" not in p.constraint.source


@pytest.mark.parametrize("pattern", ["*abc", "a{2,1}", "(?<=a)b", "^+[a-z]$", "a**"])
def test_an_invalid_pattern_is_refused_naming_its_json_pointer(pattern):
    """Rust's regex crate reads ``^+`` (as ``^``) and ``a**``; JSON Schema's dialect (ECMA-262) refuses them."""
    pointer = "/properties/code/pattern"
    from localrun.server.openai.convert import sampling_from_openai
    from localrun.server.openai.schemas import ChatCompletionRequest

    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}}
    with pytest.raises(ConstraintError) as e:
        sampling_from_openai(ChatCompletionRequest.model_validate({"messages": [], "response_format":
                                                                   _rf(schema, True)}),
                             max_tokens=None, logprobs=None)
    assert pointer in str(e.value) and e.value.path == pointer and "not a valid regex" in str(e.value)
    from localrun.server.errors import error_info

    assert error_info(e.value)[0] == 400


def test_anthropic_format_is_checked_before_it_runs():
    from localrun.server.anthropic.convert import sampling_from_anthropic
    from localrun.server.anthropic.schemas import MessagesRequest

    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                                          "output_config": {"format": {"type": "json_schema", "schema": {
                                              "type": "string", "pattern": "*x"}}}})
    with pytest.raises(ConstraintError) as e:
        sampling_from_anthropic(req)
    assert e.value.path == "/pattern"


def test_a_strict_reply_cut_by_length_carries_an_error():
    from localrun.backends.base import Constraint, SamplingParams
    from localrun.server.openai.convert import chat_response, mark_incomplete

    strict = SamplingParams(constraint=Constraint("json_schema", {}, "response_format.json_schema.schema", True))
    loose = SamplingParams(constraint=Constraint("json_schema", {}, "response_format.json_schema.schema"))
    body = mark_incomplete(chat_response("id", 0, "m", '{"a": "aaa', "length", None), strict, "length")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["error"]["code"] == "incomplete_structured_output"
    assert "does not validate" in choice["error"]["message"]
    assert "error" not in mark_incomplete(chat_response("id", 0, "m", "{}", "stop", None), strict, "stop")["choices"][0]
    body = mark_incomplete(chat_response("id", 0, "m", '{"a', "length", None), loose, "length")
    assert body["choices"][0]["finish_reason"] == "length" and "error" not in body["choices"][0]


# ---------------------------------------------------------------------------------------------- a live server
@pytest.fixture(scope="module")
def served(smollm_path, tmp_path_factory):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "clients"))
    from harness import Serve

    srv = Serve(smollm_path, tmp_path_factory.mktemp("strict"))
    try:
        yield srv
    finally:
        srv.close()


@pytest.mark.model
def test_strict_through_the_openai_client_validates_or_says_it_does_not(served):
    import json

    import jsonschema
    import openai

    from localrun.constrain.grammar import strict_schema

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x")
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer"}}}
    for max_tokens in (4, 120):
        r = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Describe Paris as JSON."}], temperature=0,
            max_tokens=max_tokens, response_format={"type": "json_schema", "json_schema": {
                "name": "city", "schema": schema, "strict": True}})
        choice = r.choices[0].model_dump()
        if choice["finish_reason"] == "length":
            assert choice["error"]["code"] == "incomplete_structured_output", choice
        else:
            value = json.loads(r.choices[0].message.content)
            jsonschema.validate(value, strict_schema(schema))
            assert set(value) == {"city", "population"}
    assert max_tokens == 120 and r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.model
@pytest.mark.parametrize("pattern", ["*abc", "^+[a-z]$"])
def test_an_invalid_pattern_is_a_400_through_openai_and_curl(served, pattern):
    import json
    import subprocess

    import openai

    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}}
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "c", "schema": schema, "strict": pattern == "*abc"}})
    assert "/properties/code/pattern" in str(e.value)
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 5,
                       "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})
    out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "-H", "Content-Type: application/json", "-d", body,
                          served.url + "/v1/completions"], capture_output=True, text=True, timeout=120).stdout
    text, code = out.rsplit("\n", 1)
    assert code == "400" and "/properties/code/pattern" in text


@pytest.mark.model
def test_completions_apply_response_format(served):
    import json

    import openai

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x")
    r = client.completions.create(model="m", prompt="A JSON object describing a cat:", max_tokens=60, temperature=0,
                                  extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                      "name": "cat", "strict": True, "schema": {
                                          "type": "object", "properties": {"name": {"type": "string",
                                                                                    "maxLength": 12}}}}}})
    choice = r.choices[0]
    if choice.finish_reason == "length":
        assert choice.model_dump()["error"]["code"] == "incomplete_structured_output"
    else:
        assert set(json.loads(choice.text)) == {"name"}
