"""Reply events (``server/reply.py``) → the Responses API's output items and stream events.

``OutputBuilder.feed`` takes one reply event and returns the stream events it makes (dicts without
``sequence_number``: the route numbers them as it sends them); ``output`` is the finished items. A
non-streaming answer feeds the same events and discards the stream events, so a streamed response and a
non-streamed one are the same items by construction.

Item order follows the reply: ``reasoning`` (the thinking, as one ``reasoning_text`` part), ``message``
(``output_text``), then one ``function_call`` / ``custom_tool_call`` per call. Whitespace between calls
opens no message. Stream events per item (OpenAI's sequence): ``response.output_item.added``,
``response.content_part.added``, deltas (``response.reasoning_text.delta``, ``response.output_text.delta``,
``response.function_call_arguments.delta``, ``response.custom_tool_call_input.delta``), their ``.done``,
``response.content_part.done``, ``response.output_item.done``.

Every item carries a ``status``: ``in_progress`` when added, ``completed`` when done, ``incomplete`` for the
item a token limit cut (``finish(incomplete=True)``): the last item, in a response whose status is
``incomplete`` too (Open Responses specification, "Items are state machines").
"""

from __future__ import annotations

import json

from localrun.dialects import Delta, ToolCallArgs, ToolCallEnd, ToolCallStart
from localrun.server.responses.convert import encode_reasoning, new_id


class OutputBuilder:
    """Output items from reply events. ``custom``: the custom tools' names (a call to one is a
    ``custom_tool_call`` whose ``input`` is the call's ``input`` argument); ``forced_custom``: the custom
    tool whose input the whole reply text is; ``encrypted_reasoning``: add ``encrypted_content`` to
    reasoning items (``include: ["reasoning.encrypted_content"]``); ``namespaces``: tool name → the
    ``namespace`` tool it was offered in (its calls name the namespace)."""

    def __init__(self, custom: set[str] = frozenset(), forced_custom: str | None = None,
                 encrypted_reasoning: bool = False, namespaces: dict[str, str] | None = None) -> None:
        self.custom = set(custom)
        self.namespaces = dict(namespaces or {})
        self.forced_custom = forced_custom
        self.encrypted = encrypted_reasoning
        self.output: list[dict] = []
        self._open: dict | None = None  # the item being written
        self._text: list[str] = []  # its text (or arguments) so far
        self._pending_ws = ""  # whitespace content not yet shown (it opens no message on its own)
        self._calls: dict[int, dict] = {}  # reply tool-call index → its item

    # ------------------------------------------------------------------ feeding
    def feed(self, e) -> list[dict]:
        if isinstance(e, Delta):
            if not e.text:
                return []
            if e.channel == "thinking":
                return self._reasoning(e.text)
            if self.forced_custom is not None:
                return self._custom_text(e.text)
            return self._content(e.text)
        if isinstance(e, ToolCallStart):
            return self._call_start(e)
        if isinstance(e, ToolCallArgs):
            item = self._calls.get(e.index)
            if item is None or not e.text:
                return []
            self._text.append(e.text)
            if item["type"] == "function_call":
                return [{"type": "response.function_call_arguments.delta", "item_id": item["id"],
                         "output_index": self._index(), "delta": e.text}]
            return []  # a custom tool's input is a JSON string inside the arguments: sent whole at the end
        if isinstance(e, ToolCallEnd):
            item = self._calls.get(e.index)
            if item is None:
                return []
            return self._close(arguments=e.arguments)
        return []

    def finish(self, incomplete: bool = False) -> list[dict]:
        """Close the open item (the reply ended). ``incomplete``: the reply was cut (``max_output_tokens``,
        the context), so the open item is ``incomplete``, not ``completed``. → its closing events."""
        return self._close(status="incomplete" if incomplete else "completed")

    # ------------------------------------------------------------------ items
    def _index(self) -> int:
        return len(self.output) - 1

    def _begin(self, item: dict, part: dict | None) -> list[dict]:
        self._open = item
        self._text = []
        self.output.append(item)
        out = [{"type": "response.output_item.added", "output_index": self._index(), "item": _copy(item)}]
        if part is not None:
            out.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": self._index(),
                        "content_index": 0, "part": dict(part)})
        return out

    def _reasoning(self, text: str) -> list[dict]:
        out = []
        if self._open is None or self._open["type"] != "reasoning":
            out += self._close()
            out += self._begin({"id": new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [],
                                "content": []},
                               {"type": "reasoning_text", "text": ""})
        self._text.append(text)
        out.append({"type": "response.reasoning_text.delta", "item_id": self._open["id"],
                    "output_index": self._index(), "content_index": 0, "delta": text})
        return out

    def _content(self, text: str) -> list[dict]:
        out = []
        if self._open is None or self._open["type"] != "message":
            if not (self._pending_ws + text).strip():
                self._pending_ws += text
                return []
            text, self._pending_ws = self._pending_ws + text, ""
            out += self._close()
            out += self._begin({"id": new_id("msg"), "type": "message", "status": "in_progress",
                                "role": "assistant", "content": []},
                               {"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        self._text.append(text)
        out.append({"type": "response.output_text.delta", "item_id": self._open["id"], "output_index": self._index(),
                    "content_index": 0, "delta": text, "logprobs": []})
        return out

    def _custom_text(self, text: str) -> list[dict]:
        out = []
        if self._open is None or self._open["type"] != "custom_tool_call":
            out += self._close()
            out += self._begin({"id": new_id("ctc"), "type": "custom_tool_call", "status": "in_progress",
                                "call_id": new_id("call"), "name": self.forced_custom, "input": ""}, None)
        self._text.append(text)
        out.append({"type": "response.custom_tool_call_input.delta", "item_id": self._open["id"],
                    "output_index": self._index(), "delta": text})
        return out

    def _call_start(self, e: ToolCallStart) -> list[dict]:
        out = self._close()
        self._pending_ws = ""
        if e.name in self.custom:
            item = {"id": new_id("ctc"), "type": "custom_tool_call", "status": "in_progress", "call_id": e.id,
                    "name": e.name, "input": ""}
        else:
            item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress", "arguments": "",
                    "call_id": e.id, "name": e.name}
        if e.name in self.namespaces:
            item["namespace"] = self.namespaces[e.name]
        self._calls[e.index] = item
        return out + self._begin(item, None)

    def _close(self, arguments: dict | None = None, status: str = "completed") -> list[dict]:
        item = self._open
        if item is None:
            return []
        self._open = None
        text, i = "".join(self._text), self._index()
        kind, out = item["type"], []
        item["status"] = status
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            item["content"] = [part]
            if self.encrypted:
                item["encrypted_content"] = encode_reasoning(text)
            out += [{"type": "response.reasoning_text.done", "item_id": item["id"], "output_index": i,
                     "content_index": 0, "text": text},
                    {"type": "response.content_part.done", "item_id": item["id"], "output_index": i,
                     "content_index": 0, "part": dict(part)}]
        elif kind == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item["content"] = [part]
            out += [{"type": "response.output_text.done", "item_id": item["id"], "output_index": i,
                     "content_index": 0, "text": text, "logprobs": []},
                    {"type": "response.content_part.done", "item_id": item["id"], "output_index": i,
                     "content_index": 0, "part": _copy(part)}]
        elif kind == "function_call":
            item["arguments"] = text or json.dumps(arguments or {})
            out.append({"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": i,
                        "name": item["name"], "arguments": item["arguments"]})
        else:  # custom_tool_call
            if self.forced_custom is not None and arguments is None:
                value = text
            else:
                value = (arguments or {}).get("input")
                if not isinstance(value, str):
                    value = json.dumps(arguments or {}) if arguments else text
                out.append({"type": "response.custom_tool_call_input.delta", "item_id": item["id"],
                            "output_index": i, "delta": value})
            item["input"] = value
            out.append({"type": "response.custom_tool_call_input.done", "item_id": item["id"], "output_index": i,
                        "input": value})
        out.append({"type": "response.output_item.done", "output_index": i, "item": _copy(item)})
        return out


def _copy(d: dict) -> dict:
    return json.loads(json.dumps(d))
