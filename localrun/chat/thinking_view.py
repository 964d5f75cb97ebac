"""How the terminal chat shows a thinking model's thinking.

On a terminal: while the model thinks, a live region (rich ``Live``, transient) shows a header ("thinking…
4.1 s · Ctrl-C: answer now") and the latest lines of the thinking, dimmed; when the block closes the region
is erased and one dim line stays: "thought for 12.4 s, 412 tokens". ``hide=True`` (``--hide-thinking``)
shows the header only. Not a terminal: only the fold line. One-shot mode (``chat -p``) streams the
thinking dimmed to stderr instead (``StderrThinking``), so stdout holds the answer alone.
"""

from __future__ import annotations

from localrun.chat.thinking import Thought


def fold_line(thought: Thought, *, note: str = "") -> str:
    """'thought for 12.4 s, 412 tokens' (+ ``note``, or why the thinking ended when the user ended it)."""
    why = f" ({note})" if note else (" (ended early: Ctrl-C)" if thought.ended_early else "")
    return f"thought for {thought.seconds:.1f} s, {thought.tokens} tokens{why}"


def unfinished_note(finish_reason: str | None) -> str:
    """Why a turn ended with its thinking block still open (no answer)."""
    if finish_reason is None:
        return "stopped"
    if finish_reason == "length":
        return "cut off by the token limit before the answer; /think budget N leaves room for one"
    return f"no answer: the turn ended inside the thinking ({finish_reason})"


class _Tail:
    """A rich renderable: the header and the last lines of the thinking that fit the terminal."""

    def __init__(self, view: "LiveThinking") -> None:
        self.view = view

    def __rich_console__(self, console, options):
        from rich.text import Text

        v = self.view
        secs = v.thought.elapsed_s()
        hint = "Ctrl-C: answer now" if not v.thought.ended_early else "ending the thinking…"
        yield Text(f"thinking… {secs:.1f} s · {hint}", style="dim italic")
        if v.hide or not v.text.strip():
            return
        room = max(1, min(options.size.height, console.height) - 3)
        lines = Text(v.text.strip(), style="dim").wrap(console, options.max_width)
        for line in lines[-room:]:
            yield line


class LiveThinking:
    """The thinking region of one turn (module docstring). ``add(text)`` while the block is open,
    ``fold(note=...)`` once it closed (or the turn ended); safe to call ``fold`` twice."""

    def __init__(self, console, thought: Thought, *, hide: bool = False) -> None:
        self.con, self.thought, self.hide = console, thought, hide
        self.text = ""
        self.live = None
        self.done = False
        if console.is_terminal:
            from rich.live import Live

            self.live = Live(_Tail(self), console=console, transient=True, refresh_per_second=8,
                             redirect_stdout=False, redirect_stderr=False)
            self.live.start()

    def add(self, text: str) -> None:
        self.text += text

    def fold(self, *, note: str = "") -> None:
        if self.done:
            return
        self.done = True
        if self.live is not None:
            self.live.stop()
        self.con.print(fold_line(self.thought, note=note), style="dim", markup=False, highlight=False)


class StderrThinking:
    """One-shot mode: the thinking streamed dimmed to stderr (nothing with ``hide``), then the fold line."""

    def __init__(self, console, thought: Thought, *, hide: bool = False) -> None:
        self.con, self.thought, self.hide = console, thought, hide
        self.done = False
        self.started = False

    def add(self, text: str) -> None:
        if self.hide:
            return
        if not self.started:
            text = text.lstrip()
            self.started = bool(text)
        if text:
            self.con.print(text, end="", style="dim", markup=False, highlight=False, soft_wrap=True)

    def fold(self, *, note: str = "") -> None:
        if self.done:
            return
        self.done = True
        if self.started:
            self.con.print()
        self.con.print(fold_line(self.thought, note=note), style="dim", markup=False, highlight=False)
