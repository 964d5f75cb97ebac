"""Agent mode in the terminal: an agent turn rendered (``agent.loop`` events), the approval question, and
the agent's slash commands (``/mcp``, ``/tools``, ``/approvals``, ``/undo-compact``).

A turn shows each step's answer as it streams (thinking folded as in a plain turn: ``repl.show_turn``),
each tool call as ``→ name {args}``, the diff or command an approval is about, the question, and the
result as ``← first line … (N chars)``. Ctrl-C stops the current step (or the tool call under way) and
keeps the session; what was done is in the history. One-shot (``chat -p``) writes the answer to stdout and
the calls to stderr; a call that needs approval is declined there unless ``--yes``.
"""

from __future__ import annotations

import json
import sys

from localrun.agent.compact import undo_line
from localrun.agent.loop import CallDone, CallShown, Note, StepStream
from localrun.errors import ConfigError, LocalrunError

ASK = "allow {name}? y = yes · a = yes for {name} this session · n [reason] = no › "


def _short(text: str, width: int = 100) -> str:
    first = text.strip().splitlines()[0] if text.strip() else "(empty)"
    more = f" … ({len(text)} chars)" if len(first) < len(text.strip()) or len(first) > width else ""
    return first[:width] + more


class AgentView:
    """The agent half of the REPL (``repl.Repl`` holds one when tools can be offered)."""

    def __init__(self, repl, agent, mcp_config: list | None = None) -> None:
        self.repl = repl
        self.agent = agent
        self.con = repl.con
        self.configs = {c.name: c for c in (mcp_config or [])}
        agent.approvals.ask = self.ask

    @property
    def on(self) -> bool:
        """Whether a message is an agent turn: some tool is on offer."""
        return bool(self.agent.toolbox)

    # ------------------------------------------------------------------ a turn
    def ask(self, name: str, preview: str) -> str:
        try:
            return self.repl.read_line(ASK.format(name=name))
        except EOFError:  # Ctrl-D at the question: no (leaving is for the prompt)
            return "n the user declined (Ctrl-D)"

    def answer(self, text: str) -> None:
        from localrun.chat.thinking_view import LiveThinking
        from localrun.chat.turn_view import CtrlCEndsThinking, show_turn, stats_line

        s, out, last = self.repl.session, sys.stdout, None
        s.on_notice = lambda note: self.con.print(f"[yellow]{note}[/]")
        run = self.agent.run(text)
        try:
            for item in run:
                if isinstance(item, StepStream):
                    wrote = _Wrote(out)
                    with CtrlCEndsThinking(s) as ctrl_c:
                        last = show_turn(s, item.stream, wrote,
                                         lambda th: LiveThinking(self.con, th, hide=self.repl.hide_thinking),
                                         ctrl_c.arm) or last
                    if wrote.any:
                        out.write("\n")
                else:
                    self.show(item)
        except KeyboardInterrupt:
            run.close()  # the step's stream and the loop: the partial step and every call's result kept
            out.write("\n")
            self.con.print("[yellow]^C stopped.[/]")
            last = None
        except LocalrunError as e:
            run.close()
            self.con.print(f"\n[bold red]error:[/] {e.message}")
            if e.hint:
                self.con.print(f"[yellow]hint:[/] {e.hint}")
            return
        for note in s.notices:
            self.con.print(f"[yellow]{note}[/]")
        if last and last.stats:
            self.con.print(stats_line(last.stats), style="dim")

    def show(self, item) -> None:
        """One loop event as terminal lines."""
        show_event(self.con, item)

    # ------------------------------------------------------------------ commands
    def command(self, cmd: str, arg: str) -> bool:
        """Run an agent command → whether ``cmd`` was one. LocalrunErrors pass to the REPL's handler."""
        if cmd == "/tools":
            self.tools(arg)
        elif cmd == "/mcp":
            self.mcp(arg)
        elif cmd == "/approvals":
            for line in self.agent.approvals.lines():
                self.con.print(line, style="dim", markup=False)
        elif cmd == "/tool-choice":
            self.tool_choice(arg)
        elif cmd == "/undo-compact":
            n = self.repl.session.undo_compact()
            self.con.print(undo_line(n, self.repl.session.undo_kv_tokens), style="dim")
        else:
            return False
        return True

    def tool_choice(self, arg: str) -> None:
        """/tool-choice [auto|required|NAME]: what the first step of each message must do (--tool-choice)."""
        a = self.agent
        if arg:
            if arg not in ("auto", "required") and arg not in a.toolbox.tools:
                raise ConfigError(f"/tool-choice {arg}: no such tool on offer", hint="/tools lists them")
            a.tool_choice = arg
        self.con.print(f"tool choice: {a.tool_choice} (the first step of each message)", style="dim")

    def tools(self, arg: str) -> None:
        tb = self.agent.toolbox
        if arg:
            sets = [] if arg.strip() in ("off", "none") else [x.strip() for x in arg.replace(",", " ").split()]
            try:
                tb.set_builtin(sets)
            except ValueError as e:
                raise ConfigError(f"/tools {arg}: {e}", hint="/tools read,write,shell or /tools off") from None
        if not tb.tools:
            self.con.print("no tools on offer (/tools read,write,shell; --mcp CONFIG)", style="dim")
            return
        self.con.print(f"built-in sets: {', '.join(tb.builtin) or 'none'}", style="dim")
        for name, t in tb.tools.items():
            ask = " (asks first)" if t.asks else ""
            self.con.print(f"  {name} [{t.source}]{ask}: {_short(t.description, 80)}", style="dim", markup=False)

    def mcp(self, arg: str) -> None:
        words = arg.split()
        hub, tb = self.agent.toolbox.hub, self.agent.toolbox
        if not words:
            return self.mcp_list()
        sub, rest = words[0], words[1:]
        if sub == "connect" and rest:
            cfg = self._config(rest[0], rest[1:])
            server = tb.connect(cfg)
            self.con.print(f"connected {cfg.name} ({cfg.transport}): {len(server.tools)} tools", style="dim")
        elif sub == "drop" and len(rest) == 1:
            ok = tb.drop(rest[0])
            self.con.print(f"dropped {rest[0]}" if ok else f"{rest[0]} is not connected", style="dim")
        elif sub == "read" and len(rest) == 2:
            self.con.print(hub.read_resource(rest[0], rest[1]), markup=False)
        elif sub == "prompt" and len(rest) >= 2:
            args = dict(w.split("=", 1) for w in rest[2:] if "=" in w)
            msgs = hub.get_prompt(rest[0], rest[1], args)
            text = "\n\n".join(t for role, t in msgs if role == "user") or "\n\n".join(t for _, t in msgs)
            self.con.print(f"prompt {rest[1]}: {_short(text)}", style="dim", markup=False)
            self.repl.answer(text)
        else:
            raise ConfigError(f"/mcp {arg}: not understood", hint="/help lists the /mcp commands")

    def _config(self, name: str, spec: list[str]):
        from localrun.agent.mcp import ServerConfig

        if not spec:
            if name not in self.configs:
                raise ConfigError(f"no MCP server {name!r} in the --mcp config",
                                  hint=f"/mcp connect {name} COMMAND ARGS… or /mcp connect {name} URL")
            return self.configs[name]
        if spec[0].startswith(("http://", "https://")):
            return ServerConfig(name, url=spec[0])
        return ServerConfig(name, command=spec[0], args=spec[1:])

    def mcp_list(self) -> None:
        hub, tb = self.agent.toolbox.hub, self.agent.toolbox
        names = list(dict.fromkeys(list(self.configs) + list(hub.servers)))
        if not names:
            self.con.print("no MCP servers (chat --mcp CONFIG, or /mcp connect NAME COMMAND ARGS…)", style="dim")
            return
        for name in names:
            server = hub.servers.get(name)
            if server is None:
                self.con.print(f"{name}: not connected (/mcp connect {name})", style="yellow", markup=False)
                continue
            state = "running" if server.alive else f"stopped (/mcp connect {name})"
            self.con.print(f"{name} ({server.config.transport}, {state})", style="bold", markup=False)
            offered = {t.remote: n for n, t in tb.tools.items() if t.source == name}
            for t in server.tools:
                self.con.print(f"  tool {offered.get(t.name, t.name)}: {_short(t.description or '', 80)}",
                               style="dim", markup=False)
            if server.alive:
                for r in hub.resources(name):
                    self.con.print(f"  resource {r.uri} ({r.name})", style="dim", markup=False)
                for p in hub.prompts(name):
                    args = ", ".join(a.name for a in (p.arguments or []))
                    self.con.print(f"  prompt {p.name}({args}): {_short(p.description or '', 60)}", style="dim",
                                   markup=False)


class _Wrote:
    """``out`` that remembers whether anything was written."""

    def __init__(self, out) -> None:
        self.out, self.any = out, False

    def write(self, text: str) -> None:
        self.any = self.any or bool(text)
        self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def show_event(con, item) -> None:
    """A loop event (``CallShown``, ``CallDone``, ``Note``) as terminal lines on the rich console ``con``."""
    if isinstance(item, CallShown):
        args = json.dumps(item.call.args, ensure_ascii=False)
        con.print(f"→ {item.call.name} {args[:300]}", style="cyan", markup=False)
        for line in item.preview.splitlines() if item.asks else []:
            style = ("green" if line.startswith("+") and not line.startswith("+++") else
                     "red" if line.startswith("-") and not line.startswith("---") else
                     "cyan" if line.startswith("@@") else "dim")
            con.print("  " + line, style=style, markup=False, highlight=False)
    elif isinstance(item, CallDone):
        d = item.decision
        if d is not None and not d.allowed:
            con.print(f"✗ declined: {d.reason}", style="yellow", markup=False)
        else:
            con.print(f"← {_short(item.result.text)}", style="red" if item.result.error else "dim", markup=False)
    elif isinstance(item, Note):
        con.print(item.text, style="yellow", markup=False)


def one_shot(session, agent, text: str, hide_thinking: bool = False) -> None:
    """``chat -p`` with tools: the answers to stdout, the calls and notes to stderr."""
    from localrun.chat.thinking_view import StderrThinking
    from localrun.chat.turn_view import show_turn
    from localrun.render import stderr

    err = stderr()
    session.on_notice = lambda note: err.print(f"note: {note}", style="yellow")
    for item in agent.run(text):
        if isinstance(item, StepStream):
            wrote = _Wrote(sys.stdout)
            show_turn(session, item.stream, wrote, lambda th: StderrThinking(err, th, hide=hide_thinking))
            if wrote.any:
                sys.stdout.write("\n")
            sys.stdout.flush()
        else:
            show_event(err, item)
    for note in session.notices:
        err.print(f"note: {note}", style="yellow")


def build_agent(session, tool_sets: list[str], mcp_path, *, yes: bool, max_steps: int, tool_choice: str, err):
    """The chat's agent: the built-in sets, the --mcp config's servers connected (each failure one line on
    ``err``, the chat goes on), the approvals → (AgentLoop, the config's ServerConfigs)."""
    from localrun.agent import AgentLoop, Approvals, Toolbox
    from localrun.agent.mcp import load_config
    from localrun.agent.toolbox import RESULT_CAP

    # a result the model sees: at most about a quarter of the window (~4 characters a token)
    toolbox = Toolbox(list(tool_sets), result_cap=min(RESULT_CAP, max(1000, session.engine.n_ctx)))
    configs = []
    if mcp_path is not None:
        try:
            configs = load_config(mcp_path)
        except LocalrunError as e:
            err.print(f"mcp: {e.message}" + (f" ({e.hint})" if e.hint else ""), style="yellow", markup=False)
    for cfg in configs:
        try:
            server = toolbox.connect(cfg)
            err.print(f"mcp: connected {cfg.name} ({cfg.transport}, {len(server.tools)} tools)", style="dim",
                      markup=False)
        except LocalrunError as e:
            err.print(f"mcp: {e.message}" + (f" ({e.hint})" if e.hint else ""), style="yellow", markup=False)
    if tool_choice not in ("auto", "required") and tool_choice not in toolbox.tools:
        err.print(f"--tool-choice {tool_choice}: no such tool on offer; the model chooses (auto)", style="yellow",
                  markup=False)
        tool_choice = "auto"
    return AgentLoop(session, toolbox, Approvals(yes_all=yes), max_steps=max_steps, tool_choice=tool_choice), configs
