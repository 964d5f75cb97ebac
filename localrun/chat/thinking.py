"""Thinking models in the terminal chat: the session's reasoning control and the per-turn meter.

The control is the one the server uses (``server/reply.py``, docs/architecture.md §3), reduced to what a person types:
``think`` (``/think on|off``, ``--think/--no-think``; None = the template's default, which is on) and a
budget in tokens (``/think budget N``, ``--reasoning-budget N``; None = none). ``turn_setup`` turns them into
the chat template's kwargs (``dialects.template_kwargs``: Qwen3's ``enable_thinking``) and the engine's
thinking-budget fields on ``SamplingParams`` (``backends/control.py``: after ``reasoning_budget`` thinking
tokens the engine writes the family's close and the model answers). A template that cannot turn thinking
off (DeepSeek-R1 opens the block itself) gets a budget of 0 for ``think off``: the engine closes the block at
once, as the server does. Every thinking turn also carries ``end_thinking`` (a ``threading.Event``): set it
and the engine closes the block at its next token (the chat's Ctrl-C during thinking).

``ThinkingMeter`` follows the raw reply text of one turn: whether the block is open, how many completion
tokens it took (markers included, as ``usage.completion_tokens_details.reasoning_tokens`` counts them) and
the seconds from its first token to its close.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

from localrun.backends.base import SamplingParams
from localrun.dialects import Family, template_kwargs
from localrun.errors import ConfigError

BUDGET_USAGE = "/think budget N (tokens of thinking; 0 = answer at once), /think budget off (no budget)"


@dataclass
class TurnSetup:
    """What one chat turn sends: ``kwargs`` for the chat template, ``params`` (a copy of the session's
    with the budget fields set), ``thinking`` (this turn may think: the parser splits it off)."""

    kwargs: dict
    params: SamplingParams
    thinking: bool


def thinks(family: Family, think: bool | None) -> bool:
    """Whether a turn of ``family`` with the ``think`` setting produces a thinking block to split off
    (off with a template toggle: no block; off without one: a block closed at once)."""
    t = family.thinking
    return t is not None and (think is not False or not t.toggle_kwarg)


def turn_setup(family: Family, params: SamplingParams, *, think: bool | None, budget: int | None,
               end_thinking: threading.Event | None = None) -> TurnSetup:
    """The template kwargs and sampling parameters of one turn (module docstring). ``budget``: tokens,
    None = no budget. ``params`` is not modified. A constrained answer (``--json-schema``/``--regex``)
    gets no budget fields: its grammar starts at the first token."""
    t = family.thinking
    kwargs = template_kwargs(family, think=think, level=None)
    thinking = thinks(family, think)
    p = replace(params)
    if thinking and p.constraint is None:
        p.reasoning_budget = 0 if think is False else budget
        p.budget_close = t.budget_close
        p.think_open, p.think_close = t.open, t.close
        p.starts_in_thinking = t.opened_by_template
        p.end_thinking = end_thinking
    return TurnSetup(kwargs, p, thinking)


def parse_budget(arg: str) -> int | None:
    """``/think budget`` ARG → tokens (≥ 0) or None for ``off``/``none``/``-1``. Raises ConfigError."""
    a = arg.strip().lower()
    if a in ("off", "none", "-1", "unlimited"):
        return None
    try:
        n = int(a)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"{arg!r} is not a thinking budget", hint=f"use {BUDGET_USAGE}")
    return n


def describe(family: Family, think: bool | None, budget: int | None) -> str:
    """One line for ``/think`` alone: whether this model thinks, the setting, the budget."""
    t = family.thinking
    if t is None:
        return f"this model does not think (its chat template, family {family.name}, has no thinking block)"
    state = {None: "on (the template's default)", True: "on", False: "off"}[think]
    how = f"template switch {t.toggle_kwarg}" if t.toggle_kwarg else "no template switch: off = budget 0"
    b = "none" if budget is None else f"{budget} tokens"
    return f"thinking {state} · budget {b} · family {family.name} ({how}) · Ctrl-C while it thinks: answer now"


def switch_message(family: Family, on: bool) -> str:
    """What ``/think on|off`` says it did (the setting itself is the caller's)."""
    t = family.thinking
    if on:
        return "thinking on"
    if t.toggle_kwarg:
        return f"thinking off (template switch {t.toggle_kwarg})"
    return (f"this template ({family.name}) has no switch to turn thinking off: the thinking block is closed "
            "at once instead (budget 0)")


@dataclass
class Thought:
    """The thinking of one turn: ``tokens`` (completion tokens inside the block, markers included),
    ``seconds`` (from its first token to its close, the prompt's processing not included), ``ended_early``
    (the close was forced by the user: Ctrl-C), ``started_at`` (``time.perf_counter()`` of its first
    token; None before)."""

    tokens: int = 0
    seconds: float = 0.0
    ended_early: bool = False
    started_at: float | None = None

    def elapsed_s(self) -> float:
        """Seconds since the first thinking token (0 before it): the live clock while it is open."""
        return 0.0 if self.started_at is None else time.perf_counter() - self.started_at


class ThinkingMeter:
    """Follows one turn's raw text (module docstring). ``open``: the block is open now."""

    def __init__(self, family: Family, thinking: bool) -> None:
        self.t = family.thinking
        self.thought = Thought()
        if not thinking or self.t is None:
            self.state = "done"
        else:
            self.state = "thinking" if self.t.opened_by_template else "before"
        self.tail = ""  # recent raw text: enough to see a marker cut over several tokens

    @property
    def open(self) -> bool:
        return self.state == "thinking"

    @property
    def seen(self) -> bool:
        """The turn had a thinking block (open now or closed)."""
        return self.state == "thinking" or (self.state == "done" and self.thought.tokens > 0)

    def add(self, text: str, is_token: bool, answered: bool) -> None:
        """One engine chunk: its ``text``, whether it carried a token, whether the answer has begun
        (the parser gave non-whitespace content: a model that answers without opening the block)."""
        if self.state == "done":
            return
        self.tail += text
        if self.state == "before":
            if self.t.open not in self.tail:
                if answered:
                    self.state = "done"
                self.tail = self.tail[-len(self.t.open):]
                return
            self.state = "thinking"
            self.tail = self.tail[self.tail.index(self.t.open) + len(self.t.open):]
        now = time.perf_counter()
        if self.thought.started_at is None:
            self.thought.started_at = now
        self.thought.tokens += is_token
        self.thought.seconds = now - self.thought.started_at
        if self.t.close in self.tail:
            self.state = "done"
        self.tail = self.tail[-len(self.t.close):]
