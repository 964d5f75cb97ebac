"""The chat's MCP client (localrun/agent/mcp.py, toolbox.py) against real MCP servers written here with the SDK's
FastMCP (``MCPServer`` since mcp 2): over stdio (this file run as a script) and over streamable HTTP (the same
server's ASGI app in a thread). Listing, calls, resources, prompts, a server that dies mid-call, a slow call
stopped by Ctrl-C, and bad input: each failure one error, the hub going on."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.slow  # each stdio server is a Python process that imports the SDK: seconds

def build_server():
    try:
        from mcp.server.mcpserver import MCPServer
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP as MCPServer

    app = MCPServer("demo")

    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @app.tool()
    def crash() -> str:
        """End the server process in the middle of the call."""
        os._exit(3)

    @app.tool()
    def slow(seconds: float) -> str:
        """Answer after some seconds."""
        time.sleep(seconds)
        return "done"

    @app.tool()
    def read_file(path: str) -> str:
        """Clashes with the built-in read_file."""
        return f"mcp read {path}"

    @app.resource("note://hello")
    def hello() -> str:
        return "hello from a resource"

    @app.prompt()
    def greet(name: str) -> str:
        return f"Say hello to {name}."

    return app


if __name__ == "__main__":
    build_server().run("stdio")


STDIO = {"command": sys.executable, "args": [os.path.abspath(__file__)]}


@pytest.fixture(scope="module")
def box():
    """A Toolbox with the read set and the stdio server ``demo`` connected (one process for the module)."""
    from localrun.agent.mcp import parse_entry
    from localrun.agent.toolbox import Toolbox

    tb = Toolbox(["read"])
    tb.connect(parse_entry("demo", STDIO))
    yield tb
    tb.close()


def test_lists_and_calls_tools_with_clashing_names_prefixed(box):
    names = set(box.tools)
    assert {"add", "slow", "crash", "list_folder", "search_text"} <= names
    assert "read_file" in names and "demo_read_file" in names  # the built-in keeps its name, the clash is prefixed
    assert box.tools["demo_read_file"].source == "demo" and box.tools["read_file"].source == "built-in"
    assert box.check("add", {"a": 2, "b": 3}) is None
    r = box.call("add", {"a": 2, "b": 3})
    assert (r.text, r.error) == ("5", False)
    assert box.call("demo_read_file", {"path": "x"}).text == "mcp read x"


def test_arguments_that_fail_the_schema_are_an_error_result(box):
    problem = box.check("add", {"a": "two", "b": 3})
    assert problem.startswith("error:") and "add" in problem and "a" in problem
    assert "no tool named" in box.check("nope", {})


def test_mcp_arguments_are_closed_for_the_model(box):
    """FastMCP's schemas list their properties but leave others allowed and carry a title ("crashArguments"):
    offered as they are, SmolLM2's constrained call of an argument-less tool filled ``{}`` with keys of its
    own (copying the title) until its answer was cut. The model is offered the schema closed, untitled."""
    crash, add = box.tools["crash"].parameters, box.tools["add"].parameters
    assert crash["additionalProperties"] is False and not crash.get("properties") and "title" not in crash
    assert add["additionalProperties"] is False and set(add["properties"]) == {"a", "b"} and "title" not in add
    assert "not allowed" in box.check("crash", {"name": "crashArguments"})
    assert box.check("crash", {}) is None


def test_resources_and_prompts(box):
    hub = box.hub
    assert [str(r.uri) for r in hub.resources("demo")] == ["note://hello"]
    assert hub.read_resource("demo", "note://hello") == "hello from a resource"
    assert [p.name for p in hub.prompts("demo")] == ["greet"]
    assert hub.get_prompt("demo", "greet", {"name": "Bo"}) == [("user", "Say hello to Bo.")]


def test_ctrl_c_during_a_slow_call_stops_it_and_the_server_goes_on(box):
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        box.hub.call_tool("demo", "slow", {"seconds": 30})
    assert time.monotonic() - t0 < 20
    assert box.call("add", {"a": 1, "b": 1}).text == "2"


def test_a_server_that_dies_mid_call_is_one_error_and_the_others_go_on():
    from localrun.agent.mcp import parse_entry
    from localrun.agent.toolbox import Toolbox

    tb = Toolbox([])
    try:
        tb.connect(parse_entry("doomed", STDIO))
        r = tb.call("crash", {})
        assert r.error and "died during the call of crash" in r.text
        r = tb.call("add", {"a": 1, "b": 1})
        assert r.error and "has stopped" in r.text and "/mcp connect doomed" in r.text
    finally:
        tb.close()


def test_streamable_http_server(tmp_path):
    from helpers import ServerThread

    from localrun.agent.mcp import load_config
    from localrun.agent.toolbox import Toolbox

    srv = ServerThread(build_server().streamable_http_app())
    tb = Toolbox([])
    try:
        cfg = tmp_path / "mcp.json"
        cfg.write_text(json.dumps({"mcpServers": {"web": {"url": srv.url + "/mcp"},
                                                  "off": {"command": "x", "disabled": True}}}))
        [web] = load_config(cfg)
        assert web.transport == "http"
        tb.connect(web)
        assert tb.call("add", {"a": 40, "b": 2}).text == "42"
        assert tb.hub.read_resource("web", "note://hello") == "hello from a resource"
    finally:
        tb.close()
        srv.stop()


def test_bad_configs_and_a_missing_command_are_clear_errors(tmp_path):
    from localrun.agent.mcp import McpHub, ServerConfig, load_config
    from localrun.errors import ConfigError, LocalrunError

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        load_config(bad)
    bad.write_text(json.dumps({"mcpServers": {"x": {"args": []}}}))
    with pytest.raises(ConfigError, match="needs a 'command'"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")
    hub = McpHub()
    try:
        with pytest.raises(LocalrunError, match="'no-such-command-xyz' was not found"):
            hub.connect(ServerConfig("ghost", command="no-such-command-xyz"))
        assert hub.servers == {}
    finally:
        hub.close()
