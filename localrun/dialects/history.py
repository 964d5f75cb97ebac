"""Chat history normalised for a family's template, so rendering never raises on what clients send.

Clients send assistant turns with ``tool_calls`` (arguments as a JSON string — OpenAI — or an object —
Ollama), null content, thinking under ``reasoning_content`` (llama-server), ``reasoning`` (Ollama's OpenAI
route) or ``thinking`` (Ollama, gpt-oss), and ``tool`` results with ``tool_call_id``. Each template
expects one of those shapes; ``messages_for_template`` writes the one it expects.
"""

from __future__ import annotations

import hashlib
import json

from localrun.dialects.families import Family

_THINKING_KEYS = ("reasoning_content", "reasoning", "thinking")


def messages_for_template(messages: list[dict], family: Family) -> list[dict]:
    """Copies of ``messages`` in the shape ``family``'s template reads. Never raises; inputs untouched.

    - tool calls: ``{"id", "type": "function", "function": {"name", "arguments"}}`` with arguments an
      object, or a JSON string where the template concatenates them (``Family.history_args``); Mistral
      templates get 9-character alphanumeric ids (their templates reject others), mapped the same way in
      the ``tool`` messages that answer them;
    - null content: kept None where the template tests for it (``Family.null_content``), else "";
    - ``tool`` messages: content as text, ``tool_call_id`` and the called function's ``name`` filled in (for
      Gemma 4, whose template needs a name, the last call's when the id matches none);
    - thinking: removed from assistant turns before the last user message when the template drops it
      (``Thinking.drops_history``); otherwise kept under the key the template reads (``reasoning_content``;
      gpt-oss ``thinking``; Magistral a ``thinking`` content block);
    - the generic family (``Family.tools == "generic"``: a template without tool syntax): past calls and
      tool results written as text in the generic format (``generic.history_as_text``).
    """
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    names: dict[str, str] = {}
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        role = m.get("role")
        if role == "assistant":
            m = _assistant(m, family, keep_thinking=i > last_user or not _drops(family), names=names)
        elif role == "tool":
            m = _tool(m, family, names)
        elif isinstance(m.get("content"), list) and role != "user":
            m["content"] = _text_of(m["content"])
        out.append(m)
    if family.tools == "generic":
        from localrun.dialects.generic import history_as_text

        return history_as_text(out)
    return out


def _drops(family: Family) -> bool:
    return family.thinking is not None and family.thinking.drops_history


def _assistant(m: dict, family: Family, *, keep_thinking: bool, names: dict[str, str]) -> dict:
    thinking = next((m.pop(k) for k in _THINKING_KEYS if m.get(k)), None)
    for k in _THINKING_KEYS:
        m.pop(k, None)
    content = m.get("content")
    if isinstance(content, list):
        content = _text_of(content)
    if not keep_thinking and isinstance(content, str) and family.thinking is not None:
        for close in dict.fromkeys((family.thinking.close, "</think>")):  # tags kept by reasoning_format none
            if close in content:
                content = content.split(close)[-1].lstrip()
    calls = [_call(tc, family, names) for tc in (m.get("tool_calls") or [])]
    if calls:
        m["tool_calls"] = calls
    else:
        m.pop("tool_calls", None)
    if content is None and not (calls and family.null_content):
        content = ""
    m["content"] = content
    if thinking and keep_thinking and family.thinking is not None:
        if family.name == "gpt-oss":
            if not (calls and content):  # its template refuses both on a tool-call turn: content wins
                m["thinking"] = thinking
        elif family.name == "magistral":
            m["content"] = [{"type": "thinking", "thinking": thinking}] + \
                ([{"type": "text", "text": content}] if content else [])
        else:
            m["reasoning_content"] = thinking
    return m


def _call(tc: dict, family: Family, names: dict[str, str]) -> dict:
    fn = dict(tc.get("function") or {})
    if not fn and "name" in tc:  # {"name", "arguments"} without the wrapper
        fn = {"name": tc["name"], "arguments": tc.get("arguments")}
    args = fn.get("arguments")
    if family.history_args == "string":
        fn["arguments"] = args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False)
    elif not isinstance(args, dict):
        fn["arguments"] = _as_object(args)
    call_id = _call_id(tc.get("id"), family)
    names[call_id] = fn.get("name") or ""
    return {"id": call_id, "type": tc.get("type") or "function", "function": fn}


def _as_object(args: object) -> object:
    """Arguments sent as a JSON string → the object; text that is not JSON stays text (nothing lost)."""
    if args is None or args == "":
        return {}
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


def _call_id(call_id: object, family: Family) -> str:
    """Mistral's templates take only 9 alphanumeric characters: a stable digest of the client's id."""
    cid = str(call_id or "")
    if family.tools != "mistral" or (len(cid) == 9 and cid.isalnum()):
        return cid
    return hashlib.sha1(cid.encode()).hexdigest()[:9]


def _tool(m: dict, family: Family, names: dict[str, str]) -> dict:
    content = m.get("content")
    if isinstance(content, list):
        content = _text_of(content)
    elif content is not None and not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    m["content"] = content or ""
    if "tool_call_id" in m or family.tools == "mistral":
        m["tool_call_id"] = _call_id(m.get("tool_call_id"), family)
    if not m.get("name") and m.get("tool_call_id") in names:
        m["name"] = names[m["tool_call_id"]]
    if not m.get("name") and family.tools == "gemma4":  # its template writes `'response:' + name`: None raises
        m["name"] = names.get(next(reversed(names), ""), "") or "unknown"  # the last call's name, as a guess
    return m


def _text_of(blocks: list) -> str:
    """OpenAI content parts → their text joined (non-text parts have no place in a text template)."""
    return "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in blocks)
