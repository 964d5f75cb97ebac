"""The streaming reply parser: generated text → thinking, content and tool-call events.

``ReplyParser(family, thinking=…, tools=…).feed(piece)`` returns the events that ``piece`` completes;
``finish()`` flushes the rest. The merged events (``merged``) are the same for every way of cutting the
text into pieces: only text that could still become a marker is held back, and a tool call is emitted
whole once its end is seen (so a malformed call can still come back as content, nothing lost).

- thinking: ``<think>…</think>`` (opened by the template, or by the model at the start of its reply),
  ``[THINK]…[/THINK]``, gpt-oss's analysis channel. Leading/trailing whitespace inside the block and the
  whitespace right after it are dropped (the family's transition, e.g. ``"\\n</think>\\n\\n"``).
- tool calls: Hermes ``<tool_call>{…}</tool_call>``, Qwen3.5/3.6's ``<tool_call><function=NAME><parameter=K>…``,
  Gemma 4's ``<|tool_call>call:NAME{…}<tool_call|>``, Llama 3 bare JSON (at the start of the reply) and
  ``<|python_tag|>``, Mistral ``[TOOL_CALLS][…]`` / ``[TOOL_CALLS]name[ARGS]{…}``, DeepSeek's
  ``<｜tool▁call▁begin｜>…<｜tool▁call▁end｜>``, harmony ``to=functions.NAME … <|message|>{…}<|call|>``,
  and the generic format (``generic``: the whole answer is one JSON object, a call or a ``response``).
  Each call: ``ToolCallStart`` (id ``"call_"`` + 24 hex), one ``ToolCallArgs`` (the arguments as a JSON
  string, as OpenAI requires), ``ToolCallEnd`` (the parsed object, as Ollama wants); indexes count up.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from localrun.dialects import calls as C
from localrun.dialects.families import Family
from localrun.dialects.generic import GenericReply


@dataclass
class Delta:
    """Text for one channel: ``"thinking"`` or ``"content"``."""

    channel: str
    text: str


@dataclass
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass
class ToolCallArgs:
    """A piece of the arguments JSON *string*; a call's pieces concatenate to a JSON object's text."""

    index: int
    text: str


@dataclass
class ToolCallEnd:
    index: int
    arguments: dict


ReplyEvent = Delta | ToolCallStart | ToolCallArgs | ToolCallEnd

# markers of each tool syntax that open a call anywhere in the content
_CALL_STARTS = {
    "hermes": ("<tool_call>",),
    "qwen-xml": ("<tool_call>",),
    "gemma4": ("<|tool_call>",),
    "llama3": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]",),
    "deepseek": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
    "harmony": (),
}
# what ends one call's text, per call kind (a kind without an end completes when its JSON does, or at finish)
_CALL_ENDS = {
    "hermes": ("</tool_call>",),
    "qwen-xml": ("</tool_call>",),
    "gemma4": ("<tool_call|>",),
    "deepseek": ("<｜tool▁call▁end｜>",),
    "mistral": ("[TOOL_CALLS]",),
    "llama3_json": (),
    "llama3_py": ("<|eom_id|>", "<|eot_id|>"),
    "harmony": ("<|call|>", "<|end|>", "<|return|>"),
}
_ENDS_AT_FINISH = {"mistral", "llama3_json", "llama3_py", "harmony"}  # end of generation ends these calls
_H_OPEN = ("<|start|>", "<|channel|>")  # harmony: a message header begins
_H_END = ("<|end|>", "<|return|>", "<|call|>")
_DS_CALL, _DS_CALLS_END = "<｜tool▁call▁begin｜>", "<｜tool▁calls▁end｜>"


def new_call_id() -> str:
    """``"call_"`` + 24 random hex digits (OpenAI's shape)."""
    return "call_" + secrets.token_hex(12)


class ReplyParser:
    """Split a streamed reply of ``family`` into ``ReplyEvent``s.

    ``thinking``: this request thinks (the template opened the block, or the model may open one at the
    start of its reply); gpt-oss always does. ``tools``: tool calls are parsed (else their text is
    content). ``raw_thinking``: keep the thinking markers in the content, no split (reasoning_format
    "none"); where the template opened the block, the content starts with the open marker.
    """

    def __init__(self, family: Family, *, thinking: bool, tools: bool, raw_thinking: bool = False) -> None:
        t = family.thinking
        self._harmony = family.tools == "harmony" or (t is not None and t.close == "<|end|>")
        self._think = t if t is not None and (thinking or self._harmony) else None
        self._split = self._think is not None and not raw_thinking
        self._raw = self._think is not None and raw_thinking
        self._tools = family.tools if tools else None
        self._buf = ""
        self._mode = "content"  # content | thinking | call | calls (DeepSeek, between calls) | header (harmony)
        self._started = False  # non-whitespace text emitted in this segment
        self._thought = False  # a thinking block ended: no other may open
        self._lead = ""  # whitespace held at the start of the content (dropped if a block or call opens)
        self._strip_lead = False  # drop the whitespace that starts the current channel
        self._tail = ""  # trailing whitespace of thinking, held (dropped at its end)
        self._ctail = ""  # trailing whitespace of content while tools are on, held (dropped before a call)
        self._kind = self._marker = self._body = self._header = ""
        self._index = 0
        self._pending: list[ReplyEvent] = []
        self._wrap_close = ""  # harmony raw_thinking: the marker to write when the analysis message ends
        self._generic = GenericReply() if self._tools == "generic" else None  # reads the whole answer
        if self._think is not None and self._think.opened_by_template and not self._harmony:
            if self._split:
                self._enter_thinking()
            else:
                self._pending.append(Delta("content", self._think.open))

    # --- public ------------------------------------------------------------------------------------

    def feed(self, text: str) -> list[ReplyEvent]:
        """Events completed by ``text`` (a piece of the reply, any length)."""
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[ReplyEvent]:
        """Events for what is held back; an unterminated or malformed call comes back as content."""
        out = self._run(final=True)
        if self._generic is not None:
            self._generic_items(self._generic.finish(), out)
        if self._mode == "call":
            self._close_call("", out, at_finish=True)
        elif self._mode == "header":
            self._emit("content", self._header, out)
            self._header = ""
        if self._lead:
            out.append(Delta("content", self._lead))
            self._lead = ""
        self._flush_ctail(out)
        self._tail = ""
        if self._wrap_close:
            self._emit("content", self._wrap_close, out)
            self._wrap_close = ""
        self._mode = "content"
        return out

    # --- the loop ----------------------------------------------------------------------------------

    def _run(self, *, final: bool) -> list[ReplyEvent]:
        out, self._pending = self._pending, []
        while True:
            anywhere, at_start = self._markers()
            pos, marker = _scan(self._buf, anywhere, at_start, final)
            text = self._buf[:pos]
            self._buf = self._buf[pos + len(marker or ""):]
            pushed = self._take(text, out) if text else None
            if pushed is not None:  # a call completed inside `text`: the rest is read again
                self._buf = pushed + (marker or "") + self._buf
                continue
            if marker is None:
                return out
            self._on_marker(marker, out)

    def _markers(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(markers found anywhere, markers found only at the start of a segment, after whitespace)."""
        t, mode = self._think, self._mode
        if mode == "header":
            return ("<|message|>",), ()
        if mode == "calls":
            return (_DS_CALL, _DS_CALLS_END), ()
        if mode == "call":
            return _CALL_ENDS[self._kind], ()
        if self._harmony:
            return _H_OPEN + _H_END, ()
        if mode == "thinking":
            return (t.close,), (() if self._started else (t.open,))
        anywhere = _CALL_STARTS.get(self._tools or "", ())
        at_start: tuple[str, ...] = ()
        if not self._started:
            if self._split and not self._thought:
                at_start += (t.open,)
            if self._tools == "llama3":
                at_start += ("{",)
        return anywhere, at_start

    def _take(self, text: str, out: list[ReplyEvent]) -> str | None:
        """Route text read in the current mode; returns text to read again when a call completed in it."""
        if self._mode == "call":
            self._body += text
            return self._try_complete(out) if "}" in text or "]" in text else None
        if self._mode == "header":
            self._header += text
        elif self._mode == "calls":
            if text.strip():
                self._emit("content", text, out)
        else:
            self._emit(self._mode, text, out)
        return None

    def _on_marker(self, m: str, out: list[ReplyEvent]) -> None:
        mode, t = self._mode, self._think
        if mode == "content" and m not in _CALL_STARTS.get(self._tools or "", ()) and m != "{":
            self._flush_ctail(out)
        if mode == "call":
            self._close_call(m, out)
            if m == "[TOOL_CALLS]":
                self._start_call("mistral", m)
        elif mode == "calls":
            if m == _DS_CALL:
                self._start_call("deepseek", m)
            else:
                self._mode = "content"
        elif mode == "header":
            self._open_harmony_message(out)
        elif self._harmony:
            self._end_segment(out)
            if self._wrap_close:
                self._emit("content", self._wrap_close, out)
                self._wrap_close = ""
            self._mode = "content"
            if m in _H_OPEN:
                self._mode, self._header = "header", m
        elif mode == "thinking":
            if m == t.close:
                self._end_segment(out)
                self._mode, self._started, self._strip_lead = "content", False, True
        elif t is not None and m == t.open:
            self._lead = ""
            self._enter_thinking()
        elif m == "{":
            self._start_call("llama3_json", "")
            self._body = "{"
        elif m == "<｜tool▁calls▁begin｜>":
            self._lead, self._ctail, self._mode = "", "", "calls"  # whitespace before the calls: dropped
        else:
            self._start_call({"<tool_call>": "qwen-xml" if self._tools == "qwen-xml" else "hermes",
                              "<|tool_call>": "gemma4", "<|python_tag|>": "llama3_py", "[TOOL_CALLS]": "mistral",
                              _DS_CALL: "deepseek"}[m], m)

    # --- text --------------------------------------------------------------------------------------

    def _emit(self, channel: str, text: str, out: list[ReplyEvent]) -> None:
        if self._strip_lead:
            text = text.lstrip()
            if not text:
                return
            self._strip_lead = False
        if channel == "thinking":
            text = self._tail + text
            body = text.rstrip()
            self._tail = text[len(body):]
            if body:
                out.append(Delta("thinking", body))
                self._started = True
            return
        if self._generic is not None:  # the answer is a generic-format object: its reader decides
            self._started = self._started or bool(text.strip())
            self._generic_items(self._generic.feed(text), out)
            return
        if not self._started and self._markers()[1]:  # a block or a call may still open: hold whitespace
            text, self._lead = self._lead + text, ""
            if not text.strip():
                self._lead = text
                return
        if self._tools:
            text = self._ctail + text
            body = text.rstrip()
            self._ctail = text[len(body):]
            if not body:
                return
            text = body
        out.append(Delta("content", text))
        self._started = self._started or bool(text.strip())

    def _flush_ctail(self, out: list[ReplyEvent]) -> None:
        if self._ctail:
            out.append(Delta("content", self._ctail))
            self._ctail = ""

    def _enter_thinking(self) -> None:
        self._mode, self._started, self._strip_lead, self._tail = "thinking", False, True, ""

    def _end_segment(self, out: list[ReplyEvent]) -> None:
        """A thinking (or harmony) segment ends: drop its held whitespace."""
        if self._mode == "thinking":
            self._thought = True
        self._tail, self._strip_lead, self._started = "", False, False

    def _open_harmony_message(self, out: list[ReplyEvent]) -> None:
        import re

        header, self._header = self._header, ""
        if self._tools == "harmony" and "to=functions." in header:
            self._start_call("harmony", header + "<|message|>")
            self._header = header
            return
        m = re.search(r"<\|channel\|>\s*(\w+)", header)
        if m and m.group(1) == "analysis":
            if self._split:
                self._enter_thinking()
                return
            self._emit("content", header + "<|message|>", out)
            self._wrap_close = "<|end|>"
        self._mode, self._started = "content", False

    # --- tool calls --------------------------------------------------------------------------------

    def _start_call(self, kind: str, marker: str) -> None:
        # whitespace before a call is dropped, unless the call turns out malformed (then it is content)
        self._marker = self._lead + self._ctail + marker
        self._lead = self._ctail = ""
        self._mode, self._kind, self._body = "call", kind, ""

    def _try_complete(self, out: list[ReplyEvent]) -> str | None:
        """Calls without an end marker complete with their JSON: emit them; return the text after it."""
        kind, body = self._kind, self._body
        if kind not in ("mistral", "llama3_json", "llama3_py"):
            return None
        offset = 0
        if kind == "mistral" and not body.lstrip().startswith("["):
            offset = body.find("[ARGS]") + len("[ARGS]")
            if offset < len("[ARGS]"):
                return None
        got = C.json_prefix(body[offset:])
        if got is None:
            return None
        end = offset + got[1]
        self._body, rest = body[:end], body[end:]
        self._close_call("", out, at_finish=True)
        return rest

    def _close_call(self, end_marker: str, out: list[ReplyEvent], *, at_finish: bool = False) -> None:
        kind, body = self._kind, self._body
        ended = bool(end_marker) or (at_finish and kind in _ENDS_AT_FINISH)
        found = self._parse(kind, body) if ended else None
        if found is None:
            raw = self._marker + body + ("" if end_marker == "[TOOL_CALLS]" else end_marker)
            self._mode = "content"
            self._emit("content", raw, out)
            self._started = True
        else:
            self._emit_calls(found, out)
            self._mode = "calls" if kind == "deepseek" else "content"
        self._kind = self._marker = self._body = self._header = ""

    def _emit_calls(self, found: list[C.Call], out: list[ReplyEvent]) -> None:
        for name, args in found:
            out += [ToolCallStart(self._index, new_call_id(), name),
                    ToolCallArgs(self._index, json.dumps(args, ensure_ascii=False)),
                    ToolCallEnd(self._index, args)]
            self._index += 1

    def _generic_items(self, items: list, out: list[ReplyEvent]) -> None:
        for it in items:
            if isinstance(it, str):
                out.append(Delta("content", it))
            else:
                self._emit_calls([it], out)

    def _parse(self, kind: str, body: str) -> list[C.Call] | None:
        if kind == "hermes":
            return C.hermes(body)
        if kind == "qwen-xml":  # the XML form, or Hermes JSON where the model falls back to it
            return C.qwen_xml(body) or C.hermes(body)
        if kind == "gemma4":
            return C.gemma4(body)
        if kind == "deepseek":
            return C.deepseek(body)
        if kind == "mistral":
            return C.json_calls(body) if body.lstrip().startswith("[") else C.mistral_named(body)
        if kind == "llama3_json":
            return C.json_calls(body)
        if kind == "llama3_py":
            return C.python_tag(body)
        return C.harmony(self._header, body)


def _scan(buf: str, anywhere: tuple[str, ...], at_start: tuple[str, ...], final: bool) -> tuple[int, str | None]:
    """The first marker in ``buf`` → (its index, it); else (how much of ``buf`` is safe to read, None):
    all but the longest tail that could still grow into a marker (none when ``final``). ``at_start``
    markers count only after leading whitespace."""
    best: tuple[int, str] | None = None
    for m in anywhere:
        k = buf.find(m)
        if k >= 0 and (best is None or k < best[0] or (k == best[0] and len(m) > len(best[1]))):
            best = (k, m)
    j = len(buf) - len(buf.lstrip())
    rest = buf[j:]
    for m in at_start:
        if rest.startswith(m) and (best is None or j <= best[0]):
            best = (j, m)
    if best is not None:
        return best
    if final:
        return len(buf), None
    hold = 0
    for m in anywhere:
        for n in range(min(len(m) - 1, len(buf)), hold, -1):
            if buf.endswith(m[:n]):
                hold = n
                break
    if rest and any(m.startswith(rest) for m in at_start):
        hold = max(hold, len(rest))
    return len(buf) - hold, None


def merged(events: list[ReplyEvent]) -> list[ReplyEvent]:
    """Adjacent deltas of one channel, and adjacent argument pieces of one call, joined (copies)."""
    out: list[ReplyEvent] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, Delta) and isinstance(last, Delta) and last.channel == e.channel:
            out[-1] = Delta(e.channel, last.text + e.text)
        elif isinstance(e, ToolCallArgs) and isinstance(last, ToolCallArgs) and last.index == e.index:
            out[-1] = ToolCallArgs(e.index, last.text + e.text)
        else:
            out.append(e)
    return out
