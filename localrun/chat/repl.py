"""The interactive chat loop (rendering + input), on top of ``localrun.chat.session.ChatSession``.

Input uses prompt_toolkit (history in ``<LOCALRUN_HOME>/history``, Esc-Enter for a newline) when the
terminal supports it, else ``input()``. Ctrl-C during an answer stops that answer (the generator is
closed, so llama.cpp stops decoding) and returns to the prompt with the session intact; Ctrl-C while a
thinking model thinks ends the thinking instead (the engine closes the block, the model answers; a
second Ctrl-C stops the answer); Ctrl-C at the prompt clears the line; Ctrl-D or /exit leaves.
A thinking model's thinking is shown dimmed while it streams, then folds to one line
(``chat.thinking_view``).
"""

from __future__ import annotations

import sys

from localrun.chat.help import HELP
from localrun.chat.thinking import describe, parse_budget, switch_message
from localrun.chat.thinking_view import LiveThinking, fold_line
from localrun.chat.turn_view import CtrlCEndsThinking, show_turn, stats_line
from localrun.errors import ConfigError, LocalrunError

PROMPT = ">>> "
CONTINUATION = "... "


def newline_bindings():
    """prompt_toolkit key bindings: Esc then Enter (also Alt-Enter, which terminals send as the same
    two keys) inserts a newline instead of submitting; Enter alone still submits."""
    from prompt_toolkit.key_binding import KeyBindings

    kb = KeyBindings()

    @kb.add("escape", "enter")
    def _newline(event) -> None:
        event.current_buffer.insert_text("\n")

    return kb


class Repl:
    def __init__(self, session, loaded, *, raw: bool = False, hide_thinking: bool = False, agent=None,
                 mcp_config: list | None = None) -> None:
        from rich.console import Console

        self.session = session
        self.loaded = loaded
        self.raw = raw
        self.hide_thinking = hide_thinking
        self.con = Console(highlight=False)
        self._read = self._make_reader()
        self.read_line = self._read  # one line of input (agent mode's approval question)
        self.agent_view = None  # agent mode (``chat.agent_view``): tools, MCP servers, approvals
        if agent is not None:
            from localrun.chat.agent_view import AgentView

            self.agent_view = AgentView(self, agent, mcp_config)

    # ------------------------------------------------------------------ input
    def _make_reader(self):
        try:
            from prompt_toolkit import PromptSession
            from prompt_toolkit.history import FileHistory

            from localrun.config import get_settings

            hist = get_settings().history_file
            hist.parent.mkdir(parents=True, exist_ok=True)
            ps = PromptSession(history=FileHistory(str(hist)), key_bindings=newline_bindings())
            return lambda prompt: ps.prompt(prompt)
        except Exception:  # no usable terminal for prompt_toolkit: plain input()
            return input

    def read_message(self) -> str:
        """One message: handles \"\"\" blocks and trailing-backslash continuation. Raises EOFError."""
        line = self._read(PROMPT)
        if line.strip().startswith('"""'):
            parts = [line.strip()[3:]]
            if parts[0].endswith('"""') and len(parts[0]) >= 3:
                return parts[0][:-3]
            while True:
                nxt = self._read(CONTINUATION)
                if nxt.rstrip().endswith('"""'):
                    parts.append(nxt.rstrip()[:-3])
                    break
                parts.append(nxt)
            return "\n".join(p for p in parts).strip("\n")
        parts = [line]
        while parts[-1].endswith("\\"):
            parts[-1] = parts[-1][:-1]
            parts.append(self._read(CONTINUATION))
        return "\n".join(parts)

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        s, plan = self.session, self.loaded.plan
        eng = s.engine
        from localrun.store.resolve import display_name

        name = display_name(eng.model_path)
        self.con.print(f"[bold]{name}[/] · {eng.backend} · n_ctx {eng.n_ctx} · "
                       f"{plan.n_gpu_layers} GPU layers" + (" · raw completion" if self.raw else ""), style="cyan")
        self.con.print("Type a message, /help for commands, Ctrl-D to leave.", style="dim")
        while True:
            # a Ctrl-C at the prompt, or one that lands between two pieces of work (after an answer ended,
            # while its notes or stats print, during a command) says how to leave and keeps the session;
            # one during an answer is handled in ``answer`` (the partial answer is kept)
            try:
                if self.turn() == "exit":
                    return
            except KeyboardInterrupt:
                self.con.print("(Ctrl-D or /exit to leave)", style="dim")
            except EOFError:
                self.con.print()
                return

    def turn(self) -> str | None:
        """Read one message and answer it (or run it as a command). Returns "exit" to leave; raises
        EOFError (Ctrl-D) and KeyboardInterrupt (a Ctrl-C outside an answer's stream)."""
        text = self.read_message()
        if not text.strip():
            return None
        if text.strip().startswith("/") and not self.raw or text.strip() in ("/exit", "/bye", "/quit"):
            return self.command(text.strip())
        self.answer(text)
        return None

    def answer(self, text: str) -> None:
        if self.agent_view is not None and self.agent_view.on and not self.raw:
            return self.agent_view.answer(text)
        s = self.session
        out = sys.stdout
        s.on_notice = lambda note: self.con.print(f"[yellow]{note}[/]")  # what was dropped: before the answer
        try:
            if self.raw:
                stream = s.complete(text)
                last = show_turn(s, stream, out, None)
            else:
                stream = s.send(text)
                with CtrlCEndsThinking(s) as ctrl_c:
                    last = show_turn(s, stream, out,
                                     lambda th: LiveThinking(self.con, th, hide=self.hide_thinking), ctrl_c.arm)
        except KeyboardInterrupt:
            stream.close()  # stops decoding; ChatSession keeps the partial answer
            out.write("\n")
            self.con.print("[yellow]^C stopped.[/]")
            last = None
        except LocalrunError as e:
            stream.close()
            self.con.print(f"\n[bold red]error:[/] {e.message}")
            if e.hint:
                self.con.print(f"[yellow]hint:[/] {e.hint}")
            return
        else:
            out.write("\n")
        for note in s.notices:
            self.con.print(f"[yellow]{note}[/]")
        if last and last.stats:
            self.con.print(stats_line(last.stats), style="dim")

    def command(self, line: str) -> str | None:
        s = self.session
        cmd, _, arg = line.partition(" ")
        arg = arg.strip()
        try:
            if cmd in ("/exit", "/bye", "/quit"):
                return "exit"
            if cmd in ("/help", "/?"):
                self.con.print(HELP, markup=False)
            elif cmd == "/clear":
                s.clear()
                self.con.print("conversation cleared", style="dim")
            elif cmd == "/system":
                if arg:
                    s.system = arg
                    self.con.print("system prompt set", style="dim")
                else:
                    self.con.print(f"system prompt: {s.system!r}", style="dim")
            elif cmd == "/think":
                self.think(arg)
            elif cmd == "/stats":
                self.show_stats()
            elif cmd == "/image":
                if not arg:
                    self.con.print("usage: /image PATH", style="yellow")
                else:
                    n = s.attach_image(arg)
                    self.con.print(f"{n} image{'s' if n > 1 else ''} attached to your next message", style="dim")
            elif cmd == "/save":
                if not arg:
                    self.con.print("usage: /save FILE", style="yellow")
                else:
                    s.notices.clear()
                    p = s.save(arg)
                    self.con.print(f"saved {len(s.messages)} messages to {p}", style="dim")
                    for note in s.notices:
                        self.con.print(note, style="yellow")
            elif cmd == "/load":
                if not arg:
                    self.con.print("usage: /load FILE", style="yellow")
                else:
                    s.notices.clear()
                    n = s.load(arg)
                    kv = f" and {s.kv_restored_tokens} tokens of KV cache" if s.kv_restored_tokens else ""
                    self.con.print(f"loaded {n} messages{kv} from {arg}", style="dim")
                    for note in s.notices:
                        self.con.print(note, style="yellow")
            elif cmd == "/undo-compact" and self.agent_view is None:
                from localrun.agent.compact import undo_line

                n = s.undo_compact()
                self.con.print(undo_line(n, s.undo_kv_tokens), style="dim")
            elif self.agent_view is None or not self.agent_view.command(cmd, arg):
                self.con.print(f"unknown command {cmd}; /help lists them", style="yellow")
        except LocalrunError as e:
            self.con.print(f"[bold red]error:[/] {e.message}")
            if e.hint:
                self.con.print(f"[yellow]hint:[/] {e.hint}")
        return None

    def think(self, arg: str) -> None:
        """/think [on|off|budget N|budget off]: the reasoning control (chat.thinking). A bad argument says
        so in one line; nothing else changes."""
        s = self.session
        fam = s.family
        words = arg.split()
        if not words:
            self.con.print(describe(fam, s.think, s.reasoning_budget), style="dim", markup=False)
            return
        if fam.thinking is None:
            self.con.print(describe(fam, s.think, s.reasoning_budget) + "; /think changes nothing",
                           style="yellow", markup=False)
            return
        if words[0] in ("on", "off") and len(words) == 1:
            s.think = words[0] == "on"
            self.con.print(switch_message(fam, s.think), style="dim", markup=False)
        elif words[0] == "budget" and len(words) == 2:
            s.reasoning_budget = parse_budget(words[1])
            b = "none" if s.reasoning_budget is None else f"{s.reasoning_budget} tokens"
            self.con.print(f"thinking budget: {b}", style="dim")
        else:
            raise ConfigError(f"/think {arg}: not understood",
                              hint="/think on, /think off, /think budget N, /think budget off, or /think alone")

    def show_stats(self) -> None:
        s, plan = self.session, self.loaded.plan
        if s.last_stats:
            self.con.print(stats_line(s.last_stats))
            if s.thought is not None:
                self.con.print(fold_line(s.thought), style="dim", markup=False)
        else:
            self.con.print("no answer yet")
        self.con.print(f"turns {s.turns} · messages in history {len(s.messages)} · model {s.engine.model_path}",
                       style="dim")
        if plan.reasons:
            self.con.print("plan: " + "; ".join(plan.reasons), style="dim")
