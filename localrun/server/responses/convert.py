"""Pure converters between the Responses API's items and the chat template's messages, tools and
constraints (no I/O, no engine).

* ``messages_from_items``: ``instructions`` + the conversation's input items (a stored conversation's
  items first) → the template's message dicts. Consecutive assistant-side items (``reasoning``, an
  assistant ``message``, ``function_call``, ``custom_tool_call``) become one assistant message, the shape
  the model wrote them in, so a continued conversation renders to the tokens of the previous prompt and
  reply followed by the new input.
* ``tool_setup``: ``tools`` + ``tool_choice`` → the chat tools ``reply.prepare_chat`` takes, and the forced
  choice. A ``custom`` tool is offered to the template as a function with one string argument ``input``;
  forced (``tool_choice: {"type": "custom", "name": ...}``), the whole reply is its input, matching the
  tool's ``format`` grammar (Lark or regex) through llguidance.
* ``format_constraint``: ``text.format`` → a checked ``Constraint`` (the same llguidance path as chat's
  ``response_format``).

Every refusal is a ``RequestError`` naming the field as OpenAI's error ``param`` (``input[2].call_id``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from localrun.backends.base import Constraint
from localrun.backends.images import IMAGE_MARKER
from localrun.server.errors import RequestError

HOSTED_TOOLS = frozenset({"web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search",
                          "computer_use", "computer_use_preview", "computer", "code_interpreter",
                          "image_generation", "mcp", "local_shell", "shell", "apply_patch", "tool_search"})
ASSISTANT_ITEMS = frozenset({"reasoning", "function_call", "custom_tool_call"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"})


def new_id(prefix: str) -> str:
    """An OpenAI-shaped id: ``resp_…``, ``msg_…``, ``fc_…``, ``call_…``."""
    return f"{prefix}_{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------------------------- input items
def input_items(value) -> list[dict]:
    """``input`` (a string or a list of items) → a list of items (a string is one user message)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value)


def check_items(items: list[dict], known_calls: dict[str, str], param: str = "input") -> list[dict]:
    """Validate ``items`` (this request's input) and give each its stored form: a ``type``, an ``id``
    (``msg_…``, ``fc_…``) and, for messages, content as a list of parts. ``known_calls`` (call_id → tool
    name, from the stored conversation) grows with this input's calls. RequestError names the bad field.

    As OpenAI does, a call without a ``call_id`` takes its ``id`` (or a new one), and a tool output without one
    answers the earliest call not yet answered (of its ``name``, when it has one). Items of hosted tools
    (``web_search_call``, ``local_shell_call``, ``mcp_call``, …: ``_is_hosted_item``) are accepted and left
    out of the conversation, logged once; any other unknown ``type`` is a 400 naming it."""
    out = []
    unanswered = [c for c in known_calls]  # call ids in the order they were made, not yet answered
    skipped: list[str] = []
    for i, raw in enumerate(items):
        where = f"{param}[{i}]"
        if not isinstance(raw, dict):
            raise RequestError(f"{where} must be an object (an input item)", param=where)
        item = dict(raw)
        kind = item.get("type") or ("message" if "role" in item else None)
        if not isinstance(kind, str):
            raise RequestError(f"{where} has no 'type'", param=f"{where}.type")
        item["type"] = kind
        if kind == "message":
            item = _check_message(item, where)
        elif kind in ("function_call", "custom_tool_call"):
            if not isinstance(item.get("call_id"), str) or not item["call_id"]:
                item["call_id"] = item["id"] if isinstance(item.get("id"), str) and item["id"] else new_id("call")
            _need_str(item, "name", where)
            _need_str(item, "arguments" if kind == "function_call" else "input", where)
            if kind == "function_call":  # as on chat completions: the template can only write an object
                from localrun.server.wire import check_tool_call_arguments

                check_tool_call_arguments([{"function": {"arguments": item["arguments"]}}], i,
                                          param=f"{where}.arguments")
            known_calls[item["call_id"]] = item["name"]
            unanswered.append(item["call_id"])
            item.setdefault("id", new_id("fc" if kind == "function_call" else "ctc"))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(item.get("call_id"), str) or not item["call_id"]:
                item["call_id"] = _pair_output(item, unanswered, known_calls, where)
            if item["call_id"] not in known_calls:
                raise RequestError(f"{where}.call_id {item['call_id']!r} answers no function call in this "
                                   "conversation", param=f"{where}.call_id",
                                   hint="send the function_call item before its output, or continue the "
                                   "response that made the call (previous_response_id)")
            if item["call_id"] in unanswered:
                unanswered.remove(item["call_id"])
            if not isinstance(item.get("output"), (str, list)):
                raise RequestError(f"{where}.output must be a string", param=f"{where}.output")
            item.setdefault("id", new_id("fco"))
        elif kind == "reasoning":
            if not isinstance(item.get("summary", []), list) or not isinstance(item.get("content") or [], list):
                raise RequestError(f"{where}: summary and content must be lists", param=f"{where}.summary")
            item.setdefault("id", new_id("rs"))
        elif kind == "item_reference":
            raise RequestError(f"{where}: item_reference is not supported; send the item itself, or continue "
                               "with previous_response_id", param=f"{where}.type", code="unsupported_value")
        elif _is_hosted_item(kind):  # a hosted tool's call or its output: the model never made it
            skipped.append(kind)
            continue
        else:
            raise RequestError(f"{where}.type {kind!r} is not an input item localrun takes (message, "
                               "function_call, function_call_output, custom_tool_call, custom_tool_call_output, "
                               "reasoning, or a hosted tool's *_call item)", param=f"{where}.type",
                               code="invalid_value")
        out.append(item)
    if skipped:
        from localrun.server.wire import log_once

        kinds = ", ".join(sorted(set(skipped)))
        log_once("responses-items:" + kinds, f"/v1/responses: input items of type {kinds} (hosted tools) are left "
                 "out of the conversation")
    return out


def _is_hosted_item(kind: str) -> bool:
    """Whether ``kind`` names a hosted tool's item (``web_search_call``, ``local_shell_call_output``,
    ``mcp_list_tools``, ``image_generation_call``…) or a client's own bookkeeping item (Codex's
    ``ghost_snapshot``, ``compaction``): accepted and left out of the conversation."""
    return (kind.endswith(("_call", "_call_output")) or kind.startswith("mcp_")
            or kind in ("ghost_snapshot", "compaction", "compaction_summary"))


def _pair_output(item: dict, unanswered: list[str], known_calls: dict[str, str], where: str) -> str:
    """The call a tool output without ``call_id`` answers: the earliest unanswered one (of the output's
    ``name`` when it has one). RequestError when there is none."""
    name = item.get("name")
    for cid in unanswered:
        if not isinstance(name, str) or known_calls.get(cid) == name:
            return cid
    raise RequestError(f"{where}.call_id is missing and no earlier function call is left unanswered",
                       param=f"{where}.call_id", hint="send the call_id of the function_call this output answers")


def _need_str(item: dict, key: str, where: str) -> None:
    if not isinstance(item.get(key), str):
        raise RequestError(f"{where}.{key} must be a string", param=f"{where}.{key}")


def _check_message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise RequestError(f"{where}.role must be user, assistant, system or developer, got {role!r}",
                           param=f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        part = "output_text" if role == "assistant" else "input_text"
        content = [{"type": part, "text": content} | ({"annotations": []} if role == "assistant" else {})]
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content parts",
                           param=f"{where}.content")
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "input_image" and role != "assistant":  # needs the model's projector (--mmproj)
            if not isinstance(p.get("image_url"), str):
                raise RequestError(f"{where}.content[{j}].image_url must be a data: or http(s) URL (file_id is "
                                   "not supported)", param=f"{where}.content[{j}].image_url")
            continue
        if kind not in _TEXT_PARTS:
            hint = " (send input_text or input_image)" if kind in ("input_file", "input_audio") else ""
            raise RequestError(f"{where}.content[{j}].type {kind!r} is not supported{hint}",
                               param=f"{where}.content[{j}].type", code="unsupported_value")
        if not isinstance(p.get("text", p.get("refusal")), str):
            raise RequestError(f"{where}.content[{j}].text must be a string", param=f"{where}.content[{j}].text")
    item = dict(item, content=content)
    item.setdefault("id", new_id("msg"))
    return item


def calls_in(items: list[dict]) -> dict[str, str]:
    """call_id → tool name of the function/custom tool calls among ``items``."""
    return {it["call_id"]: it["name"] for it in items if it.get("type") in ("function_call", "custom_tool_call")}


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join((IMAGE_MARKER if p.get("type") == "input_image" else p.get("text", p.get("refusal", "")))
                   if isinstance(p, dict) else "" for p in content or [])


def _images(content, where: str) -> list:
    """The ``input_image`` parts of a message's content → ``ImageInput``s (server/images.py)."""
    from localrun.server.images import image_from_url

    return [image_from_url(p["image_url"], f"{where}.content[{j}]") for j, p in enumerate(content or [])
            if isinstance(p, dict) and p.get("type") == "input_image"]


def messages_from_items(instructions: str | None, items: list[dict]) -> list[dict]:
    """``instructions`` (a system message first) + checked items → the chat template's message dicts."""
    msgs: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    names = calls_in(items)
    open_turn = False  # the last message is an assistant turn that later assistant-side items extend
    for k, it in enumerate(items):
        kind = it["type"]
        if kind == "message":
            role = "system" if it["role"] == "developer" else it["role"]
            text = _text(it["content"])
            last = msgs[-1] if msgs else None
            if role == "assistant" and open_turn and not last["content"] and not last.get("tool_calls"):
                last["content"] = text  # the reply after its reasoning
            else:
                images = _images(it["content"], f"input[{k}]") if role != "assistant" else []
                msgs.append({"role": role, "content": text} | ({"images": images} if images else {}))
            open_turn = role == "assistant"
            continue
        if kind in ASSISTANT_ITEMS:
            if not open_turn:
                msgs.append({"role": "assistant", "content": ""})
                open_turn = True
            last = msgs[-1]
            if kind == "reasoning":
                text = _text(it.get("content")) or _text(it.get("summary")) or _decode_reasoning(it)
                if text:
                    last["reasoning_content"] = last.get("reasoning_content", "") + text
            else:
                args = it["arguments"] if kind == "function_call" else json.dumps({"input": it["input"]})
                last.setdefault("tool_calls", []).append(
                    {"id": it["call_id"], "type": "function", "function": {"name": it["name"], "arguments": args}})
            continue
        # function_call_output / custom_tool_call_output
        msgs.append({"role": "tool", "tool_call_id": it["call_id"], "name": names.get(it["call_id"], ""),
                     "content": _text(it["output"])})
        open_turn = False
    return msgs


def encode_reasoning(text: str) -> str:
    """``reasoning.encrypted_content`` (``include``): the thinking text, base64 (nothing is secret locally;
    a stateless client such as Codex sends it back and the next prompt renders it as before)."""
    import base64

    return base64.b64encode(text.encode()).decode()


def _decode_reasoning(item: dict) -> str:
    import base64
    import binascii

    enc = item.get("encrypted_content")
    if not isinstance(enc, str):
        return ""
    try:
        return base64.b64decode(enc, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""  # another server's encrypted reasoning: not readable here


# ---------------------------------------------------------------------------------------------- tools
@dataclass
class ToolSetup:
    """What ``tool_setup`` made of ``tools`` + ``tool_choice``: ``chat_tools`` in chat completions' shape
    (None: none offered), ``choice`` for ``reply.prepare_chat`` ("auto" | "required" | named | "none"),
    ``custom`` the custom tools by name (their constraint, or None for free text), ``forced_custom`` the
    custom tool whose input the whole reply is (None: none forced)."""

    chat_tools: list[dict] | None = None
    choice: str | dict | None = None
    custom: dict[str, Constraint | None] = field(default_factory=dict)
    forced_custom: str | None = None
    namespaces: dict[str, str] = field(default_factory=dict)  # a tool's name → the namespace it came in


def tool_setup(tools: list[dict] | None, tool_choice) -> ToolSetup:
    """``tools`` and ``tool_choice`` → ``ToolSetup``. Hosted tools (web_search, file_search, …; any tool
    type other than ``function``, ``custom`` and ``namespace``) are accepted and left out, logged once; a
    ``tool_choice`` that forces one is a 400. A custom tool's grammar is checked now (``ConstraintError``: a
    400 naming its definition)."""
    from localrun.constrain import check

    setup = ToolSetup()
    chat_tools: list[dict] = []
    hosted: list[str] = []
    for i, t in enumerate(tools or []):
        where = f"tools[{i}]"
        if isinstance(t, dict) and t.get("type") == "namespace":  # Codex: a group of tools under one name
            inner = t.get("tools")
            if not isinstance(inner, list):
                raise RequestError(f"{where}.tools must be a list of tools", param=f"{where}.tools")
            group = [_one_tool(u, f"{where}.tools[{j}]", setup, check, hosted) for j, u in enumerate(inner)]
            group = [g for g in group if g is not None]
            chat_tools += group
            if isinstance(t.get("name"), str):
                setup.namespaces.update({c["function"]["name"]: t["name"] for c in group})
        else:
            one = _one_tool(t, where, setup, check, hosted)
            if one is not None:
                chat_tools.append(one)
    if hosted:
        from localrun.server.wire import log_once

        kinds = ", ".join(sorted(set(hosted)))
        log_once("responses-hosted:" + kinds, f"/v1/responses: hosted tools {kinds} are not available on a local "
                 "server: left out (the model is not shown them)")
    names = [t["function"]["name"] for t in chat_tools]
    choice = tool_choice if tool_choice is not None else "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise RequestError(f"tool_choice must be 'auto', 'none', 'required' or an object, got {choice!r}",
                               param="tool_choice")
    elif isinstance(choice, dict):
        kind = choice.get("type")
        if kind in HOSTED_TOOLS:
            raise RequestError(f"tool_choice: the hosted tool {kind!r} is not available on a local server",
                               param="tool_choice.type", code="unsupported_value")
        if kind == "allowed_tools":
            allowed = {a.get("name") for a in choice.get("tools") or [] if isinstance(a, dict)}
            chat_tools = [t for t in chat_tools if t["function"]["name"] in allowed]
            mode = choice.get("mode", "auto")
            if mode not in ("auto", "required"):
                raise RequestError("tool_choice.mode must be 'auto' or 'required'", param="tool_choice.mode")
            choice = mode
        elif kind in ("function", "custom"):
            name = choice.get("name")
            if name not in names or (kind == "custom") != (name in setup.custom):
                raise RequestError(f"tool_choice names the {kind} tool {name!r}, which is not among the {kind} "
                                   "tools", param="tool_choice.name", code="invalid_value")
            if kind == "custom":
                setup.forced_custom = name
                choice = "auto"
            else:
                choice = {"type": "function", "function": {"name": name}}
        else:
            raise RequestError(f"tool_choice.type must be 'function', 'custom' or 'allowed_tools', got {kind!r}",
                               param="tool_choice.type")
    else:
        raise RequestError("tool_choice must be a string or an object", param="tool_choice")
    if choice == "required" and not chat_tools:
        raise RequestError("tool_choice 'required' needs 'tools' to choose from", param="tool_choice")
    setup.chat_tools = chat_tools or None
    setup.choice = choice
    return setup


def _one_tool(t, where: str, setup: ToolSetup, check, hosted: list[str]) -> dict | None:
    """One ``function`` or ``custom`` tool → its chat tool (a custom one: a function of one string,
    ``input``); its constraint goes to ``setup.custom``. A hosted tool (any other ``type``) → None, its
    type added to ``hosted``."""
    kind = t.get("type") if isinstance(t, dict) else None
    if not isinstance(kind, str) or not kind:
        raise RequestError(f"{where}.type must be 'function', 'custom' or a hosted tool's type, got {kind!r}",
                           param=f"{where}.type")
    if kind not in ("function", "custom"):
        hosted.append(kind)
        return None
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}.name must be a non-empty string", param=f"{where}.name")
    desc = t.get("description") or ""
    if kind == "function":
        params = t.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise RequestError(f"{where}.parameters must be a JSON Schema object", param=f"{where}.parameters")
    else:
        setup.custom[name] = _custom_constraint(t.get("format"), where)
        if setup.custom[name] is not None:
            check(setup.custom[name])
        params = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
    fn = {"name": name, "parameters": params} | ({"description": desc} if desc else {})
    if t.get("strict") is True and kind == "function":
        fn["strict"] = True
    return {"type": "function", "function": fn}


def _custom_constraint(fmt, where: str) -> Constraint | None:
    """A custom tool's ``format`` → its input's constraint (None: free text)."""
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        raise RequestError(f"{where}.format.type must be 'text' or 'grammar'", param=f"{where}.format.type")
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if syntax not in ("lark", "regex"):
        raise RequestError(f"{where}.format.syntax must be 'lark' or 'regex', got {syntax!r}",
                           param=f"{where}.format.syntax")
    if not isinstance(definition, str) or not definition.strip():
        raise RequestError(f"{where}.format.definition must be a non-empty string",
                           param=f"{where}.format.definition")
    return Constraint(syntax, definition, param=f"{where}.format.definition")


def format_constraint(fmt) -> Constraint | None:
    """``text.format`` (a ``schemas.TextFormat``) → a checked ``Constraint``; None for plain text. Raises
    RequestError (json_schema without schema), ConstraintError (what llguidance cannot enforce)."""
    from localrun.constrain import check

    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        c = Constraint("json_object", param="text.format")
    else:
        if fmt.schema_ is None:
            raise RequestError("text.format json_schema needs 'schema'", param="text.format.schema",
                               hint='send {"type": "json_schema", "name": ..., "schema": {...}}')
        if fmt.strict:  # OpenAI Structured Outputs: every object closed, every property required
            from localrun.constrain.grammar import strict_schema

            c = Constraint("json_schema", strict_schema(fmt.schema_), param="text.format.schema", strict=True)
        else:
            c = Constraint("json_schema", fmt.schema_, param="text.format.schema")
    check(c)
    return c


def effort(reasoning) -> tuple[bool | None, str | None]:
    """``reasoning.effort`` → (think, level) for ``reply.prepare_chat`` (none: no thinking)."""
    e = reasoning.effort if reasoning is not None else None
    if e is None:
        return None, None
    if e == "none":
        return False, None
    return True, "high" if e == "xhigh" else e
