"""MCP servers for the chat (``chat --mcp CONFIG``, ``/mcp``), through the ``mcp`` SDK, stdio and streamable HTTP.

``CONFIG`` is the ``mcpServers`` JSON that Claude Desktop, Cursor and LM Studio use::

    {"mcpServers": {"files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "."],
                              "env": {"K": "V"}, "cwd": "."},
                    "web": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer …"}}}}

(a server with ``url`` speaks streamable HTTP; ``"type": "http"``/``"streamable-http"`` may say so too;
``"disabled": true`` skips one). The SDK is async: ``McpHub`` runs one asyncio loop on its own thread and
each server as one task there, which enters the transport and the ``ClientSession`` and holds them
until the server is dropped (anyio's contexts must be left in the task that entered them); the REPL
calls it synchronously (``asyncio.run_coroutine_threadsafe``). Every failure — a command that does not
exist, a server that exits, one that dies mid-call, a timeout — raises ``McpServerError`` (a
``LocalrunError``) with one line to show; the hub and the other servers go on. A Ctrl-C while waiting
cancels the call on the loop and passes through.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from localrun.errors import ConfigError, LocalrunError

START_TIMEOUT_S = 30.0  # a server that has not answered `initialize` by then is given up
CALL_TIMEOUT_S = 120.0  # one tool call, resource read or prompt


class McpServerError(LocalrunError):
    """An MCP server failed (to start, or mid-call); ``server`` is its name in the config."""

    def __init__(self, server: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"MCP server {server!r}: {message}", hint=hint)
        self.server = server


@dataclass
class ServerConfig:
    """One entry of ``mcpServers``: ``command``/``args``/``env``/``cwd`` (stdio) or ``url``/``headers``."""

    name: str
    command: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"


def load_config(path: str | os.PathLike) -> list[ServerConfig]:
    """The servers of an ``mcpServers`` JSON file (module docstring), in file order; disabled ones left out.
    Raises ConfigError (unreadable, not JSON, no ``mcpServers`` object, an entry with neither ``command``
    nor ``url``)."""
    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read the MCP config {p}: {e.strerror or e}",
                          hint="give the path of an mcpServers JSON file (--mcp FILE)") from None
    except ValueError as e:
        raise ConfigError(f"the MCP config {p} is not JSON: {e}",
                          hint='it must hold {"mcpServers": {"NAME": {"command": ..., "args": [...]}}}') from None
    servers = data.get("mcpServers", data.get("servers")) if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(f"the MCP config {p} has no 'mcpServers' object",
                          hint='write {"mcpServers": {"NAME": {"command": ..., "args": [...]}}}')
    return [parse_entry(name, entry, where=str(p)) for name, entry in servers.items()
            if not (isinstance(entry, dict) and entry.get("disabled"))]


def parse_entry(name: str, entry: object, *, where: str = "the MCP config") -> ServerConfig:
    """One ``mcpServers`` entry → ServerConfig. Raises ConfigError saying what the entry lacks."""
    if not isinstance(entry, dict) or not (isinstance(entry.get("command"), str) or isinstance(entry.get("url"), str)):
        raise ConfigError(f"{where}: the MCP server {name!r} needs a 'command' (stdio) or a 'url' (HTTP)",
                          hint='e.g. {"command": "python", "args": ["server.py"]} or {"url": "http://…/mcp"}')
    args = entry.get("args") or []
    if not isinstance(args, list):
        raise ConfigError(f"{where}: the MCP server {name!r}'s 'args' must be a list of strings")
    env = entry.get("env")
    return ServerConfig(name, entry.get("command"), [str(a) for a in args],
                        {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else None,
                        entry.get("cwd"), entry.get("url"), entry.get("headers"))


@dataclass
class Server:
    """A connected server: what it offers (``tools``: the SDK's Tool objects) and its state."""

    config: ServerConfig
    session: object = None
    tools: list = field(default_factory=list)
    has_resources: bool = False
    has_prompts: bool = False
    alive: bool = True
    stop: asyncio.Event | None = None
    task: asyncio.Task | None = None
    errlog: object = None

    @property
    def name(self) -> str:
        return self.config.name

    def stderr_tail(self) -> str:
        """The last line the server wrote to its stderr (kept in a temp file, never on the terminal)."""
        try:
            self.errlog.flush()
            lines = Path(self.errlog.name).read_text(errors="replace").strip().splitlines()
        except (OSError, AttributeError, ValueError):
            return ""
        return lines[-1][:200] if lines else ""


class McpHub:
    """The connected MCP servers, on one event-loop thread (module docstring). Thread-safe to call."""

    def __init__(self) -> None:
        self.servers: dict[str, Server] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the loop thread
    def _run(self, coro, timeout: float):
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="localrun-mcp", daemon=True)
            self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except KeyboardInterrupt:
            fut.cancel()
            raise
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError from None

    # ------------------------------------------------------------------ servers
    def connect(self, config: ServerConfig) -> Server:
        """Start (stdio) or reach (HTTP) the server and list its tools. Raises McpServerError."""
        if config.name in self.servers:
            self.drop(config.name)
        server = Server(config, errlog=tempfile.NamedTemporaryFile("w+", prefix=f"mcp-{config.name}-",
                                                                    suffix=".log", delete=True))
        try:
            self._run(self._open(server), START_TIMEOUT_S)
        except TimeoutError:
            self._run(self._close(server), 10)
            raise McpServerError(config.name, f"did not answer within {START_TIMEOUT_S:g} s",
                                 hint="check its command in the MCP config; /mcp connect NAME retries") from None
        except McpServerError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever the transport raised: one line
            tail = server.stderr_tail()
            raise McpServerError(config.name, f"did not start: {_describe(e, config)}" + (f" ({tail})" if tail else ""),
                                 hint="fix its entry in the MCP config; /mcp connect NAME retries") from None
        self.servers[config.name] = server
        return server

    async def _open(self, server: Server) -> None:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        server.stop = asyncio.Event()
        server.task = asyncio.create_task(self._hold(server, ready))
        try:
            await ready
        except asyncio.CancelledError:
            server.task.cancel()
            raise

    async def _hold(self, server: Server, ready: asyncio.Future) -> None:
        """The server's task: enter the transport and the session, list its tools, wait until dropped."""
        from mcp import ClientSession

        try:
            async with _transport(server) as streams, ClientSession(streams[0], streams[1]) as session:
                init = await session.initialize()
                caps = init.capabilities
                server.session = session
                server.tools = (await session.list_tools()).tools if caps.tools is not None else []
                server.has_resources = caps.resources is not None
                server.has_prompts = caps.prompts is not None
                if not ready.done():
                    ready.set_result(True)
                await server.stop.wait()
        except BaseException as e:  # noqa: BLE001 - the server ended: said by the next call on it
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
        finally:
            server.alive = False

    async def _close(self, server: Server) -> None:
        if server.stop is not None:
            server.stop.set()
        if server.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(server.task), 5)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                server.task.cancel()

    def drop(self, name: str) -> bool:
        """Disconnect ``name`` (its process ends) → whether it was connected."""
        server = self.servers.pop(name, None)
        if server is None:
            return False
        try:
            self._run(self._close(server), 10)
        except (TimeoutError, RuntimeError):
            pass
        return True

    def close(self) -> None:
        """Drop every server and stop the loop thread."""
        for name in list(self.servers):
            self.drop(name)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop = None

    # ------------------------------------------------------------------ requests
    def _request(self, name: str, what: str, make, timeout: float = CALL_TIMEOUT_S):
        server = self.servers.get(name)
        if server is None:
            raise McpServerError(name, "is not connected", hint="/mcp lists the servers; /mcp connect NAME")
        if not server.alive:
            raise McpServerError(name, "has stopped" + (f" ({server.stderr_tail()})" if server.stderr_tail() else ""),
                                 hint=f"/mcp connect {name} starts it again")

        async def call():
            return await make(server.session)

        try:
            return self._run(call(), timeout)
        except TimeoutError:
            raise McpServerError(name, f"{what} got no answer within {timeout:g} s") from None
        except Exception as e:  # noqa: BLE001 - the transport's or the protocol's error: one line
            dead = not server.alive or _is_connection_error(e)
            if dead:
                server.alive = False
                tail = server.stderr_tail()
                raise McpServerError(name, f"died during {what}" + (f" ({tail})" if tail else ""),
                                     hint=f"/mcp connect {name} starts it again") from None
            raise McpServerError(name, f"{what} failed: {_describe(e, server.config)}") from None

    def call_tool(self, name: str, tool: str, args: dict, timeout: float = CALL_TIMEOUT_S) -> tuple[str, bool]:
        """Call ``tool`` on server ``name`` → (result text, is_error). Raises McpServerError."""
        result = self._request(name, f"the call of {tool}", lambda s: s.call_tool(tool, args), timeout)
        return (content_text(result.content, field_of(result, "structured_content", "structuredContent")),
                bool(field_of(result, "is_error", "isError")))

    def resources(self, name: str) -> list:
        """The server's resources (SDK ``Resource`` objects: ``uri``, ``name``, ``description``)."""
        if not self.servers.get(name) or not self.servers[name].has_resources:
            return []
        return self._request(name, "listing resources", lambda s: s.list_resources()).resources

    def read_resource(self, name: str, uri: str) -> str:
        """The text of resource ``uri`` of server ``name``."""
        res = self._request(name, f"reading {uri}", lambda s: s.read_resource(uri))
        return "\n".join(getattr(c, "text", None) or f"[{field_of(c, 'mime_type', 'mimeType') or 'binary'} content]"
                         for c in res.contents)

    def prompts(self, name: str) -> list:
        """The server's prompts (SDK ``Prompt`` objects: ``name``, ``description``, ``arguments``)."""
        if not self.servers.get(name) or not self.servers[name].has_prompts:
            return []
        return self._request(name, "listing prompts", lambda s: s.list_prompts()).prompts

    def get_prompt(self, name: str, prompt: str, args: dict[str, str] | None = None) -> list[tuple[str, str]]:
        """Prompt ``prompt`` of server ``name`` → its messages as (role, text)."""
        res = self._request(name, f"getting the prompt {prompt}", lambda s: s.get_prompt(prompt, args or {}))
        return [(m.role, content_text([m.content])) for m in res.messages]


def content_text(content: list, structured: object = None) -> str:
    """MCP content blocks → text: text blocks as they are, resources by their text, images and audio as a
    placeholder; ``structured`` (structuredContent) as JSON when there is no text."""
    parts = []
    for c in content or []:
        kind = getattr(c, "type", "")
        if kind == "text":
            parts.append(c.text)
        elif kind == "resource":
            r = c.resource
            parts.append(getattr(r, "text", None) or f"[resource {r.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {c.uri}]")
        else:
            parts.append(f"[{kind or 'binary'} content, {field_of(c, 'mime_type', 'mimeType') or 'not shown'}]")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


def field_of(obj: object, *names: str):
    """The first of ``names`` that ``obj`` has (mcp 2 names fields in snake_case, mcp 1 in camelCase)."""
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    return None


def _transport(server: Server):
    cfg = server.config
    if cfg.url:
        from mcp.client.streamable_http import streamable_http_client

        if not cfg.headers:
            return streamable_http_client(cfg.url)
        try:  # the SDK's HTTP client: httpx2 from mcp 2, httpx before
            import httpx2 as httpx
        except ImportError:
            import httpx
        client = httpx.AsyncClient(headers=cfg.headers, timeout=httpx.Timeout(30, read=300))
        return _with_client(client, streamable_http_client(cfg.url, http_client=client))
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=cfg.command, args=cfg.args, env=cfg.env, cwd=cfg.cwd)
    return stdio_client(params, errlog=server.errlog)


class _with_client:
    """``async with`` the HTTP transport, then close its httpx client."""

    def __init__(self, client, cm) -> None:
        self.client, self.cm = client, cm

    async def __aenter__(self):
        return await self.cm.__aenter__()

    async def __aexit__(self, *exc):
        try:
            return await self.cm.__aexit__(*exc)
        finally:
            await self.client.aclose()


def _is_connection_error(e: BaseException) -> bool:
    text = f"{type(e).__name__}: {e}".lower()
    return any(w in text for w in ("connection closed", "closedresource", "brokenresource", "endofstream",
                                   "connecterror", "remoteprotocolerror"))


def _describe(e: BaseException, cfg: ServerConfig) -> str:
    """One line for an exception from the SDK (an ExceptionGroup is unwrapped to its first leaf)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, FileNotFoundError) and cfg.command:
        return f"the command {cfg.command!r} was not found"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
