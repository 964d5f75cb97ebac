"""Tool-call grammars for the two syntaxes whose arguments are not JSON text (used by ``tools.tool_call_constraint``):

* ``qwen-xml`` (Qwen3.5/3.6; llama.cpp's "Qwen3-Coder" XML format): ``<tool_call>\\n<function=f>\\n`` then one
  ``<parameter=k>\\nVALUE\\n</parameter>\\n`` per argument, ``</function>\\n</tool_call>``. A string VALUE is
  text without ``\\n</parameter>`` (an ``enum`` one of its values); any other is JSON per the property's schema,
  as the templates write them (``args_value | tojson`` for non-strings).
* ``gemma4`` (Gemma 4): ``<|tool_call>call:f{k:VALUE,…}<tool_call|>``, keys bare and sorted (the template's
  ``dictsort``), strings quoted ``<|"|>…<|"|>``, numbers and ``true``/``false`` bare, objects and arrays in the
  same notation (``format_argument``).

Required properties are always written; optional ones may be; a tool without ``properties`` takes any
arguments (qwen-xml: none). Property schemas are enforced by JSON type only in ``gemma4`` (its values are
not JSON); ``qwen-xml`` enforces each non-string property's whole schema (llguidance ``%json``).
"""

from __future__ import annotations

import json


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _props(fn: dict) -> tuple[dict, set]:
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    return props, set(params.get("required") or [])


def _enum(schema: dict) -> list[str] | None:
    values = schema.get("enum") if isinstance(schema, dict) else None
    return values if isinstance(values, list) and values and all(isinstance(v, str) for v in values) else None


# ------------------------------------------------------------------------------------------------- qwen-xml


def qwen_xml_lark(fns: list[dict], parallel: bool, json_rule) -> str:
    """The Lark grammar for one call (``parallel``: one or more) of any of ``fns``; ``json_rule(schema)``
    writes the ``%json`` expression for a non-string value."""
    # a string value with its close (one lexeme, so the text cannot run into the close): the first "\n</parameter>\n"
    rules = ['XML_TEXT: /(?s:.*)\\n<\\/parameter>\\n/ & ~/(?s:.*\\n<\\/parameter>\\n.+)/']
    alts = []
    for i, f in enumerate(fns):
        props, required = _props(f)
        items = []
        for j, (key, schema) in enumerate(props.items()):
            if _enum(schema):
                value = "(" + " | ".join(_lit(v) for v in _enum(schema)) + ")"
            elif isinstance(schema, dict) and schema.get("type") == "string":
                value = "XML_TEXT"
            else:
                value = f"v{i}_{j}"
                rules.append(f"v{i}_{j}: {json_rule(schema if isinstance(schema, dict) else {})}")
            close = "" if value == "XML_TEXT" else " " + _lit(chr(10) + "</parameter>" + chr(10))
            item = f'{_lit(f"<parameter={key}>" + chr(10))} {value}{close}'
            items.append(item if key in required else f"({item})?")
        head = _lit(f"<tool_call>\n<function={f['name']}>\n")
        alts.append(" ".join([head, *items, _lit("</function>\n</tool_call>")]))
    more = f' ({_lit(chr(10))} call)*' if parallel else ""
    return f"start: call{more}\ncall: " + " | ".join(alts) + "\n" + "\n".join(rules) + "\n"


# --------------------------------------------------------------------------------------------------- gemma4

_GEMMA_RULES = r'''
G_STR: /<\|"\|>(?s:.*)<\|"\|>/ & ~/<\|"\|>(?s:.*<\|"\|>.*)<\|"\|>/
G_KEY: /[A-Za-z_][A-Za-z0-9_.\-]*/
G_INT: /-?(0|[1-9][0-9]*)/
G_NUM: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/
gstr: G_STR
gbool: "true" | "false"
gval: gstr | G_NUM | gbool | gobj | garr
gpair: G_KEY ":" gval
gpairs: gpair ("," gpair)*
gobj: "{" gpairs? "}"
garr: "[" (gval ("," gval)*)? "]"
'''


def _gemma_value(schema: object) -> str:
    if not isinstance(schema, dict):
        return "gval"
    if _enum(schema):
        return "(" + " | ".join(_lit('<|"|>' + v + '<|"|>') for v in _enum(schema)) + ")"
    return {"string": "gstr", "integer": "G_INT", "number": "G_NUM", "boolean": "gbool", "object": "gobj",
            "array": "garr"}.get(schema.get("type"), "gval")


def gemma4_lark(fns: list[dict], parallel: bool) -> str:
    """The Lark grammar for one call (``parallel``: one or more) of any of ``fns`` in Gemma 4's notation."""
    alts = []
    for f in fns:
        props, required = _props(f)
        item = {k: f"{_lit(k + ':')} {_gemma_value(props[k])}" for k in props}
        req = [k for k in sorted(props) if k in required]
        opt = [k for k in sorted(props) if k not in required]
        if not props:
            args = "gpairs?"
        elif req:  # the required ones in order, then any optional one after a comma
            args = f" {_lit(',')} ".join(item[k] for k in req) + "".join(f" ({_lit(',')} {item[k]})?" for k in opt)
        else:
            one = "(" + " | ".join(item[k] for k in opt) + ")"
            args = f"({one} ({_lit(',')} {one})*)?"
        alts.append(f"{_lit('<|tool_call>call:' + f['name'] + '{')} {args} {_lit('}<tool_call|>')}")
    more = " call*" if parallel else ""
    return f"start: call{more}\ncall: " + " | ".join(alts) + "\n" + _GEMMA_RULES.lstrip("\n")
