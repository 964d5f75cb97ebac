"""Decode-to-text, shared by every backend: one ``TextStream`` per generation turns sampled tokens into text
chunks and decides when the generation ends, so both backends have the same stop semantics by construction.

Per token it does, in this order (the order llama-server's ``process_token`` uses, tools/server/server.cpp):

1. an end-of-generation token ends the generation with ``stop`` (its text is never shown);
2. the token's bytes join the text through an incremental UTF-8 decoder (a character split over two
   tokens is emitted once whole);
3. a stop string ends it with ``stop``; the text is cut where the stop string begins;
4. ``max_tokens`` reached, or the context full, ends it with ``length``;
5. with ``SamplingParams.stop_loops``, a generation stuck repeating itself ends with ``loop``
   (``LoopDetector``);
6. otherwise the text is emitted, holding back a suffix that could still become a stop string.

Also here: ``common_prefix`` (prefix caching compares token lists with it).
"""

from __future__ import annotations

import codecs
from typing import Sequence

FINISH_REASONS = ("stop", "length", "loop", "cancelled")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def partial_stop_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string (characters)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best




class LoopDetector:
    """Says when the last generated tokens are one cycle repeated: a degenerate loop ("the the the",
    one sentence over and over) that small models fall into and that would otherwise run to the end of
    the context.

    Token sequence t[0..n): for every period ``p`` in 1..``max_period`` it keeps ``run[p]``, the number
    of consecutive recent positions i with t[i] == t[i - p]. The generation is looping when, for some p,
    the last ``max(min_repeats × p, min_span)`` tokens are periodic with period p, i.e.
    ``run[p] >= max(min_repeats × p, min_span) - p``: the cycle was written ``min_repeats`` times in a row
    and covers at least ``min_span`` tokens (so a legitimately repeated short item, a row of dashes in a
    table, a short list, is left alone). O(max_period) integer work per token.

    Defaults: ``max_period`` 200 tokens (a repeated paragraph), ``min_repeats`` 3, ``min_span`` 64 tokens.
    """

    def __init__(self, max_period: int = 200, min_repeats: int = 3, min_span: int = 64) -> None:
        self.max_period = max_period
        self.min_repeats = min_repeats
        self.min_span = min_span
        self.tokens: list[int] = []
        self.run = [0] * (max_period + 1)
        self.period: int | None = None  # the cycle's length in tokens, once detected

    def push(self, tok: int) -> bool:
        """Add one generated token; True when the generation is now looping (``period`` is set)."""
        t = self.tokens
        t.append(tok)
        n = len(t)
        run = self.run
        for p in range(1, min(self.max_period, n - 1) + 1):
            if t[n - 1 - p] == tok:
                run[p] += 1
                if run[p] + p >= max(self.min_repeats * p, self.min_span):
                    self.period = p
                    return True
            else:
                run[p] = 0
        return False


class TextStream:
    """Sampled tokens → text chunks and the finish reason, for one generation.

    ``params``: the request's ``SamplingParams`` (``stop``, ``max_tokens``, ``stop_loops``); ``n_ctx``:
    the sequence's context window (tokens). ``push`` returns ``(text, finish_reason)``: the new text to
    show (may be '' while a stop string or a UTF-8 sequence is pending) and ``None`` or one of
    ``stop``/``length``/``loop``. After a finish, ``text`` holds the whole answer.
    """

    def __init__(self, params, n_ctx: int) -> None:
        self.stops = [s for s in (params.stop or ()) if s]
        self.max_tokens = params.max_tokens
        self.n_ctx = n_ctx
        self.loops = LoopDetector() if getattr(params, "stop_loops", False) else None
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.sent = 0  # characters of ``text`` already returned
        self.n_generated = 0
        self.finish_reason: str | None = None

    @property
    def loop_period(self) -> int | None:
        """Length in tokens of the cycle that ended the generation (finish reason ``loop``)."""
        return self.loops.period if self.loops else None

    def push(self, tok: int, piece: bytes, *, eog: bool, n_ctx_used: int) -> tuple[str, str | None]:
        """One sampled token: its bytes ``piece`` (ignored when ``eog``), whether it ends the generation
        (``eog``), and ``n_ctx_used``, the tokens in the sequence's KV once it is decoded."""
        self.n_generated += 1
        if eog:
            return self._finish("stop", flush=False)
        self.text += self.decoder.decode(piece)
        if self.stops:
            lo = max(0, self.sent - max(len(s) for s in self.stops))
            hits = [i for i in (self.text.find(s, lo) for s in self.stops) if i >= 0]
            if hits:
                self.text = self.text[:min(hits)]
                return self._finish("stop", flush=False)
        if self.max_tokens is not None and self.n_generated >= self.max_tokens:
            return self._finish("length")
        if n_ctx_used + 1 >= self.n_ctx:
            return self._finish("length")
        if self.loops is not None and self.loops.push(tok):
            return self._finish("loop")
        end = len(self.text) - (partial_stop_len(self.text, self.stops) if self.stops else 0)
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out, None

    def finish(self, reason: str) -> tuple[str, str]:
        """End the generation now with ``reason`` (a token control is complete: ``stop``) → the text not
        yet returned (a held-back partial stop string included) and ``reason``."""
        return self._finish(reason)

    def _finish(self, reason: str, *, flush: bool = True) -> tuple[str, str]:
        if flush:
            self.text += self.decoder.decode(b"", final=True)
        out = self.text[self.sent:]
        self.sent = len(self.text)
        self.finish_reason = reason
        return out, reason
