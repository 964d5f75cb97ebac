"""Agent mode for ``localrun chat``: tools, the MCP client, approvals, the agent loop and compaction.

Layer 3 (tests/test_import_graph.py), beside ``loading``: it calls the engine through the engine contract
(``backends.base``), the template dialects (``dialects``: tool-call families, the generic format, the reply
parser) and the constraints (``constrain.tools``), and nothing above them. ``chat/`` (layer 4) drives it,
and ``server/`` (layer 4) may use it opt-in; putting it at 4 beside chat would allow an import circle
with chat, so it takes a chat session only by duck typing (``step.Session``: ``engine``, ``params``,
``family``, ``messages``, ``conversation()``, ``think``) and never imports ``chat``.

- ``tools``: the ``Tool`` record and the built-in tools (read / write / shell sets, off unless asked);
- ``approvals``: the ask-first rule for tools that write or run, and the session's ledger;
- ``mcp``: MCP servers from an ``mcpServers`` JSON (stdio and streamable HTTP) on an event-loop thread;
- ``toolbox``: every tool the model is offered, by name, with argument validation and a result cap;
- ``step``: one model step with tools: the prompt (template tools or the generic format), the tool-call
  constraint, the streamed reply parsed into text, thinking and calls;
- ``loop``: call → approval → result → next step, up to ``max_steps``;
- ``compact``: the ``compact`` context policy: older turns replaced by a summary the model writes.
"""

from localrun.agent.approvals import Approvals
from localrun.agent.loop import AgentLoop
from localrun.agent.toolbox import Toolbox

__all__ = ["AgentLoop", "Approvals", "Toolbox"]
