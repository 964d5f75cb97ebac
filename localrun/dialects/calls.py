"""Tool-call bodies → ``(name, arguments)`` pairs, one parser per syntax. Pure; never raises.

Each parser takes the text of one call (or one group of calls) without its start marker and returns the
calls, or None when the text is not a well-formed call (the reply parser then gives it back as content).
Shapes follow the templates in tests/data/templates/ and llama.cpp's ``common/chat.cpp`` parsers.
"""

from __future__ import annotations

import ast
import json
import re

Call = tuple[str, dict]
_DECODER = json.JSONDecoder()


def json_prefix(text: str) -> tuple[object, int] | None:
    """The JSON value at the start of ``text`` (leading whitespace skipped) and the index just past it, or
    None while it is incomplete or invalid. An object or array is complete only at its closing bracket, so
    a growing text completes at one fixed position, whatever pieces it arrived in."""
    start = len(text) - len(text.lstrip())
    if start == len(text) or text[start] not in "[{":
        return None
    try:
        value, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        return None
    return value, end


def arguments_of(value: object) -> dict | None:
    """Arguments as an object: a dict as is, a JSON string holding an object decoded (some models
    double-encode), None for anything else. ``None``/missing → ``{}``."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            inner = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            return None
        return inner if isinstance(inner, dict) else None
    return None


def call_of(obj: object) -> Call | None:
    """``{"name": …, "arguments"|"parameters": {…}}`` (Hermes, Llama 3, Mistral) → (name, arguments)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if "function" in obj and isinstance(obj["function"], dict):  # {"type": "function", "function": {...}}
        return call_of(obj["function"])
    args = arguments_of(obj.get("arguments", obj.get("parameters")))
    return None if args is None else (obj["name"], args)


def hermes(body: str) -> list[Call] | None:
    """``<tool_call>`` body: ``{"name": "f", "arguments": {...}}`` (whitespace around it)."""
    got = json_prefix(body)
    if got is None or body[got[1]:].strip():
        return None
    call = call_of(got[0])
    return None if call is None else [call]


def json_calls(body: str) -> list[Call] | None:
    """A JSON object or array of call objects (Llama 3 bare JSON, Mistral ``[TOOL_CALLS][…]``)."""
    got = json_prefix(body)
    if got is None or body[got[1]:].strip():
        return None
    items = got[0] if isinstance(got[0], list) else [got[0]]
    calls = [call_of(o) for o in items]
    return None if not calls or any(c is None for c in calls) else calls  # type: ignore[return-value]


def mistral_named(body: str) -> list[Call] | None:
    """``name[ARGS]{…}`` or ``name[CALL_ID]id[ARGS]{…}`` (Mistral-Small-3.2, Devstral, Magistral)."""
    head, sep, args = body.partition("[ARGS]")
    name = head.partition("[CALL_ID]")[0].strip()
    if not sep or not re.fullmatch(r"[\w.\-]+", name):
        return None
    got = json_prefix(args)
    if got is None or args[got[1]:].strip() or not isinstance(got[0], dict):
        return None
    return [(name, got[0])]


def python_tag(body: str) -> list[Call] | None:
    """After Llama 3.1's ``<|python_tag|>``: JSON call(s), or a built-in tool call ``name.call(k=v, …)``."""
    text = body.strip()
    if text.startswith(("{", "[")):
        return json_calls(text)
    m = re.fullmatch(r"([A-Za-z_]\w*)\.call\((.*)\)", text, re.S)
    if not m:
        return None
    try:
        node = ast.parse(f"f({m.group(2)})", mode="eval").body
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}  # type: ignore[attr-defined]
    except (SyntaxError, ValueError, TypeError):
        return None
    if None in args or getattr(node, "args", None):
        return None
    return [(m.group(1), args)]


def deepseek(body: str) -> list[Call] | None:
    """Between ``<｜tool▁call▁begin｜>`` and ``<｜tool▁call▁end｜>``: DeepSeek-R1's
    ``function<｜tool▁sep｜>NAME\\n```json\\n{…}\\n```​`` or DeepSeek-V3.1's ``NAME<｜tool▁sep｜>{…}``."""
    left, sep, right = body.partition("<｜tool▁sep｜>")
    if not sep:
        return None
    if left.strip() == "function" and "\n" in right:  # R1: type, then the name on its line, a fenced block
        name, _, rest = right.partition("\n")
        rest = rest.strip()
        if rest.startswith("```"):
            rest = rest[3:].removeprefix("json").strip()
            rest = rest[:-3] if rest.endswith("```") else rest
    else:
        name, rest = left, right
    name = name.strip()
    got = json_prefix(rest)
    if not name or got is None or rest[got[1]:].strip() or not isinstance(got[0], dict):
        return None
    return [(name, got[0])]


def harmony(header: str, body: str) -> list[Call] | None:
    """A gpt-oss message addressed ``to=functions.NAME`` (in its header) with a JSON body."""
    m = re.search(r"to=functions\.([^\s<]+)", header)
    got = json_prefix(body)
    if not m or got is None or body[got[1]:].strip() or not isinstance(got[0], dict):
        return None
    return [(m.group(1), got[0])]


_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.S)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def qwen_xml(body: str) -> list[Call] | None:
    """Qwen3.5/3.6's ``<tool_call>`` body (llama.cpp's "Qwen3-Coder" XML format, as their templates write it):
    ``<function=NAME>`` then one ``<parameter=KEY>\\nVALUE\\n</parameter>`` per argument, ``</function>``.
    The templates write a string value as is and anything else as JSON, so a value that reads as JSON other
    than a string (``3``, ``true``, ``{…}``, ``[…]``, ``null``) is that value, and any other text a string
    (the text ``"42"`` cannot be told from the number 42 without the tool's schema: it reads as 42)."""
    m = _XML_FUNCTION.fullmatch(body)
    if not m or not re.fullmatch(r"[\w.\-]+", m.group(1).strip()):
        return None
    inner, args, pos = m.group(2), {}, 0
    for p in _XML_PARAMETER.finditer(inner):
        if inner[pos:p.start()].strip():
            return None  # text between parameters: not the format
        args[p.group(1).strip()], pos = _xml_value(p.group(2)), p.end()
    return None if inner[pos:].strip() else [(m.group(1).strip(), args)]


def _xml_value(text: str) -> object:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return text if isinstance(value, str) else value


_GEMMA_QUOTE = '<|"|>'
_GEMMA_WORD = re.compile(r"[^,}\]]*")  # a bare value: a number, true/false/null, or unquoted text


def gemma4(body: str) -> list[Call] | None:
    """Gemma 4's ``<|tool_call>`` body: ``call:NAME{key:value,…}`` — keys bare, strings quoted ``<|"|>…<|"|>``,
    numbers, ``true``/``false``, nested ``{…}`` and ``[…]`` as the template's ``format_argument`` writes them."""
    m = re.fullmatch(r"\s*call:([\w.\-]+)(\{.*\})\s*", body, re.S)
    if not m:
        return None
    try:
        value, end = _gemma_value(m.group(2), 0)
    except (ValueError, IndexError, RecursionError):
        return None
    if end != len(m.group(2)) or not isinstance(value, dict):
        return None
    return [(m.group(1), value)]


def _gemma_value(s: str, i: int) -> tuple[object, int]:
    """The value at ``s[i:]`` and the index after it (ValueError/IndexError when malformed)."""
    if s.startswith(_GEMMA_QUOTE, i):
        j = s.index(_GEMMA_QUOTE, i + len(_GEMMA_QUOTE))
        return s[i + len(_GEMMA_QUOTE):j], j + len(_GEMMA_QUOTE)
    if s[i] in "{[":
        close, out_obj = ("}", {}) if s[i] == "{" else ("]", [])
        i += 1
        while s[i] != close:
            if isinstance(out_obj, dict):
                if s.startswith(_GEMMA_QUOTE, i):
                    key, i = _gemma_value(s, i)
                else:
                    k = s.index(":", i)
                    key, i = s[i:k].strip(), k
                if s[i] != ":" or not key:
                    raise ValueError("a key without a value")
                out_obj[key], i = _gemma_value(s, i + 1)
            else:
                item, i = _gemma_value(s, i)
                out_obj.append(item)
            if s[i] == ",":
                i += 1
            elif s[i] != close:
                raise ValueError("expected a comma")
        return out_obj, i + 1
    m = _GEMMA_WORD.match(s, i)
    word = m.group(0).strip()
    if not word:
        raise ValueError("an empty value")
    consts = {"true": True, "false": False, "null": None, "None": None, "True": True, "False": False}
    if word in consts:
        return consts[word], m.end()
    try:
        return json.loads(word), m.end()
    except json.JSONDecodeError:
        return word, m.end()
