"""Decode-to-text, shared by every backend: one ``TextStream`` per generation turns sampled tokens into text
chunks and decides when the generation ends, so both backends have the same stop semantics by construction.

Per token it does, in this order (the order llama-server's ``process_token`` uses, tools/server/server.cpp):

1. an end-of-generation token ends the generation with ``stop`` (its text is never shown);
2. the token's bytes join the text through an incremental UTF-8 decoder (a character split over two
   tokens is emitted once whole);
3. a stop string ends it with ``stop``; the text is cut where the stop string begins. Stop strings apply to
   the answer only (``AnswerStart``): on a thinking request (``SamplingParams.think_close`` set) the thinking
   block, its markers and the blank space after it are never searched, so a stop string neither cuts
   the thought nor matches the close marker the engine forces when a budget runs out;
4. ``max_tokens`` reached, or the context full, ends it with ``length``;
5. with ``SamplingParams.stop_loops``, a generation stuck repeating itself ends with ``loop``
   (``LoopDetector``);
6. otherwise the text is emitted, holding back a suffix that could still become a stop string.

Also here: ``common_prefix`` (prefix caching compares token lists with it), and ``LogprobRelease``, which
hands each token's logprobs out with the chunk that shows its text (a stop string holds text back).
"""

from __future__ import annotations

import codecs
from collections import deque
from typing import Sequence

FINISH_REASONS = ("stop", "length", "loop", "cancelled")


class AnswerStart:
    """Where the answer begins in a thinking reply's text, found as the text grows (characters).

    ``think_open``/``think_close``: the block's markers (""/"": no thinking, the answer is all of the text);
    ``starts_in_thinking``: the prompt ended inside the block. Otherwise the block is the model's own only
    when its reply opens with ``think_open`` after blank space, as ``dialects.ReplyParser`` reads it. The
    answer begins at the first non-blank character after the first ``think_close`` (the family's transition,
    e.g. ``"\\n</think>\\n\\n"``, is not answer), or at 0 when the reply does not open a block.

    ``at`` is that index, or None while it is not known; ``undecided`` is True while the reply is blank space
    and a proper prefix of ``think_open`` (it may still open a block or be the answer)."""

    def __init__(self, think_open: str, think_close: str, starts_in_thinking: bool) -> None:
        self.open, self.close = think_open, think_close
        self.state = "answer" if not think_close else "thinking" if starts_in_thinking else \
            "before" if think_open else "answer"
        self.at: int | None = 0 if self.state == "answer" else None
        self.scan = 0  # where the search for the close marker (thinking) or for the answer (after) resumes

    @property
    def undecided(self) -> bool:
        return self.state == "before"

    def update(self, text: str) -> int | None:
        """``text``: the whole reply so far → ``at``."""
        if self.state == "before":
            body = text.lstrip()
            if body.startswith(self.open):
                self.state, self.scan = "thinking", len(text) - len(body) + len(self.open)
            elif not self.open.startswith(body):
                self.state, self.at = "answer", 0
                return 0
        if self.state == "thinking":
            i = text.find(self.close, self.scan)
            if i < 0:
                self.scan = max(self.scan, len(text) - len(self.close) + 1)
                return None
            self.state, self.scan = "after", i + len(self.close)
        if self.state == "after":
            rest = text[self.scan:]
            if not rest.strip():
                self.scan = len(text)
                return None
            self.state, self.at = "answer", self.scan + len(rest) - len(rest.lstrip())
        return self.at


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

    ``params``: the request's ``SamplingParams`` (``stop``, ``max_tokens``, ``stop_loops``; ``think_open``,
    ``think_close``, ``starts_in_thinking``: where the answer that stop strings apply to begins); ``n_ctx``:
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
        self.answer = AnswerStart(getattr(params, "think_open", "") or "", getattr(params, "think_close", "") or "",
                                  bool(getattr(params, "starts_in_thinking", False)))

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
        at = self.answer.update(self.text) if self.stops else 0
        if self.stops and at is not None:
            lo = max(at, self.sent - max(len(s) for s in self.stops))
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
        end = len(self.text)
        if self.stops and at is not None:  # hold back what could still become a stop string (answer only)
            end -= min(partial_stop_len(self.text, self.stops), len(self.text) - at)
        elif self.stops and self.answer.undecided:  # it may still be the answer: hold all of it
            end = self.sent
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


class LogprobRelease:
    """Each token's logprobs with the chunk that shows its text, for one generation.

    ``TextStream`` holds text back while it could still become a stop string (and a character split over
    tokens until it is whole), so the chunk of token k may show none of k's text and a later chunk shows
    it. ``push(text, logprobs)`` takes a chunk's shown ``text`` and its tokens' ``TokenLogprob``s and returns
    the entries whose text is now all shown, in token order; with ``final`` (the last chunk) also those
    whose text is partly shown, and it drops those whose text the finish cut off (the tokens of a matched
    stop string): so every entry belongs to text the reply holds, streamed or not (llama-server drops a
    stop string's tokens the same way, tools/server/server.cpp ``send_final_response``).

    Token k's text is characters ``[start_k, end_k)`` of the generation's text, found by decoding the
    entries' ``bytes`` with the same incremental UTF-8 decoder ``TextStream`` uses."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.decoded = 0  # characters decoded from the entries so far
        self.shown = 0  # characters the chunks have shown so far
        self.pending: deque = deque()  # (start, end, entry), in token order

    def push(self, text: str, logprobs: Sequence | None, *, final: bool = False) -> list:
        for t in logprobs or ():
            start = self.decoded
            self.decoded += len(self.decoder.decode(bytes(t.bytes)))
            self.pending.append((start, self.decoded, t))
        self.shown += len(text)
        out = []
        while self.pending and self.pending[0][1] <= self.shown:
            out.append(self.pending.popleft()[2])
        if final:
            out += [t for start, _, t in self.pending if start < self.shown]
            self.pending.clear()
        return out
