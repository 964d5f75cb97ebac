"""One model step with tools: the prompt, the tool-call constraint, the streamed reply parsed into calls.

The prompt is the chat session's conversation (system prompt, user and assistant turns, assistant
``tool_calls`` and ``tool`` results) in the shape the template reads (``dialects.history``). A template
with tool syntax (``Family.tools``: Hermes, Llama 3, Mistral, DeepSeek, harmony) gets the tools in its
own ``tools`` variable; one without (ChatML of SmolLM2, Gemma; or one that has a call syntax but does not
list the tools, as DeepSeek-R1's distills) uses the generic format
(``dialects.generic``, llama-server's fallback): the tools are described in the system message and the
whole answer is constrained to one call or ``{"response": ...}`` (``constrain.generic_constraint``).
``choice`` is ``tool_choice``: "auto", "required", a tool's name (both forced with
``constrain.tool_call_constraint``, in the family's syntax, the arguments held to the tool's JSON Schema
by llguidance), or "none" (no call: the compaction summary; the tools stay in the prompt so its prefix is
the conversation's and the KV cache is reused). This is the server's ``prepare_chat`` (server/reply.py)
for one in-process session, built from the same parts.

The session (``chat.ChatSession``, duck-typed: layer 3 does not import chat) gives ``engine``,
``family``, ``conversation()``, ``setup(constrained=)`` (template kwargs and sampling parameters of a turn,
thinking included) and ``stream_reply(tokens, setup, parser, events)`` (the streamed ``Piece``s, thinking
split off and metered as in a plain turn; the parser's tool-call events appended to ``events``).
"""

from __future__ import annotations

import json
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import Iterator

from localrun.dialects import ReplyParser, ToolCallEnd, ToolCallStart
from localrun.dialects.history import messages_for_template


def _renders_tools(engine) -> bool:
    """Whether the engine's chat template renders a ``tools`` list (``Engine.supports_tools``; read from the
    template text where the engine does not say). A template with tool-call syntax that does not list the
    tools (DeepSeek-R1's distills) gets the generic format, so the model sees what it may call."""
    says = getattr(engine, "supports_tools", None)
    if isinstance(says, bool):
        return says
    from localrun.model.chat_template import template_supports_tools

    return template_supports_tools(getattr(engine, "template_source", None))


@dataclass
class Call:
    """A tool call the model made: ``id`` (``call_…``), ``name``, ``args`` (the parsed object)."""

    id: str
    name: str
    args: dict

    def as_history(self) -> dict:
        """The OpenAI-shaped ``tool_calls`` entry for the assistant message."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.args, ensure_ascii=False)}}


@dataclass
class StepReply:
    """What one step produced: answer ``content``, ``thinking``, ``calls``; ``finish`` the last chunk
    (None when the step was stopped)."""

    content: str = ""
    thinking: str = ""
    calls: list[Call] = field(default_factory=list)
    finish: object = None
    unenforced: str | None = None  # why the tools' constraint was left off (a schema llguidance cannot take)


class Stepper:
    """Model steps of ``session`` offering ``tools`` (OpenAI tool definitions; None or []: none)."""

    def __init__(self, session, tools: list[dict] | None) -> None:
        self.session = session
        self.tools = tools or None
        fam = session.family
        self.generic = self.tools is not None and (fam.tools is None or not _renders_tools(session.engine))
        self.family = replace(fam, tools="generic") if self.generic else fam

    def _history_family(self, messages: list[dict]):
        """The family whose shape past tool calls take (server/reply.py ``_history_family``): a template
        without tool syntax that does not render ``tool_calls`` gets them as text in the generic format."""
        fam = self.family
        has_tools = any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
        src = getattr(self.session.engine, "template_source", None) or ""
        if has_tools and fam.tools is None and "tool_calls" not in src:
            return replace(fam, tools="generic")
        return fam

    def prompt(self, messages: list, *, constrained: bool = False) -> tuple[list[int], object]:
        """The prompt tokens of ``messages`` (the whole conversation, system prompt included, as ``Message``s)
        and the turn's setup (``session.setup``). Raises ChatTemplateError."""
        from localrun.dialects.generic import add_system, instructions

        dicts = [m.to_dict() | ({"images": m.images} if getattr(m, "images", None) else {}) for m in messages]
        msgs = messages_for_template(dicts, self._history_family(dicts))
        if self.generic:
            msgs = add_system(msgs, instructions(self.tools))
        setup = self.session.setup(constrained=constrained or self.generic)
        tokens = self.session.engine.tokenize_chat(msgs, tools=None if self.generic else self.tools,
                                                   template_kwargs=setup.kwargs or None)[1]
        return tokens, setup

    def count(self, messages: list) -> int:
        """Prompt tokens of ``messages`` as this stepper renders them."""
        return len(self.prompt(messages)[0])

    def constraint(self, choice: str, setup):
        """The ``Constraint`` for ``choice`` (module docstring), None for free text. Raises ConstraintError
        (a tool's schema llguidance cannot enforce: the caller offers the tools unconstrained)."""
        from localrun.constrain import generic_constraint, tool_call_constraint

        if self.tools is None:
            return None
        name = None if choice in ("auto", "required", "none") else choice
        if self.generic:
            c = generic_constraint(self.tools, name, required=choice == "required", answer_only=choice == "none")
        elif choice in ("auto", "none"):
            return None
        else:  # the syntax alone, as the server passes it: thinking is handled below
            c = tool_call_constraint(self.family.tools, self.tools, name)
        t = self.family.thinking
        if setup.thinking and t is not None and t.opened_by_template:  # the prompt opened the block: close it (R1)
            import re

            from localrun.backends.base import Constraint

            body = re.sub(r"^start:", "tool_call:", c.source, count=1, flags=re.M)
            c = Constraint("lark", f"start: {json.dumps(t.budget_close)} tool_call\n{body}", param=c.param)
        return c

    def lenient_constraint(self, choice: str, setup) -> tuple[object, str | None]:
        """``constraint``, leniently: under "auto"/"none" a tool schema llguidance cannot enforce leaves the
        step unconstrained → (None, why); the calls are still checked against the schemas (``toolbox``).
        Raises ConstraintError for a forced ``choice``."""
        from localrun.errors import ConstraintError

        try:
            return self.constraint(choice, setup), None
        except ConstraintError as e:
            if choice not in ("auto", "none"):
                raise
            return None, e.message

    def run(self, messages: list, choice: str = "auto", reply: StepReply | None = None, *,
            overrides: dict | None = None) -> Iterator:
        """Stream one step over ``messages``: yields the session's ``Piece``s; ``reply`` (a StepReply) is
        filled as it goes (content, thinking, calls, finish; ``unenforced``: why the step ran without its
        constraint). ``overrides``: SamplingParams fields for this step (the summary's ``max_tokens``).
        Raises ChatTemplateError, ContextOverflowError, ConstraintError (a forced ``choice`` only:
        ``lenient_constraint``)."""

        reply = reply if reply is not None else StepReply()
        forced = choice not in ("auto", "none")
        tokens, setup = self.prompt(messages, constrained=forced)
        c, reply.unenforced = self.lenient_constraint(choice, setup)
        params = replace(setup.params, constraint=c, **(overrides or {}))
        if c is not None:  # the constraint starts at the first token: no thinking budget fields
            params = replace(params, reasoning_budget=None, end_thinking=None)
        thinking = setup.thinking and not (c is not None and self.family.thinking is not None
                                           and self.family.thinking.toggle_kwarg)
        parser = ReplyParser(self.family, thinking=thinking, tools=self.tools is not None and choice != "none")
        events: list = []
        stream = self.session.stream_reply(tokens, replace(setup, params=params, thinking=thinking), parser, events)
        with closing(stream):
            yield from self._follow(stream, reply, events)

    def _follow(self, stream, reply: StepReply, events: list) -> Iterator:
        names: dict[int, tuple[str, str]] = {}
        content, thought = [], []
        for piece in stream:
            content.append(piece.text)
            thought.append(piece.thinking)
            reply.content, reply.thinking = "".join(content), "".join(thought)
            for e in events:
                if isinstance(e, ToolCallStart):
                    names[e.index] = (e.id, e.name)
                elif isinstance(e, ToolCallEnd) and e.index in names:
                    reply.calls.append(Call(*names[e.index], e.arguments))
            events.clear()
            if piece.finish_reason:
                reply.finish = piece
            yield piece
