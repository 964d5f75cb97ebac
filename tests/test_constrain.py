"""Constrained decoding without a model (fast tier): what llguidance cannot enforce is refused by keyword
and JSON Pointer, the request fields become one checked constraint, tool-call grammars compile for every
syntax, and ``GrammarControl`` walks a byte vocabulary to outputs that ``jsonschema`` validates."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from localrun.backends.base import Constraint
from localrun.constrain import GrammarControl, check, tool_call_constraint
from localrun.constrain.control import fresh_matcher
from localrun.errors import ConstraintError
from localrun.server.errors import RequestError, error_info
from localrun.server.ollama import convert as cv
from localrun.server.openai import convert as openai_cv
from localrun.server.openai.schemas import ChatCompletionRequest

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "minItems": 1, "maxItems": 3},
    "home": {"$ref": "#/$defs/place"},
    "id": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 9}, {"type": "string", "format": "date"}]}},
    "required": ["name", "age", "tags", "home", "id"], "additionalProperties": False,
    "$defs": {"place": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}},
                        "required": ["city"], "additionalProperties": False}}}


@pytest.mark.parametrize("schema,keyword,path", [
    ({"type": "array", "uniqueItems": True}, "uniqueItems", ""),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {"if": {"type": "array",
                                                                                  "contains": {}}}}}},
     "contains", "/properties/a/properties/if"),
    ({"$defs": {"x/y": {"propertyNames": {"pattern": "a"}}}, "$ref": "#/$defs/x~1y"}, "propertyNames",
     "/$defs/x~1y"),
])
def test_unenforceable_keyword_is_named_with_its_path(schema, keyword, path, caplog):
    """A strict schema is enforced exactly or refused, naming the keyword; any other is relaxed, logged once."""
    with pytest.raises(ConstraintError) as ei:
        check(Constraint("json_schema", schema, param="response_format.json_schema.schema", strict=True))
    e = ei.value
    assert (e.keyword, e.path, e.param) == (keyword, path, "response_format.json_schema.schema")
    assert f"'{keyword}'" in e.message and (path or "the schema root") in e.message
    status, body = error_info(e)
    assert status == 400 and body["error"]["param"] == "response_format.json_schema.schema"
    assert body["error"]["code"] == "unsupported_schema"
    with caplog.at_level("INFO", logger="localrun.constrain"):
        for _ in range(2):  # the same schema again (the next turn of an agent): no second line
            assert check(Constraint("json_schema", schema, param="tools[f].function.parameters"))
    lines = [r.getMessage() for r in caplog.records if r.name == "localrun.constrain"]
    assert len(lines) == 1 and "tools[f].function.parameters" in lines[0] and keyword in lines[0]


def test_a_relaxed_schema_still_enforces_what_it_can_and_the_rest_is_checked_after(byte_tokenizer):
    """propertyNames (Claude Code's TaskCreate) is left out of the grammar; the arguments are checked
    against the whole schema afterwards; oneOf with overlapping branches becomes anyOf (Qwen Code)."""
    from localrun.constrain.grammar import argument_errors

    schema = {"type": "object", "properties": {"metadata": {"type": "object", "propertyNames": {"maxLength": 3}},
                                               "n": {"type": "integer"}}, "required": ["n"]}
    c = Constraint("json_schema", schema)
    check(c)
    for seed in range(5):  # the enforceable part still holds: every finished output has an integer n
        ctl = GrammarControl(fresh_matcher(c, byte_tokenizer), 257)
        out, finish = _walk(ctl, random.Random(seed), 300)
        ctl.close()
        if finish == "stop":
            assert isinstance(json.loads(out)["n"], int)
    assert argument_errors(schema, {"n": 1, "metadata": {"ab": 1}}) == []
    assert argument_errors(schema, {"n": 1, "metadata": {"long-key": 1}})[0].startswith("/metadata:")
    assert argument_errors(schema, {"n": "x"}) == ["/n: 'x' is not of type 'integer'"]
    one_of = {"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "maxLength": 2}]}
    with pytest.raises(ConstraintError, match="coerce_one_of|oneOf"):
        check(Constraint("json_schema", one_of, strict=True))
    check(Constraint("json_schema", one_of))


def test_unknown_format_bad_regex_and_bad_kind_are_refused():
    with pytest.raises(ConstraintError, match="format 'colour' at /properties/c") as ei:
        check(Constraint("json_schema", {"properties": {"c": {"type": "string", "format": "colour"}}}, strict=True))
    assert ei.value.keyword == "format" and ei.value.path == "/properties/c"
    with pytest.raises(ConstraintError, match="look-around"):
        check(Constraint("regex", "(?=a)b", param="regex"))
    with pytest.raises(ConstraintError, match="unknown constraint kind"):
        check(Constraint("yaml", "a: 1"))
    with pytest.raises(ConstraintError, match="must be an object"):
        check(Constraint("json_schema", "[]"))


def _req(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **kw})


def test_request_fields_become_one_checked_constraint():
    def params(**kw):
        return openai_cv.sampling_from_openai(_req(**kw), max_tokens=None, logprobs=None)

    assert params().constraint is None and params(response_format={"type": "text"}).constraint is None
    assert params(response_format={"type": "json_object"}).constraint.kind == "json_object"
    c = params(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON,
                                                                       "strict": True}}).constraint
    assert (c.kind, c.source, c.param) == ("json_schema", PERSON, "response_format.json_schema.schema")
    assert params(response_format={"type": "json_object", "schema": PERSON}).constraint.source == PERSON
    assert params(json_schema=PERSON).constraint.param == "json_schema"
    assert params(regex="[0-9]+").constraint.kind == "regex"
    p = params(grammar='root ::= "yes" | "no"')
    assert p.constraint.kind == "lark" and p.grammar is None
    # GBNF llguidance's converter cannot read goes to llama.cpp's own grammar sampler, unchanged
    odd = 'root ::= [\\U0001F600-\\U0001F64F]'  # valid GBNF (\U escapes), a regex llguidance refuses
    p = params(grammar=odd)
    assert (p.constraint, p.grammar) == (None, odd)
    with pytest.raises(RequestError) as ei:
        params(regex="a", json_schema={"type": "object"})
    assert ei.value.param == "regex"
    # not strict: described, enforced as far as llguidance can (uniqueItems left out); strict: refused
    assert params(json_schema={"type": "array", "uniqueItems": True}).constraint.kind == "json_schema"
    with pytest.raises(ConstraintError) as ei:
        params(response_format={"type": "json_schema", "json_schema": {
            "name": "u", "strict": True, "schema": {"type": "array", "uniqueItems": True}}})
    assert ei.value.param == "response_format.json_schema.schema" and ei.value.keyword == "uniqueItems"
    assert cv.sampling_from_ollama(None, PERSON).constraint.param == "format"
    assert cv.sampling_from_ollama(None, "").constraint is None


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
             "required": ["a", "b"]}}}]


@pytest.mark.parametrize("syntax", ["hermes", "llama3", "mistral", "deepseek", "harmony", None])
def test_tool_call_grammars_compile_for_every_syntax(syntax):
    for name in (None, "add"):
        c = tool_call_constraint(syntax, TOOLS, name, parallel=True)
        assert c.kind == "lark" and c.param == "tool_choice"
        check(c)
        if name:
            assert "get_weather" not in c.source
    with pytest.raises(ConstraintError, match="no tool named 'nope'"):
        tool_call_constraint(syntax, TOOLS, "nope")


def test_a_strict_tools_parameters_that_cannot_be_enforced_are_named():
    bad = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}}}]
    with pytest.raises(ConstraintError) as ei:
        tool_call_constraint("hermes", bad, None)
    assert ei.value.keyword == "uniqueItems" and ei.value.path == "/properties/xs" and "tools[f]" in ei.value.param
    del bad[0]["function"]["strict"]  # a tool that only describes: compiled leniently for every syntax
    for syntax in ("hermes", "llama3", "mistral", "deepseek", "harmony", "generic"):
        check(tool_call_constraint(syntax, bad, None))


# ---------------------------------------------------------------------------------------------- a byte vocab
class _Bytes:
    """A vocabulary of the 256 single bytes plus EOS (id 256): enough for llguidance to run a grammar."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]
    special_token_ids = [256]

    def __call__(self, s):
        return list(s.encode() if isinstance(s, str) else s)


@pytest.fixture(scope="module")
def byte_tokenizer():
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def _walk(ctl: GrammarControl, rng: random.Random, max_tokens: int) -> tuple[bytes, str]:
    out = b""
    for _ in range(max_tokens):
        if ctl.complete():
            return out, "stop"
        tok = ctl.forced()
        if tok is None:
            allowed = [int(t) for t in ctl.mask().nonzero()[0]]
            tok = rng.choice(allowed)
        if tok == 256:
            return out, "stop"
        ctl.accept(tok)
        out += bytes([tok])
    return out, "length"


def test_grammar_control_walks_to_valid_json(byte_tokenizer):
    """Random draws under the mask, 20 seeds: every finished output validates, ends right after the
    value (no trailing blank), and a cut one is a prefix the grammar still accepts."""
    c = Constraint("json_schema", PERSON)
    finished = 0
    for seed in range(20):
        ctl = GrammarControl(fresh_matcher(c, byte_tokenizer), 257)
        out, finish = _walk(ctl, random.Random(seed), 400)
        if finish == "stop":
            finished += 1
            value, end = json.JSONDecoder().raw_decode(out.decode())
            assert end == len(out.decode()), out
            jsonschema.validate(value, PERSON)
            assert ctl.complete()
        ctl.close()
    assert finished >= 15
    ctl = GrammarControl(fresh_matcher(c, byte_tokenizer), 257)
    out, finish = _walk(ctl, random.Random(0), 7)
    assert finish == "length" and len(out) == 7 and out.startswith(b'{"name')
    assert ctl.n_forced > 0  # '{"name": "' is fast-forwarded, not sampled


def test_tool_call_control_writes_a_parseable_call(byte_tokenizer):
    from localrun.dialects import calls

    c = tool_call_constraint("hermes", TOOLS, "add")
    ctl = GrammarControl(fresh_matcher(c, byte_tokenizer), 257)
    out, finish = _walk(ctl, random.Random(3), 300)
    assert finish == "stop", out
    text = out.decode()
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    ((name, args),) = calls.hermes(text[len("<tool_call>"):-len("</tool_call>")])
    assert name == "add" and isinstance(args["a"], int) and isinstance(args["b"], int)
