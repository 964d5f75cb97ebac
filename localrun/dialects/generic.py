"""The generic tool-call format: tool calls for a template that has no tool-call syntax (pure, stdlib only).

llama-server's fallback (llama.cpp ``common/chat.cpp``: ``common_chat_params_init_generic`` and minja's
tool polyfills). The tools are described in a system message (``add_system``: merged into the first system
message, or inserted as one) and the reply is one JSON object, held to that shape by a grammar
(``constrain.tools.generic_constraint``):

- ``{"tool_call": {"name": "f", "arguments": {...}}}``: one call;
- ``{"tool_calls": [{"name": "f", "arguments": {...}}, ...]}``: one or more (parallel calls allowed);
- ``{"response": "text"}``: a plain answer (not offered under ``tool_choice`` required / a named function).

``GenericReply`` reads that object back as it streams: the ``response`` text streams as it is decoded, a
call comes whole once its JSON closes, and text that is not in the format comes back as content.
``history_as_text`` writes a client's past calls and tool results in the same format, as text every
template renders: the assistant turn is the JSON it would have produced, and tool results become a user
turn ``{"tool_response": {"tool": name, "tool_call_id": id, "content": ...}}``.
"""

from __future__ import annotations

import json
import re

from localrun.dialects import calls as C

# what GenericReply yields: content text, or one call
Item = str | C.Call

_RESPONSE_HEAD = '{"response":"'  # the head of a plain answer, whitespace removed
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\", '"': '"'}


def _dumps(value: object) -> str:
    """One-line JSON with ``", "``/``": "`` separators: the layout the constraint generates."""
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- prompt


def instructions(tools: list[dict], *, name: str | None = None, required: bool = False,
                 parallel: bool = False) -> str:
    """The system text that describes ``tools`` (OpenAI tool definitions) and the reply format: the same for
    every ``tool_choice`` (``name``, ``required`` are enforced by the constraint, not said), so turns that
    force a call and turns that do not share their prompt prefix. ``parallel``: the ``tool_calls`` array
    (one or more calls), else one ``tool_call``."""
    fns = []
    for t in tools:
        f = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(f, dict) and f.get("name"):
            fns.append({k: f[k] for k in ("name", "description", "parameters") if k in f})
    call = ('{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}, ...]}' if parallel
            else '{"tool_call": {"name": "<tool name>", "arguments": {<arguments>}}}')
    head = "You can call the following tools; each one's arguments follow its JSON Schema `parameters`:\n"
    # One wording for every tool_choice: the grammar (constrain/tools.py generic_constraint) narrows the reply
    # to a call, or to the named tool. The text sits near the top of the prompt, so a client that forces
    # one turn's call (and not the next) keeps its prefix cache: the cut would otherwise fall here.
    how = (f"Respond with one JSON object, either {call} to call tools, or "
           '{"response": "<your reply>"} to reply to the user directly.')
    return head + json.dumps(fns, ensure_ascii=False, indent=2) + "\n\n" + how


def add_system(messages: list[dict], text: str) -> list[dict]:
    """``messages`` with ``text`` appended to the first message when it is a system message (a blank line
    between), else with a system message ``text`` inserted first. Copies; the inputs are untouched."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        first = _text(out[0].get("content"))
        out[0]["content"] = f"{first}\n\n{text}" if first else text
        return out
    return [{"role": "system", "content": text}] + out


# ---------------------------------------------------------------------------------------------- history


def history_as_text(messages: list[dict]) -> list[dict]:
    """Past tool calls and tool results written as text in the generic format (module docstring), so a
    template without tool syntax renders them. ``messages``: already normalised by ``history``
    (``tool_calls`` as ``{"id", "type", "function": {"name", "arguments"}}``). Consecutive tool results
    become one user turn. Copies; never raises."""
    out: list[dict] = []
    run: list[str] = []  # the tool results of the current run, one JSON line each
    for m in messages:
        role = m.get("role")
        if role == "tool":
            run.append(_dumps({"tool_response": _tool_response(m)}))
            continue
        if run:
            out.append({"role": "user", "content": "\n".join(run)})
            run = []
        if role == "assistant" and m.get("tool_calls"):
            m = dict(m)
            made = [_call_object(tc) for tc in m.pop("tool_calls")]
            body = _dumps({"tool_call": made[0]} if len(made) == 1 else {"tool_calls": made})
            text = _text(m.get("content")).strip()
            m["content"] = f"{text}\n{body}" if text else body
        out.append(m)
    if run:
        out.append({"role": "user", "content": "\n".join(run)})
    return out


def _call_object(tc: dict) -> dict:
    fn = tc.get("function") or tc
    args = fn.get("arguments")
    if isinstance(args, str):
        parsed = C.arguments_of(args)
        args = parsed if parsed is not None else args
    return {"name": fn.get("name") or "", "arguments": {} if args is None else args}


def _tool_response(m: dict) -> dict:
    content = m.get("content")
    if isinstance(content, str):
        try:  # a JSON result stays JSON (not a string of JSON)
            content = json.loads(content) if content.strip()[:1] in ("{", "[") else content
        except json.JSONDecodeError:
            pass
    r = {"tool": m.get("name") or ""}
    if m.get("tool_call_id"):
        r["tool_call_id"] = m["tool_call_id"]
    r["content"] = "" if content is None else content
    return r


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)
    return str(content)


# ---------------------------------------------------------------------------------------------- reply


class GenericReply:
    """Read a streamed generic-format reply. ``feed(text)`` and ``finish()`` return ``Item``s: content
    text (the ``response``, decoded, as it streams) or ``(name, arguments)`` calls (whole, when the object
    closes). The items are the same however the text is cut. A reply that is not an object of the format
    (unconstrained text, a truncated call) comes back as content, nothing lost."""

    def __init__(self) -> None:
        self._buf = ""
        self._mode = "head"  # head | response (inside the answer string) | after | object | text

    def feed(self, text: str) -> list[Item]:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[Item]:
        out = self._run(final=True)
        rest, self._buf = self._buf, ""
        if self._mode in ("head", "object", "text") and rest:
            out.append(rest)  # unfinished: give the text back
        elif self._mode == "after" and rest.strip() not in ("", "}"):
            out.append(rest.strip().removeprefix("}").strip())
        self._mode = "text"
        return [x for x in out if x]

    def _run(self, *, final: bool) -> list[Item]:
        if self._mode == "head":
            self._head(final)
        if self._mode == "text":
            out, self._buf = [self._buf], ""
            return [x for x in out if x]
        if self._mode == "response":
            return [x for x in [self._decode()] if x]
        if self._mode == "object":
            return self._object()
        return []

    def _head(self, final: bool) -> None:
        lead = self._buf.lstrip()
        if not lead:
            return
        if not lead.startswith("{"):
            self._mode = "text"
            return
        compact = re.sub(r"\s+", "", lead[:64])
        if compact.startswith(_RESPONSE_HEAD):
            m = re.match(r'\s*\{\s*"response"\s*:\s*"', self._buf)
            if m:
                self._buf, self._mode = self._buf[m.end():], "response"
                return
        if _RESPONSE_HEAD.startswith(compact) and not final:
            return  # could still be the head of an answer
        self._mode = "object"

    def _decode(self) -> str:
        """Decode the answer string's complete part; at its closing quote, switch to ``after``."""
        b, out, i = self._buf, [], 0
        while i < len(b):
            c = b[i]
            if c == '"':
                self._mode = "after"
                i += 1
                break
            if c != "\\":
                out.append(c)
                i += 1
                continue
            if i + 1 >= len(b):
                break
            e = b[i + 1]
            if e != "u":
                out.append(_ESCAPES.get(e, e))
                i += 2
                continue
            got = _unicode_escape(b, i)
            if got is None:
                break
            out.append(got[0])
            i = got[1]
        self._buf = b[i:]
        return "".join(out)

    def _object(self) -> list[Item]:
        got = C.json_prefix(self._buf)
        if got is None:
            return []
        value, end = got
        raw, rest = self._buf[:end], self._buf[end:]
        self._buf, self._mode = "", "text"
        items = _items_of(value)
        out: list[Item] = [raw.strip()] if items is None else items
        if rest.strip():
            out.append(rest)
        return out


def _unicode_escape(b: str, i: int) -> tuple[str, int] | None:
    """``\\uXXXX`` at ``b[i]`` (a surrogate pair as one character) → (character, index after it); None while
    incomplete. A malformed escape is kept as its text; a lone surrogate becomes U+FFFD."""
    if i + 6 > len(b):
        return None
    try:
        code = int(b[i + 2:i + 6], 16)
    except ValueError:
        return b[i:i + 2], i + 2
    if 0xD800 <= code < 0xDC00:  # a high surrogate: the low one's escape should follow
        nxt = b[i + 6:i + 8]
        if "\\u".startswith(nxt) and (len(nxt) < 2 or i + 12 > len(b)):
            return None
        if nxt == "\\u":
            try:
                low = int(b[i + 8:i + 12], 16)
            except ValueError:
                low = 0
            if 0xDC00 <= low < 0xE000:
                return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), i + 12
        return "\ufffd", i + 6
    if 0xDC00 <= code < 0xE000:
        return "\ufffd", i + 6
    return chr(code), i + 6


def _items_of(value: object) -> list[Item] | None:
    """A complete reply object → its items; None when it is not in the generic format."""
    if not isinstance(value, dict):
        return None
    said = value.get("content", value.get("response"))
    lead: list[Item] = [said] if isinstance(said, str) and said.strip() else []
    if "tool_call" in value:
        call = C.call_of(value["tool_call"])
        return None if call is None else lead + [call]
    if "tool_calls" in value and isinstance(value["tool_calls"], list) and value["tool_calls"]:
        found = [C.call_of(o) for o in value["tool_calls"]]
        return None if any(c is None for c in found) else lead + found  # type: ignore[operator]
    if "response" in value and len(value) == 1:
        r = value["response"]
        return [r if isinstance(r, str) else _dumps(r)]
    return None
