"""``tool_call_constraint``: a grammar that makes the model write one tool call, in its template family's
syntax, whose arguments match the tool's JSON Schema (``tool_choice: "required"`` or a named function).

Syntaxes (as ``localrun.dialects.calls`` parses them; the family names are ``dialects.Family.tools``):

* ``hermes`` (Hermes, Qwen; also the default for a family without one):
  ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``
* ``llama3``: ``{"name": "f", "parameters": {...}}`` (bare JSON, Llama 3.1/3.2's JSON tool calling)
* ``mistral``: ``[TOOL_CALLS][{"name": "f", "arguments": {...}}]``
* ``deepseek``: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\\n```json\\n{...}\\n```
  <｜tool▁call▁end｜><｜tool▁calls▁end｜>`` (DeepSeek-R1 / V3)
* ``harmony`` (gpt-oss): ``<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}``
* ``qwen-xml`` (Qwen3.5/3.6) and ``gemma4`` (Gemma 4): arguments that are not JSON text, see ``tool_markup``
* ``generic`` (a template without tool syntax; llama.cpp ``common_chat_params_init_generic``):
  ``{"tool_call": {"name": "f", "arguments": {...}}}`` or, parallel, ``{"tool_calls": [{...}, ...]}``;
  ``generic_constraint`` also offers the plain answer ``{"response": "..."}`` (``tool_choice: auto``)

Markers are matched as text (the model may write them with its control token or with ordinary
pieces; the reply parser reads the text either way).
"""

from __future__ import annotations

import json

from localrun.backends.base import Constraint
from localrun.constrain import tool_markup
from localrun.constrain.grammar import check, json_options
from localrun.constrain.thinking import thinking_prefix
from localrun.errors import ConstraintError

SYNTAXES = ("hermes", "llama3", "mistral", "deepseek", "harmony", "qwen-xml", "gemma4", "generic")


def tool_call_constraint(family, tools: list[dict], name: str | None = None, *,
                         parallel: bool = False) -> Constraint:
    """A ``Constraint`` (kind ``lark``) forcing a call of ``name`` (or of any tool in ``tools`` when None)
    in the family's tool-call syntax (see the module docstring).

    ``family``: a ``dialects.Family`` (its ``tools`` syntax; a thinking family's block may come first:
    required when the template opens it, optional otherwise), or the syntax name itself, or None
    (→ ``hermes``). ``tools``: OpenAI tool definitions (``{"type": "function", "function": {"name",
    "parameters"}}``, or the bare function objects); the arguments follow each tool's ``parameters``
    schema (none: any JSON object), exactly for a tool marked ``strict: true``, as far as llguidance can for
    the others (``grammar`` module docstring: lenient). ``parallel``: one or more calls (hermes: one block
    after another; mistral: several in the list), else exactly one. Raises ConstraintError for an unknown
    syntax, no tools, a ``name`` not among them, or a strict tool's schema llguidance cannot enforce
    (keyword and path named)."""
    syntax = getattr(family, "tools", family) or "hermes"
    if syntax not in SYNTAXES:
        raise ConstraintError(f"no tool-call grammar for the {syntax!r} syntax (known: {', '.join(SYNTAXES)})",
                              param="tool_choice", hint="use tool_choice 'auto' with this model")
    fns = _functions(tools, name)
    if syntax == "generic":
        body = _generic_lark(fns, parallel, required=True)
    elif syntax == "qwen-xml":
        body = tool_markup.qwen_xml_lark(fns, parallel, _json)
    elif syntax == "gemma4":
        body = tool_markup.gemma4_lark(fns, parallel)
    else:
        body = _lark(syntax, fns, parallel)
    thinking = getattr(family, "thinking", None)
    if thinking is not None and thinking.open and thinking.close:
        body = _with_thinking(body, thinking)
    return Constraint("lark", body, param="tool_choice")


def generic_constraint(tools: list[dict], name: str | None = None, *, required: bool = False,
                       parallel: bool = False, response: dict | None = None, answer_only: bool = False) -> Constraint:
    """A ``Constraint`` (kind ``lark``) for the generic format's whole answer: one JSON object that calls
    ``name`` (or any tool in ``tools``), or, unless ``required`` or ``name``, answers
    ``{"response": ...}``: a string, or what ``response`` (a JSON Schema: the request's response format)
    allows. ``parallel``: calls as the ``tool_calls`` array (one or more), else one ``tool_call``. The
    layout is localrun's JSON layout (``JSON_OPTIONS``). The shape is llama.cpp's
    ``common_chat_params_init_generic`` without its model-written call ``id``s (localrun makes the ids).
    ``answer_only`` (``tool_choice`` none): only the ``{"response": ...}`` object.
    Raises ConstraintError as ``tool_call_constraint`` does."""
    if answer_only:
        return Constraint("lark", f"start: reply\nreply: {_json(_answer_schema(response))}\n", param="tool_choice")
    fns = _functions(tools, name)
    return Constraint("lark", _generic_lark(fns, parallel, required=required or name is not None,
                                            response=response), param="tool_choice")


def _answer_schema(response: dict | None) -> dict:
    return {"type": "object", "properties": {"response": response or {"type": "string"}}, "required": ["response"],
            "additionalProperties": False}


def _functions(tools: list[dict], name: str | None) -> list[dict]:
    """The function objects of ``tools`` (only ``name`` when given), their parameters checked."""
    fns = [t.get("function", t) if isinstance(t, dict) else {} for t in tools or []]
    fns = [f for f in fns if isinstance(f.get("name"), str) and f["name"]]
    if name is not None:
        fns = [f for f in fns if f["name"] == name]
    if not fns:
        missing = f"no tool named {name!r}" if name is not None else "no tools"
        raise ConstraintError(f"tool_choice needs a tool to call: {missing} in 'tools'", param="tool_choice",
                              hint="name one of the functions listed in 'tools'")
    for f in fns:  # a strict tool's unenforceable schema: 400 naming the tool, keyword and path; else relaxed
        check(Constraint("json_schema", _params(f), param=f"tools[{f['name']}].function.parameters",
                         strict=is_strict(f)))
    return fns


def is_strict(fn: dict) -> bool:
    """Whether the client marked a tool ``strict: true`` (its schema enforced exactly or refused)."""
    return fn.get("strict") is True


def _generic_lark(fns: list[dict], parallel: bool, *, required: bool, response: dict | None = None) -> str:
    calls = [_call_schema(f, "arguments") for f in fns]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel:
        call = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
                "required": ["tool_calls"], "additionalProperties": False}
    else:
        call = {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"],
                "additionalProperties": False}
    schema = call if required else {"anyOf": [call, _answer_schema(response)]}
    return f"start: reply\nreply: {_json(schema)}\n"


def _with_thinking(body: str, t) -> str:
    """``body`` (a Lark grammar with ``start``) preceded by the thinking block (``thinking.thinking_prefix``)."""
    head, think = thinking_prefix(t)
    return body.replace("start:", f"start: {head} body\nbody:", 1) + think


def _params(fn: dict) -> dict:
    p = fn.get("parameters")
    return p if isinstance(p, dict) and p else {"type": "object"}


def _json(schema: dict, strict: bool = False) -> str:
    """``%json {...}`` with localrun's JSON layout (one line, ", " and ": " separators), lenient unless
    ``strict`` (a strict tool's schema was checked exactly in ``_functions``: lenient changes nothing there)."""
    return "%json " + json.dumps(dict(schema, **{"x-guidance": json_options(strict)}))


def _call_schema(fn: dict, args_key: str) -> dict:
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, args_key: _params(fn)},
            "required": ["name", args_key], "additionalProperties": False}


def _lark(syntax: str, fns: list[dict], parallel: bool) -> str:
    def lit(s: str) -> str:
        return json.dumps(s, ensure_ascii=False)

    if syntax in ("hermes", "llama3", "mistral"):
        key = "parameters" if syntax == "llama3" else "arguments"
        schema = {"anyOf": [_call_schema(f, key) for f in fns]} if len(fns) > 1 else _call_schema(fns[0], key)
        call = _json(schema)
        if syntax == "hermes":
            block = f'{lit("<tool_call>" + chr(10))} call {lit(chr(10) + "</tool_call>")}'
            more = f' ({lit(chr(10))} {block})*' if parallel else ""
            return f"start: {block}{more}\ncall: {call}\n"
        if syntax == "llama3":
            return f"start: call\ncall: {call}\n"
        more = f' ({lit(", ")} call)*' if parallel else ""
        return f'start: {lit("[TOOL_CALLS][")} call{more} {lit("]")}\ncall: {call}\n'
    rules, alts = [], []
    for i, f in enumerate(fns):
        if syntax == "deepseek":
            head = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>" + f["name"] + "\n```json\n"
            tail = "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        else:  # harmony
            head, tail = f"<|channel|>commentary to=functions.{f['name']} <|constrain|>json<|message|>", ""
        rules.append(f"args{i}: {_json(_params(f))}")
        alts.append(f"{lit(head)} args{i}" + (f" {lit(tail)}" if tail else ""))
    return "start: " + " | ".join(alts) + "\n" + "\n".join(rules) + "\n"
