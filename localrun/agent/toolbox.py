"""Every tool the model is offered, by name: the built-ins asked for and the tools of the MCP servers.

Names: a tool keeps its own name unless another tool has it too; then each clashing MCP tool is named
``server_tool`` (``files_read_file``), letters, digits, ``_`` and ``-`` only. ``call(name, args)``
validates the arguments against the tool's JSON Schema (``jsonschema``, the draft the schema names) and
runs it; a result longer than ``result_cap`` characters is cut with a note (``tools.cap_text``). What
goes wrong — an unknown tool, arguments that fail the schema, a tool that raised, an MCP server that died
— is the result text (``Result.error`` set), for the model to read; nothing raises out of ``call`` but
KeyboardInterrupt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from localrun.agent.mcp import McpHub, McpServerError, ServerConfig, field_of
from localrun.agent.tools import Tool, ToolFailed, builtin_tools, cap_text

RESULT_CAP = 8_000  # characters of one tool result the model sees, by default


@dataclass
class Result:
    """A tool call's outcome: ``text`` is what the model reads; ``error`` says it failed; ``cut``: the
    result was longer than the cap (``full_chars`` characters)."""

    text: str
    error: bool = False
    cut: bool = False
    full_chars: int = 0


@dataclass
class Toolbox:
    """The tools on offer. ``builtin``: the built-in sets asked for (``--tools``); ``hub``: the MCP servers."""

    builtin: list[str] = field(default_factory=list)
    hub: McpHub = field(default_factory=McpHub)
    result_cap: int = RESULT_CAP
    root: str | None = None
    tools: dict[str, Tool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the name → tool map from the built-in sets and the connected servers."""
        own = builtin_tools(self.builtin, self.root)
        remote = [(s.name, t) for s in self.hub.servers.values() for t in s.tools]
        counts: dict[str, int] = {}
        for name in [t.name for t in own] + [_clean(t.name) for _, t in remote]:
            counts[name] = counts.get(name, 0) + 1
        tools = {t.name: t for t in own}
        for server, t in remote:
            name = _clean(t.name)
            if counts[name] > 1:
                name = _clean(f"{server}_{t.name}")
            tools[name] = _mcp_tool(self.hub, server, t, name)
        self.tools = tools

    # ------------------------------------------------------------------ sets and servers
    def set_builtin(self, sets: list[str]) -> None:
        """Offer exactly these built-in sets (``/tools read,write``; ``[]``: none). Raises ValueError."""
        builtin_tools(sets, self.root)  # checks the names
        self.builtin = list(dict.fromkeys(sets))
        self.refresh()

    def connect(self, config: ServerConfig):
        """Connect an MCP server and offer its tools. Raises McpServerError."""
        server = self.hub.connect(config)
        self.refresh()
        return server

    def drop(self, name: str) -> bool:
        ok = self.hub.drop(name)
        self.refresh()
        return ok

    def close(self) -> None:
        self.hub.close()

    # ------------------------------------------------------------------ calls
    def definitions(self) -> list[dict]:
        """The OpenAI tool definitions of every tool on offer."""
        return [t.definition() for t in self.tools.values()]

    def __bool__(self) -> bool:
        return bool(self.tools)

    def check(self, name: str, args: object) -> str | None:
        """Why ``name(args)`` cannot be called (unknown tool, arguments not matching its schema), else None."""
        tool = self.tools.get(name)
        if tool is None:
            return f"error: there is no tool named {name!r}; the tools are: {', '.join(self.tools) or 'none'}"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object"
        import jsonschema

        try:
            cls = jsonschema.validators.validator_for(tool.parameters)
            err = jsonschema.exceptions.best_match(cls(tool.parameters).iter_errors(args))
        except jsonschema.exceptions.SchemaError:  # the server's schema is broken: let the call go
            return None
        if err is None:
            return None
        where = "/".join(str(p) for p in err.absolute_path) or "(the arguments)"
        return f"error: the arguments do not match {name}'s schema at {where}: {err.message}"

    def call(self, name: str, args: dict) -> Result:
        """Run ``name(args)`` (already checked and approved) → its Result, capped."""
        tool = self.tools[name]
        try:
            text, error = tool.run(args), False
        except ToolFailed as e:
            text, error = f"error: {e}", True
        except McpServerError as e:
            text, error = f"error: {e.message}" + (f" ({e.hint})" if e.hint else ""), True
            self.refresh()  # a dead server's tools stay listed (so /mcp connect brings them back)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - a tool's own failure is its result
            text, error = f"error: {type(e).__name__}: {e}", True
        if isinstance(text, tuple):  # an MCP tool: (text, is_error)
            text, error = text[0], text[1]
        n = len(text)
        if n > self.result_cap:
            return Result(cap_text(text, self.result_cap), error, True, n)
        return Result(text, error, False, n)


def _clean(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "tool"


def closed_arguments(schema: object) -> dict:
    """An MCP tool's input schema as the model is offered it → a copy whose top-level object allows only the
    properties it lists (``additionalProperties: false`` where it says nothing: the constrained call then
    cannot fill an argument-less tool's ``{}`` with keys of its own, as SmolLM2 did until its answer was cut)
    and without the top-level ``title`` (FastMCP's ``list_notesArguments``, which small models copy into
    the call). Nested objects, and a schema that sets ``additionalProperties`` itself, are left as they
    are; no schema (or not an object): ``{"type": "object"}``."""
    if not isinstance(schema, dict) or not schema:
        return {"type": "object"}
    out = {k: v for k, v in schema.items() if k != "title"}
    if out.get("type") == "object" and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _mcp_tool(hub: McpHub, server: str, t, name: str) -> Tool:
    schema = closed_arguments(field_of(t, "input_schema", "inputSchema"))
    read_only = bool(field_of(getattr(t, "annotations", None), "read_only_hint", "readOnlyHint"))
    return Tool(name, (t.description or "").strip()[:1000] or f"{t.name} (MCP server {server})", schema,
                lambda args: hub.call_tool(server, t.name, args), asks=not read_only, source=server,
                remote=t.name)
