"""The interactive chat loop (rendering + input), on top of ``localrun.chat.session.ChatSession``.

Input uses prompt_toolkit (history in ``<LOCALRUN_HOME>/history``, Esc-Enter for a newline) when the
terminal supports it, else ``input()``. Ctrl-C during an answer stops that answer (the generator is
closed, so llama.cpp stops decoding) and returns to the prompt with the session intact; Ctrl-C at the
prompt clears the line; Ctrl-D or /exit leaves.
"""

from __future__ import annotations

import sys

from localrun.backends.base import Stats
from localrun.chat.help import HELP
from localrun.errors import LocalrunError

PROMPT = ">>> "
CONTINUATION = "... "


def stats_line(s: Stats) -> str:
    """'prompt 37 tok (30 cached) · TTFT 0.12 s · 81.7 tok/s · 64 tok · context 101/2048'"""
    cached = f" ({s.cached_tokens} cached)" if s.cached_tokens else ""
    return (f"prompt {s.prompt_tokens} tok{cached} · TTFT {s.ttft_s:.2f} s · {s.decode_tok_s:.1f} tok/s · "
            f"{s.completion_tokens} tok · context {s.n_ctx_used}/{s.n_ctx}")


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
    def __init__(self, session, loaded, *, raw: bool = False) -> None:
        from rich.console import Console

        self.session = session
        self.loaded = loaded
        self.raw = raw
        self.con = Console(highlight=False)
        self._read = self._make_reader()

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
            try:
                text = self.read_message()
            except KeyboardInterrupt:
                self.con.print("(Ctrl-D or /exit to leave)", style="dim")
                continue
            except EOFError:
                self.con.print()
                return
            if not text.strip():
                continue
            if text.strip().startswith("/") and not self.raw or text.strip() in ("/exit", "/bye", "/quit"):
                if self.command(text.strip()) == "exit":
                    return
                continue
            self.answer(text)

    def answer(self, text: str) -> None:
        s = self.session
        stream = s.complete(text) if self.raw else s.send(text)
        last = None
        out = sys.stdout
        try:
            for chunk in stream:
                if chunk.text:
                    out.write(chunk.text)
                    out.flush()
                if chunk.finish_reason:
                    last = chunk
        except KeyboardInterrupt:
            stream.close()  # stops decoding; ChatSession keeps the partial answer
            out.write("\n")
            self.con.print("[yellow]^C stopped.[/]")
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
            elif cmd == "/stats":
                self.show_stats()
            elif cmd == "/save":
                if not arg:
                    self.con.print("usage: /save FILE", style="yellow")
                else:
                    p = s.save(arg)
                    self.con.print(f"saved {len(s.messages)} messages to {p}", style="dim")
            elif cmd == "/load":
                if not arg:
                    self.con.print("usage: /load FILE", style="yellow")
                else:
                    n = s.load(arg)
                    self.con.print(f"loaded {n} messages from {arg}", style="dim")
            else:
                self.con.print(f"unknown command {cmd}; /help lists them", style="yellow")
        except LocalrunError as e:
            self.con.print(f"[bold red]error:[/] {e.message}")
            if e.hint:
                self.con.print(f"[yellow]hint:[/] {e.hint}")
        return None

    def show_stats(self) -> None:
        s, plan = self.session, self.loaded.plan
        if s.last_stats:
            self.con.print(stats_line(s.last_stats))
        else:
            self.con.print("no answer yet")
        self.con.print(f"turns {s.turns} · messages in history {len(s.messages)} · model {s.engine.model_path}",
                       style="dim")
        if plan.reasons:
            self.con.print("plan: " + "; ".join(plan.reasons), style="dim")
