"""The slash-command help the chat REPL prints for /help."""

HELP = """\
Commands:
  /help              this help
  /clear             forget the conversation (the system prompt stays)
  /system TEXT       set the system prompt (no TEXT: show it)
  /stats             statistics of the last answer and the session
  /save FILE         save the conversation as JSON
  /load FILE         load a conversation saved with /save
  /exit, /bye        leave (Ctrl-D too)
Input:
  \"\"\" starts and ends a multi-line message; a line ending in \\ continues on the next line;
  Esc then Enter inserts a newline. Up/Down recall earlier input.
  Ctrl-C while the model answers stops that answer and keeps the session.
"""
