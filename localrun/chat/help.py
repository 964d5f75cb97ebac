"""The slash-command help the chat REPL prints for /help."""

HELP = """\
Commands:
  /help              this help
  /clear             forget the conversation (the system prompt stays)
  /system TEXT       set the system prompt (no TEXT: show it)
  /stats             statistics of the last answer and the session
  /think             thinking models: show whether it thinks, the budget, the template's switch
  /think on|off      turn thinking on/off (the template's switch, e.g. Qwen3's enable_thinking;
                     without one, off closes the thinking block at once)
  /think budget N    at most N tokens of thinking per answer, then it answers (0: at once;
                     /think budget off: no limit)
  /image PATH        send this image with your next message (a model loaded with its projector)
  /save FILE         save the conversation as JSON
  /load FILE         load a conversation saved with /save
  /exit, /bye        leave (Ctrl-D too)
Agent mode (--tools, --mcp; docs/chat.md "Agent mode"):
  /tools             the tools on offer; /tools read,write,shell sets the built-in sets (/tools off: none)
  /mcp               the MCP servers, their tools, resources and prompts
  /mcp connect NAME [COMMAND ARGS… | URL]   start a server of the --mcp config, or a new one
  /mcp drop NAME     stop a server (its tools are no longer offered)
  /mcp read NAME URI show a resource; /mcp prompt NAME PROMPT [k=v …] sends a server's prompt
  /tool-choice X     the first step of each message: auto, required (some tool) or a tool's name
  /approvals         the tool calls of this session and what was decided
  /undo-compact      restore the history as it was before the last compaction
Input:
  \"\"\" starts and ends a multi-line message; a line ending in \\ continues on the next line;
  Esc then Enter inserts a newline. Up/Down recall earlier input.
  Ctrl-C while the model answers stops that answer and keeps the session.
  Ctrl-C while a thinking model thinks ends the thinking now: the model answers (Ctrl-C again stops it).
"""
