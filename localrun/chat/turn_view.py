"""How one chat turn is written to the terminal: the answer streamed, the thinking folded, Ctrl-C during
thinking, the stats line. Shared by the plain REPL (``repl``) and agent mode (``agent_view``)."""

from __future__ import annotations

import signal

from localrun.backends.base import Stats
from localrun.chat.thinking_view import unfinished_note

__all__ = ["CtrlCEndsThinking", "show_turn", "stats_line"]


def stats_line(s: Stats) -> str:
    """'prompt 37 tok (30 cached) · TTFT 0.12 s · 81.7 tok/s · 64 tok · context 101/2048'"""
    cached = f" ({s.cached_tokens} cached)" if s.cached_tokens else ""
    spec = (f" · drafted {s.draft_tokens}, accepted {s.accepted_tokens} ({s.acceptance_rate:.0%})"
            if s.draft_tokens else "")  # speculative decoding (backends/spec_decode.py)
    return (f"prompt {s.prompt_tokens} tok{cached} · TTFT {s.ttft_s:.2f} s · {s.decode_tok_s:.1f} tok/s · "
            f"{s.completion_tokens} tok · context {s.n_ctx_used}/{s.n_ctx}{spec}")


def show_turn(session, stream, out, make_view, on_piece=None):
    """Write one chat turn: thinking to the view ``make_view(thought)`` gives (created when the block
    opens, folded when it closes or the turn ends), answer text to ``out``; ``on_piece()`` is called after
    each piece (``CtrlCEndsThinking.arm``). → the last piece (with
    ``finish_reason`` and ``stats``), None when the stream ended without one. Exceptions (Ctrl-C, engine
    errors) pass through after the view is folded."""
    view, last = None, None
    try:
        for piece in stream:
            thinking = getattr(piece, "thinking", "")  # raw completion gives plain Chunks
            if view is None and make_view is not None and session.thought is not None and (
                    session.thinking_open or thinking):
                view = make_view(session.thought)
            if view is not None:
                if thinking:
                    view.add(thinking)
                if not session.thinking_open:
                    view.fold()
            if piece.text:
                out.write(piece.text)
                out.flush()
            if piece.finish_reason:
                last = piece
            if on_piece is not None:
                on_piece()
    finally:
        if view is not None:
            view.fold(note=unfinished_note(last and last.finish_reason) if session.thinking_open else "")
    return last


class CtrlCEndsThinking:
    """While a thinking block is open, the first Ctrl-C (SIGINT) ends the thinking (``session.end_thinking``)
    instead of raising KeyboardInterrupt; any other Ctrl-C raises it as usual. ``arm()`` installs the
    handler once the prompt is processed (the first piece): during a prefill the engine's own Ctrl-C
    handling (llama.cpp's abort callback) stays in charge. A context manager: leaving restores the handler.
    Main thread only (elsewhere nothing changes)."""

    def __init__(self, session) -> None:
        self.session = session
        self.old = None
        self.armed = False

    def _handler(self, signum, frame) -> None:
        if self.session.end_thinking():
            return
        raise KeyboardInterrupt

    def arm(self) -> None:
        if self.armed:
            return
        self.armed = True
        try:
            self.old = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread
            self.old = None

    def __enter__(self) -> CtrlCEndsThinking:
        return self

    def __exit__(self, *exc) -> None:
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
            self.old = None
