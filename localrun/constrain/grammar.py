"""``Constraint`` → llguidance grammar text, and the honesty check.

A schema a client marks ``strict`` (``Constraint.strict``: OpenAI's ``strict: true``) is enforced exactly or
refused: what llguidance cannot enforce is a ``ConstraintError`` naming the keyword and where it is. Any other
JSON schema (a tool's ``parameters``, a ``response_format`` without ``strict``) describes, as it does for the
hosted APIs: it is compiled with llguidance's ``lenient`` and ``coerce_one_of`` options (llguidance
docs/json_schema.md), so a keyword it cannot enforce (``propertyNames``, ``uniqueItems``, an unknown
``format``) is left out of the grammar and ``oneOf`` is enforced as ``anyOf`` (exact when its branches are
disjoint). What was relaxed is logged once per schema (``relaxed``, logger ``localrun.constrain``), and a tool
call's arguments are checked against the whole schema after generation (``argument_errors``).

Kinds (``backends.base.Constraint.kind``): ``json_schema`` (a JSON Schema dict), ``json_object`` (any JSON
object: OpenAI's JSON mode, Ollama's ``format: "json"``), ``regex`` (Rust ``regex`` syntax, anchored at
both ends), ``lark`` (llguidance's Lark dialect, guidance-ai/llguidance docs/syntax.md), ``gbnf``
(llama.cpp grammars/README.md; converted to Lark by llguidance's ``gbnf_to_lark``).

JSON is generated on one line with ``", "`` and ``": "`` separators (``JSON_OPTIONS``): no free
whitespace, so the value ends where it closes and JSON mode cannot run on to ``max_tokens`` in blanks.
"""

from __future__ import annotations

import json
import logging
import re

from localrun.backends.base import Constraint
from localrun.errors import BackendUnavailableError, ConstraintError

log = logging.getLogger("localrun.constrain")
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# a schema that is not strict: unenforceable keywords dropped (a warning each), oneOf enforced as anyOf
LENIENT_OPTIONS = {**JSON_OPTIONS, "lenient": True, "coerce_one_of": True}
_LOGGED: dict[str, None] = {}  # the relaxed schemas already logged (insertion-ordered, bounded)
KINDS = ("json_schema", "json_object", "regex", "lark", "gbnf")
# keys under which a schema names things (property names, definitions) rather than using keywords
_NAME_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
_DATA_KEYS = {"enum", "const", "default", "examples", "required"}  # values are data, not schemas


def llguidance():
    """The ``llguidance`` module, or BackendUnavailableError saying how to install it."""
    try:
        import llguidance as llg
    except ImportError as e:  # pragma: no cover - a dependency; only a broken install lacks it
        raise BackendUnavailableError(f"constrained decoding needs llguidance ({e})",
                                      hint="pip install llguidance") from None
    return llg


def compile_grammar(c: Constraint) -> str:
    """``c`` → llguidance grammar text (no tokenizer needed). Raises ConstraintError for a bad ``kind``,
    a source of the wrong type, or a GBNF grammar llguidance's converter cannot read."""
    llg = llguidance()
    M = llg.LLMatcher
    where = c.param or c.kind
    if c.kind == "json_object":
        return M.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if c.kind == "json_schema":
        if not isinstance(c.source, dict):
            raise ConstraintError(f"{where}: a JSON schema must be an object, got {type(c.source).__name__}",
                                  param=c.param, hint="send the schema as a JSON object")
        return M.grammar_from_json_schema(c.source, defaults=json_options(c.strict))
    if not isinstance(c.source, str) or not c.source:
        raise ConstraintError(f"{where}: a {c.kind} constraint needs a non-empty string", param=c.param,
                              hint=f"send the {c.kind} as a string")
    if c.kind == "regex":
        return M.grammar_from_regex(c.source)
    if c.kind == "lark":
        return M.grammar_from_lark(c.source)
    if c.kind == "gbnf":
        return M.grammar_from_lark(gbnf_to_lark(c.source, param=c.param))
    raise ConstraintError(f"unknown constraint kind {c.kind!r} (one of {', '.join(KINDS)})", param=c.param)


def json_options(strict: bool) -> dict:
    """llguidance's JSON options (``x-guidance``) for a schema: exact when ``strict``, else lenient."""
    return JSON_OPTIONS if strict else LENIENT_OPTIONS


def gbnf_to_lark(gbnf: str, *, param: str = "") -> str:
    """A llama.cpp GBNF grammar → llguidance Lark (llguidance's own converter; Lark text passes through).
    Raises ConstraintError when it cannot convert (the caller may fall back to llama.cpp's grammar
    sampler, which reads GBNF itself)."""
    llguidance()
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(gbnf)
    except Exception as e:  # the converter raises its own error types and assorted parse errors
        raise ConstraintError(f"{param or 'grammar'}: cannot convert this GBNF grammar: {e}", param=param,
                              hint="check the grammar against llama.cpp grammars/README.md") from None


def check(c: Constraint, tokenizer=None) -> str:
    """Compile ``c`` and validate it (with ``tokenizer``, an ``LLTokenizer``, when given) → the grammar.

    Raises ConstraintError naming what llguidance cannot enforce: an unimplemented JSON Schema keyword
    (``keyword`` and its JSON Pointer ``path``), an unknown ``format`` (both only for a ``strict`` schema:
    any other is relaxed and logged, module docstring), an invalid regex or grammar.
    """
    grammar = compile_grammar(c)
    is_error, msgs = llguidance().LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if is_error:
        raise explain(c, msgs[0] if msgs else "invalid grammar")
    if c.kind == "json_schema" and isinstance(c.source, dict) and bad_pattern(c.source) is not None:
        raise explain(c, "regex")  # a pattern Rust's regex crate reads but JSON Schema's dialect refuses (^+)
    if msgs and not c.strict and c.kind == "json_schema":  # (a tool grammar's schemas were logged per tool)
        relaxed(c, msgs)
    return grammar


def relaxed(c: Constraint, warnings: list[str]) -> str:
    """Log (once per schema and field) what the lenient compile of ``c`` left out → the log line's text."""
    what = "; ".join(sorted({" ".join(w.split())[:200] for w in warnings}))
    line = (f"{c.param or c.kind}: enforced as far as constrained decoding can ({what}); the rest is checked "
            "after generation")
    key = line + "\0" + cache_key(c)
    if key not in _LOGGED:
        _LOGGED[key] = None
        while len(_LOGGED) > 512:
            _LOGGED.pop(next(iter(_LOGGED)))
        log.info("%s", line)
    return line


def argument_errors(schema, args) -> list[str]:
    """``args`` (a tool call's parsed arguments) checked against ``schema`` (the tool's whole ``parameters``,
    the keywords the grammar could not enforce included) with ``jsonschema`` → the violations, each
    ``"<JSON Pointer>: <message>"``; [] when valid or when ``schema`` is not a valid JSON Schema."""
    if not isinstance(schema, dict) or not schema:
        return []
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        errs = sorted(cls(schema).iter_errors(args), key=lambda e: list(e.absolute_path))
    except Exception:  # a schema jsonschema cannot evaluate (bad $ref, unknown type): the call goes unchecked
        return []
    return [f"/{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in errs[:5]]


def explain(c: Constraint, msg: str) -> ConstraintError:
    """llguidance's validation message → a ConstraintError that says which keyword, where."""
    where = c.param or c.kind
    m = re.search(r"Unimplemented keys: \[([^\]]*)\]", msg)
    if m and isinstance(c.source, dict):
        keys = [k.strip().strip('"') for k in m.group(1).split(",") if k.strip()]
        found = [(k, p) for k in keys for p in keyword_paths(c.source, k)]
        key, path = found[0] if found else (keys[0] if keys else None, "")
        also = sorted({f"'{k}' at {_where(p)}" for k, p in found[1:]})
        return ConstraintError(
            f"{where}: JSON Schema keyword '{key}' at {_where(path)} cannot be enforced by constrained "
            "decoding" + (f"; also {', '.join(also)}" if also else ""),
            keyword=key, path=path, param=c.param)
    m = re.search(r"Unknown format: (\S+)", msg)
    if m and isinstance(c.source, dict):
        fmt = m.group(1)
        paths = [p for p in keyword_paths(c.source, "format") if _at(c.source, p) == fmt]
        path = paths[0] if paths else ""
        return ConstraintError(f"{where}: string format '{fmt}' at {_where(path)} cannot be enforced by "
                               "constrained decoding", keyword="format", path=path, param=c.param,
                               hint="use a 'pattern' instead, or one of the formats llguidance knows "
                               "(date-time, date, time, email, uri, uuid, ipv4, ipv6, hostname, ...)")
    if isinstance(c.source, dict) and "regex" in msg:
        bad = bad_pattern(c.source)
        if bad is not None:
            path, pat, why = bad
            return ConstraintError(f"{where}: the pattern {pat!r} at {path} is not a valid regex: {why}",
                                   keyword="pattern", path=path, param=c.param,
                                   hint="patterns use Rust regex syntax (no look-around or back-references)")
    first = " ".join(msg.split())[:300] or "invalid"
    return ConstraintError(f"{where}: cannot enforce this {c.kind.replace('_', ' ')}: {first}", param=c.param,
                           hint="check the schema/regex/grammar; see llguidance's docs/json_schema.md and "
                           "docs/syntax.md for what it takes")


def strict_schema(schema):
    """OpenAI's ``strict: true`` on a ``json_schema``: every object is closed and every property required
    (OpenAI Structured Outputs). → a copy of ``schema`` where each object subschema with ``properties``
    gets ``additionalProperties: false`` (unless it already says false) and ``required`` = all of its
    properties, so a small model cannot add keys until ``max_tokens``. An object that asks for more
    (``additionalProperties`` true or a schema) is refused by OpenAI under ``strict``; here it is closed too,
    as strict means. Data (enum/const/default/examples) is left as it is."""
    if isinstance(schema, list):
        return [strict_schema(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in _DATA_KEYS:
            out[k] = v
        elif k in _NAME_MAPS and isinstance(v, dict):
            out[k] = {name: strict_schema(sub) for name, sub in v.items()}
        elif isinstance(v, (dict, list)):
            out[k] = strict_schema(v)
        else:
            out[k] = v
    is_object = out.get("type") == "object" or (isinstance(out.get("type"), list) and "object" in out["type"])
    if isinstance(out.get("properties"), dict) or (is_object and "additionalProperties" not in out):
        props = out.get("properties") if isinstance(out.get("properties"), dict) else {}
        out["additionalProperties"] = False
        out["required"] = list(props)
    return out


def bad_pattern(schema) -> tuple[str, str, str] | None:
    """The first ``pattern`` in ``schema`` (or ``patternProperties`` key) that is not a regex llguidance
    takes (Rust ``regex`` syntax) or that repeats nothing (``_repeats_nothing``) → (JSON Pointer, the
    pattern, the reason); None when all are valid."""
    M = llguidance().LLMatcher
    found = [(p, "pattern") for p in keyword_paths(schema, "pattern")]
    found += [(p, "patternProperties") for p in keyword_paths(schema, "patternProperties")]
    for path, key in found:
        node = _node(schema, path)
        if not isinstance(node, dict):
            continue
        items = ([(f"{path}/pattern", node.get("pattern"))] if key == "pattern"
                 else [(f"{path}/patternProperties/{_escape(k)}", k) for k in (node.get(key) or {})])
        for where, pat in items:
            if not isinstance(pat, str):
                return where, repr(pat), "a pattern must be a string"
            is_error, msgs = M.validate_grammar_with_warnings(M.grammar_from_regex(pat), None)
            if is_error:
                why = " ".join((msgs[0] if msgs else "invalid").split())
                why = re.split(r" \d+ \| ", why.rsplit("error: ", 1)[-1])[0]  # the reason, not the echo
                return where, pat, why[:200]
            why = _repeats_nothing(pat)
            if why:
                return where, pat, why
    return None


def _repeats_nothing(pattern: str) -> str | None:
    """Why ``pattern`` is no regex in JSON Schema's dialect (ECMA-262) though Rust's ``regex`` crate reads it:
    a quantifier with nothing to repeat (``^+``, ``(*a)``) or on another quantifier (``a**``), which Rust
    takes as something else (``^+`` as ``^``) and ECMAScript refuses. Python's ``re`` parser gives
    ECMAScript's verdict on these two errors (its other errors are its own dialect's, ignored). None: fine."""
    try:
        re.compile(pattern)
    except re.error as e:
        if e.msg in ("nothing to repeat", "multiple repeat"):
            return f"{e.msg} at position {e.pos}"
    return None


def _node(schema, pointer: str):
    node = schema
    for part in [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]:
        node = node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
    return node


def keyword_paths(schema, keyword: str, path: str = "") -> list[str]:
    """JSON Pointers of the (sub)schemas of ``schema`` that use ``keyword``, e.g. ``/properties/tags``.
    Property names and definition names are not keywords; enum/const/default/examples values are data."""
    out: list[str] = []
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            out += keyword_paths(item, keyword, f"{path}/{i}")
        return out
    if not isinstance(schema, dict):
        return out
    if keyword in schema:
        out.append(path)
    for k, v in schema.items():
        sub = f"{path}/{_escape(k)}"
        if k in _DATA_KEYS:
            continue
        if k in _NAME_MAPS and isinstance(v, dict):
            for name, s in v.items():
                out += keyword_paths(s, keyword, f"{sub}/{_escape(name)}")
        elif isinstance(v, (dict, list)):
            out += keyword_paths(v, keyword, sub)
    return out


def _where(pointer: str) -> str:
    return pointer if pointer else "the schema root"


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _at(schema, pointer: str):
    node = schema
    for part in [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]:
        node = node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
    return node.get("format") if isinstance(node, dict) else None


def cache_key(c: Constraint) -> str:
    """A string naming ``c``'s grammar (for caches): kind + canonical JSON of the source."""
    return c.kind + "\0" + json.dumps(c.source, sort_keys=True, separators=(",", ":"))
