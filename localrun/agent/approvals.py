"""Ask before a tool writes or runs, and keep the session's ledger (``chat /approvals``).

A tool with ``asks`` (``write_file``, ``edit_file``, ``run_shell``; every MCP tool but those the server
marks ``readOnlyHint``, as localrun cannot know what they do) is approved per call by the ``ask``
callback, which returns the user's answer:

* ``y`` — yes, this call;
* ``a`` — yes, and every later call of this tool in this session;
* ``n [REASON]`` — no; the reason (or "the user declined") goes back to the model as the call's result.

``yes_all`` (``chat --auto-approve``) approves everything without asking; with no ``ask`` (a pipe, ``-p``)
a call that needs approval is declined with a reason that names ``--auto-approve``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Decision:
    """One tool call and what became of it: ``verdict`` is "auto" (it does not ask), "yes", "always"
    (yes for the session), "session" (approved earlier with ``a``), "auto-ok" (--auto-approve), or "no"."""

    tool: str
    summary: str
    verdict: str
    reason: str = ""
    at: float = field(default_factory=time.time)

    @property
    def allowed(self) -> bool:
        return self.verdict != "no"


@dataclass
class Approvals:
    """The approval rule and ledger. ``ask(tool_name, preview) -> str``: the user's answer (module docstring)."""

    ask: Callable[[str, str], str] | None = None
    yes_all: bool = False
    always: set[str] = field(default_factory=set)
    ledger: list[Decision] = field(default_factory=list)

    def decide(self, tool, args: dict, preview: str = "") -> Decision:
        """Whether the call ``tool(args)`` may run; the decision joins the ledger. KeyboardInterrupt from
        ``ask`` passes through (the step is stopped)."""
        summary = _summary(tool.name, args)
        if not tool.asks:
            d = Decision(tool.name, summary, "auto")
        elif self.yes_all:
            d = Decision(tool.name, summary, "auto-ok")
        elif tool.name in self.always:
            d = Decision(tool.name, summary, "session")
        elif self.ask is None:
            d = Decision(tool.name, summary, "no", "no terminal to ask for approval; run with --auto-approve "
                                                   "to allow tools that write or run")
        else:
            d = _answer(tool.name, summary, self.ask(tool.name, preview))
            if d.verdict == "always":
                self.always.add(tool.name)
        self.ledger.append(d)
        return d

    def lines(self) -> list[str]:
        """The ledger as lines for ``/approvals`` (oldest first)."""
        if not self.ledger:
            return ["no tool calls yet"]
        out = [f"{time.strftime('%H:%M:%S', time.localtime(d.at))}  {d.verdict:<7}  {d.summary}"
               + (f"  ({d.reason})" if d.reason else "") for d in self.ledger]
        if self.always:
            out.append("allowed for this session: " + ", ".join(sorted(self.always)))
        if self.yes_all:
            out.append("--auto-approve: every call is allowed")
        return out


def _answer(name: str, summary: str, answer: str) -> Decision:
    a = (answer or "").strip()
    word, _, rest = a.partition(" ")
    w = word.lower()
    if w in ("y", "yes"):
        return Decision(name, summary, "yes")
    if w in ("a", "always"):
        return Decision(name, summary, "always")
    reason = rest.strip() if w in ("n", "no") else a
    return Decision(name, summary, "no", reason or "the user declined this call")


def _summary(name: str, args: dict) -> str:
    import json

    text = json.dumps(args, ensure_ascii=False)
    return f"{name}({text[:120] + '…' if len(text) > 120 else text})"
