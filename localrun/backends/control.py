"""Per-generation token control, shared by both engines: forced tokens, token masks, "complete".

A ``TokenControl`` steers ONE generation. The engine asks it, before each token:

* ``forced()`` → a token id to emit WITHOUT sampling (the reasoning budget's close tag; a constraint's
  fast-forward), or None. A forced token is decoded like a sampled one, goes through ``TextStream`` like
  any token (clients see its text; stop strings and ``max_tokens`` apply) and is fed to the sampler
  chain's history (penalties, grammar).
* ``mask()`` → ``numpy.ndarray`` of bool, shape ``[engine.n_vocab]``, True = allowed, or None = no
  restriction. Only asked when ``forced()`` gave None. llama.cpp sets the disallowed logits of THAT
  sequence's logits row to -inf before its sampler chain runs (so constrained and free sequences share a
  batch); MLX applies it to the logits array with ``mx.where``. Reported logprobs stay the model's own
  (taken before the mask).

then, after the token is chosen (forced or sampled):

* ``accept(token)`` → None: advance the control's state with the emitted token.
* ``complete()`` → bool: True ends the generation with finish reason ``stop`` (the constraint is satisfied
  and allows nothing but EOS). Checked after every ``accept``.

An end-of-generation token the model samples still ends the generation as usual (after ``accept``).

Building controls from ``SamplingParams`` (``build_control(engine, params)``, called in the engines'
``start``/``generate``; None when the request needs none, so the plain path costs nothing):

* ``params.reasoning_budget`` or ``params.end_thinking`` is not None, or the thinking markers are set
  (``params.think_close``: a thinking request, whose answer must not open a second block) → a
  ``ReasoningBudget`` (below; ``end_thinking.is_set()`` spends the budget now: the chat's Ctrl-C while the
  model thinks; without a budget it only masks the markers in the answer);
* ``params.constraint`` is not None → the constraint compiler, ``compiler(engine, constraint) -> TokenControl``:
  llguidance's (``constrain.control.token_control``, imported on the first constrained request; constrain/
  never imports this module back), or the one ``register_constraint_compiler`` set instead. It reads
  the engine's vocabulary through ``vocab_pieces(engine)`` (bytes of every token id, control tokens'
  text included), ``engine.n_vocab``, ``engine.is_eog``, ``engine.tokenize``. It raises a
  ``LocalrunError`` subclass for a constraint it cannot enforce. With the compiler unset (None) a
  constraint raises BackendUnavailableError (never silently ignored).

Several controls compose with ``ControlSet`` (budget first, then the constraint): ``forced()`` is the
first control's non-None answer, masks are AND-ed, ``accept`` goes to every control (so a constraint
sees the budget's forced tokens: a constraint that runs alongside a thinking budget must allow the
thinking block), ``complete()`` is any control's.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from localrun.errors import BackendUnavailableError, LocalrunError

if TYPE_CHECKING:
    import numpy as np

    from localrun.backends.base import Constraint, SamplingParams


class TokenControl(Protocol):
    """One generation's token control (module docstring). Token ids are ints in ``0..n_vocab-1``."""

    def forced(self) -> int | None: ...

    def mask(self) -> np.ndarray | None: ...

    def accept(self, token: int) -> None: ...

    def complete(self) -> bool: ...


class ControlSet:
    """Several ``TokenControl``s as one (module docstring: first forced wins, masks AND-ed, accept to all,
    complete if any)."""

    def __init__(self, controls: Sequence[TokenControl]) -> None:
        self.controls = list(controls)

    def forced(self) -> int | None:
        for c in self.controls:
            tok = c.forced()
            if tok is not None:
                return tok
        return None

    def mask(self) -> np.ndarray | None:
        out = None
        for c in self.controls:
            m = c.mask()
            if m is not None:
                out = m if out is None else (out & m)
        return out

    def accept(self, token: int) -> None:
        for c in self.controls:
            c.accept(token)

    def complete(self) -> bool:
        return any(c.complete() for c in self.controls)


ConstraintCompiler = Callable[[object, "Constraint"], TokenControl]


def compile_with_llguidance(engine, constraint: Constraint) -> TokenControl:
    """The default constraint compiler: llguidance's token control for ``engine``'s vocabulary
    (``constrain.control.token_control``; raises ConstraintError, BackendUnavailableError without llguidance)."""
    from localrun.constrain.control import token_control

    return token_control(constraint, engine)


_compiler: ConstraintCompiler | None = compile_with_llguidance


def register_constraint_compiler(fn: ConstraintCompiler | None) -> None:
    """Set the function that turns ``SamplingParams.constraint`` into a ``TokenControl`` for an engine:
    ``fn(engine, constraint) -> TokenControl`` in place of ``compile_with_llguidance`` (None: constraints
    raise BackendUnavailableError). One for the process; the last call wins."""
    global _compiler
    _compiler = fn


def build_control(engine, params: SamplingParams) -> TokenControl | None:
    """The control for one generation of ``engine`` with ``params``, or None when it needs none.
    Raises BackendUnavailableError (a constraint and the compiler unset), LocalrunError (a budget
    without markers; whatever the constraint compiler raises)."""
    controls: list[TokenControl] = []
    if params.reasoning_budget is not None or params.end_thinking is not None or params.think_close:
        controls.append(ReasoningBudget.for_engine(engine, params))
    if params.constraint is not None:
        if _compiler is None:
            raise BackendUnavailableError(
                "constrained decoding is not available in this build (no constraint compiler registered)",
                hint="install llguidance (pip install llguidance) or send the request without a constraint")
        controls.append(_compiler(engine, params.constraint))
    if not controls:
        return None
    return controls[0] if len(controls) == 1 else ControlSet(controls)


# ---------------------------------------------------------------------------------------------- vocabulary
_pieces: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ban_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocab_pieces(engine) -> list[bytes]:
    """The bytes of every token id ``0..engine.n_vocab-1`` as the model writes them, control tokens' text
    included (``engine.token_bytes(t, special=True)``); b"" for ids without text. Computed once per engine
    (≈ 0.1 s for a 50k vocabulary)."""
    got = _pieces.get(engine)
    if got is None:
        got = [engine.token_bytes(t, special=True) for t in range(engine.n_vocab)]
        _pieces[engine] = got
    return got


def tag_ban_masks(engine, tag: bytes) -> list[np.ndarray]:
    """``masks[k]`` (k = 0..len(tag)-1): bool ``[n_vocab]``, False for the tokens whose piece would complete
    ``tag`` in output text that currently ends with ``tag[:k]`` (the piece contains ``tag``, or starts with
    ``tag[k:]``). Cached per engine and tag."""
    import numpy as np

    per_engine = _ban_tables.setdefault(engine, {})
    if tag in per_engine:
        return per_engine[tag]
    arr = np.array(vocab_pieces(engine), dtype=bytes)  # fixed width 'S': trailing NUL bytes drop, harmless here
    holds = np.char.find(arr, tag) >= 0
    masks = [~holds] + [~(holds | np.char.startswith(arr, tag[k:])) for k in range(1, len(tag))]
    per_engine[tag] = masks
    return masks


# ---------------------------------------------------------------------------------------------- budget
class ReasoningBudget:
    """The thinking budget (docs/architecture.md §2): count the tokens generated inside the thinking block; when the
    count reaches ``budget`` tokens, force the tokens of ``close`` (the family's close tag + transition),
    then let the model answer.

    * The block is open from the start with ``starts_in_thinking`` (the prompt ended inside it), or once the
      output contains ``think_open``; it ends when the output after the opening contains ``think_close``
      (the model closed it, or the forced tokens did).
    * Thinking tokens counted: those emitted while the block is open, forced ones excluded, so the block
      holds at most ``budget`` model tokens + ``len(close_tokens)``.
    * After a forced close, the close tag is banned (``tag_ban_masks``): the answer never contains it (a
      block the model closed itself is left alone: gpt-oss writes ``<|end|>`` after later messages too).
    * Once the block is closed, by the model or forced, the open tag is banned the same way: the answer
      never opens a second block (harmony, gpt-oss, is the exception where the model closed it: its reply
      is several messages and a later analysis message is the format's own).

    ``close_tokens``: ``budget_close`` tokenized once with control-token parsing (a marker such as
    ``<|end|>`` becomes its token); ``pieces``: bytes of every token id (``vocab_pieces``).
    """

    def __init__(self, budget: int | None, close_tokens: list[int], think_open: bytes, think_close: bytes,
                 starts_in_thinking: bool, pieces: Sequence[bytes], ban_masks: list, end_now=None,
                 open_ban_masks: list | None = None) -> None:
        self.budget = None if budget is None else max(0, int(budget))  # None: only ``end_now`` ends it
        self.end_now = end_now  # SamplingParams.end_thinking: once set, the budget counts as spent
        self.close_tokens = list(close_tokens)
        self.open_tag, self.close_tag = think_open, think_close
        self.pieces = pieces
        self.ban_masks = ban_masks
        self.open_ban_masks = open_ban_masks  # tag_ban_masks of think_open; None: the open tag is not banned
        self.harmony = think_open.startswith(b"<|channel|>")  # gpt-oss: several messages per reply
        self.state = "thinking" if starts_in_thinking else ("before" if think_open else "answer")
        self.n_thinking = 0  # model tokens emitted inside the block, tokens
        self.queue: list[int] = []  # forced tokens still to emit
        self.forcing = False
        self.text = b""  # output since the block opened (thinking), or its tail (before / answer)

    @classmethod
    def for_engine(cls, engine, p: SamplingParams) -> ReasoningBudget:
        close = p.think_close
        if not close:
            raise LocalrunError("a reasoning budget needs the thinking block's close marker (think_close)",
                                hint="this model's template has no thinking block; send no budget")
        text = p.budget_close or close
        toks = engine.tokenize(text, add_special=False, parse_special=True)
        opener = p.think_open.encode()
        return cls(p.reasoning_budget, toks, opener, close.encode(), p.starts_in_thinking,
                   vocab_pieces(engine), tag_ban_masks(engine, close.encode()), p.end_thinking,
                   open_ban_masks=tag_ban_masks(engine, opener) if opener else None)

    def forced(self) -> int | None:
        if self.state == "thinking" and not self.forcing and self._spent():
            self.forcing, self.queue = True, list(self.close_tokens)
        return self.queue[0] if self.queue else None

    def _spent(self) -> bool:
        return ((self.budget is not None and self.n_thinking >= self.budget)
                or (self.end_now is not None and self.end_now.is_set()))

    def mask(self) -> np.ndarray | None:
        if self.state != "answer":
            return None
        out = None
        if self.forcing:
            out = _ban(self.ban_masks, self.close_tag, self.text)
        if self.open_ban_masks is not None and (self.forcing or not self.harmony):
            ban = _ban(self.open_ban_masks, self.open_tag, self.text)
            out = ban if out is None else out & ban
        return out

    def accept(self, token: int) -> None:
        forced = bool(self.queue) and self.queue[0] == token
        if forced:
            self.queue.pop(0)
        elif self.queue:  # something else was emitted (another control forced it): stop forcing
            self.queue = []
        piece = self.pieces[token] if 0 <= token < len(self.pieces) else b""
        if self.state == "before":
            self.text += piece
            i = self.text.find(self.open_tag)
            if i >= 0:
                self.state, self.text = "thinking", self.text[i + len(self.open_tag):]
            else:
                self.text = _tail(self.text, len(self.open_tag) - 1)
            return
        if self.state == "thinking":
            if not forced:
                self.n_thinking += 1
            self.text += piece
            i = self.text.find(self.close_tag)
            if i >= 0:
                self.state, self.text = "answer", self.text[i + len(self.close_tag):]
            else:
                self.text = _tail(self.text, len(self.close_tag) - 1)
            return
        self.text = _tail(self.text + piece, max(len(self.close_tag), len(self.open_tag)) - 1)

    def complete(self) -> bool:
        return False


def _ban(masks: list, tag: bytes, tail: bytes):
    """The allowed-token mask that keeps ``tag`` out of output whose last bytes are ``tail``
    (``masks``: ``tag_ban_masks`` of ``tag``)."""
    out = masks[0]
    for k in range(1, min(len(tag) - 1, len(tail)) + 1):
        if tail.endswith(tag[:k]):
            out = out & masks[k]
    return out


def _tail(b: bytes, n: int) -> bytes:
    """The last ``n`` bytes of ``b`` (b"" for n <= 0)."""
    return b[max(0, len(b) - n):] if n > 0 else b""
