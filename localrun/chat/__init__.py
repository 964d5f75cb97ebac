"""Terminal chat: the session (history, context policy, save/load; no rendering) in ``session``, the
interactive loop (input, streaming output, slash commands) in ``repl``, the slash-command help in ``help``."""

from localrun.chat.repl import Repl, stats_line
from localrun.chat.session import CONTEXT_POLICIES, DEFAULT_SYSTEM_PROMPT, ChatSession

__all__ = ["CONTEXT_POLICIES", "DEFAULT_SYSTEM_PROMPT", "ChatSession", "Repl", "stats_line"]
