"""The agent loop: the model calls a tool → approval → the result → the next step, until it answers.

``AgentLoop.run(text)`` adds the user message and yields, in order:

* ``StepStream(n, stream)``: step ``n``'s reply as the session's ``Piece``s (answer and thinking text);
  the caller consumes ``stream`` before asking for the next item (``chat.repl.show_turn`` renders it);
* for each tool call of that step: ``CallShown`` (the call and what approval shows first: a unified diff
  for a write), then ``CallDone`` (the approval decision and the result the model reads);
* ``Note``: a line to show (compaction, the step limit, a result cut, context dropped).

Each step is recorded in the session's history as it ends (also a partial one: a Ctrl-C closes the
generator, the partial answer and every call's result — "stopped by the user" for those not run — are
kept, so no call is left without its result). Arguments that fail the tool's JSON Schema, an unknown
tool, a declined call, a tool that failed: each is the call's result, for the model to read. After
``max_steps`` steps the loop stops with a ``Note`` saying so, and also when a step repeats the previous
step's calls with the same arguments (a small model going round in a circle). Before each step the ``compact`` context
policy compacts the history past 0.8 of the window (``agent.compact``); what still does not fit drops
whole turns from the start, the current turn always kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from localrun.agent.approvals import Approvals, Decision
from localrun.agent.compact import COMPACT_AT, compact
from localrun.agent.step import Call, Stepper, StepReply
from localrun.agent.toolbox import Result, Toolbox

DEFAULT_MAX_STEPS = 10


@dataclass
class StepStream:
    n: int
    stream: Iterator


@dataclass
class CallShown:
    """A call about to be decided: ``preview`` is shown before the approval question ("" for none);
    ``problem``: why it cannot run (bad arguments, unknown tool), so it is not asked about."""

    call: Call
    preview: str
    asks: bool
    problem: str | None = None


@dataclass
class CallDone:
    call: Call
    result: Result
    decision: Decision | None = None


@dataclass
class Note:
    text: str


class AgentLoop:
    """Agent turns of a chat ``session`` (``chat.ChatSession``) with ``toolbox``'s tools.

    ``tool_choice``: the first step of each turn — "auto", "required" or a tool's name (forced by a
    constraint: ``agent.step``); later steps are "auto". ``max_steps``: model steps per turn at most."""

    def __init__(self, session, toolbox: Toolbox, approvals: Approvals, *, max_steps: int = DEFAULT_MAX_STEPS,
                 tool_choice: str = "auto") -> None:
        self.session = session
        self.toolbox = toolbox
        self.approvals = approvals
        self.max_steps = max_steps
        self.tool_choice = tool_choice

    def _message(self, role: str, content: str, **kw):
        return self.session.message_class(role, content, **kw)

    def run(self, text: str) -> Iterator:
        """One user turn (module docstring). Raises what a step raises (ChatTemplateError,
        ContextOverflowError, ConstraintError for a forced choice the tools cannot take)."""
        s = self.session
        s.notices.clear()
        s.messages.append(self._message("user", text))
        s.turns += 1
        previous: list = []  # the last step's calls: (name, args)
        for n in range(1, self.max_steps + 1):
            stepper = Stepper(s, self.toolbox.definitions() if self.toolbox else None)
            yield from self._fit(stepper)
            choice = self.tool_choice if n == 1 and self.toolbox else "auto"
            reply = StepReply()
            stream = stepper.run(s.conversation(), choice, reply)
            try:
                yield StepStream(n, stream)
            finally:
                stream.close()
                calls = [c.as_history() for c in reply.calls]
                s.messages.append(self._message("assistant", reply.content, tool_calls=calls or None,
                                                thinking=reply.thinking.strip() or None))
            if reply.unenforced and n == 1:
                yield Note(f"the tool calls were not constrained ({reply.unenforced}); they are still checked "
                           "against the tools' schemas")
            if not reply.calls or reply.finish is None:
                return
            same = [(c.name, c.args) for c in reply.calls]
            if same == previous:
                yield Note("stopped: the model repeated its last tool call(s) with the same arguments (their results "
                           "are in the history; send a message to steer it)")
                self._unanswered(reply.calls, "error: not run again: the same call was just made; its result is above")
                return
            previous = same
            yield from self._calls(reply.calls)
            if n == self.max_steps:
                yield Note(f"stopped: reached --max-steps {self.max_steps} (the model's last tool results are in "
                           "the history; send a message to let it go on, or raise --max-steps)")

    def _calls(self, calls: list[Call]) -> Iterator:
        done = 0
        try:
            for call in calls:
                result, decision = yield from self._call(call)
                self.session.messages.append(self._message("tool", result.text, tool_call_id=call.id,
                                                           name=call.name))
                done += 1
        finally:
            self._unanswered(calls[done:], "error: the user stopped this call")  # Ctrl-C: every call keeps a result

    def _unanswered(self, calls: list[Call], text: str) -> None:
        for call in calls:
            self.session.messages.append(self._message("tool", text, tool_call_id=call.id, name=call.name))

    def _call(self, call: Call):
        tb = self.toolbox
        problem = tb.check(call.name, call.args)
        tool = tb.tools.get(call.name)
        preview = ""
        if problem is None and tool is not None and tool.asks and tool.preview is not None:
            try:
                preview = tool.preview(call.args)
            except Exception as e:  # noqa: BLE001 - a preview that fails is said, the question still asked
                preview = f"(no preview: {e})"
        yield CallShown(call, preview, bool(tool and tool.asks) and problem is None, problem)
        if problem is not None:
            result = Result(problem, error=True)
            yield CallDone(call, result)
            return result, None
        decision = self.approvals.decide(tool, call.args, preview)
        if not decision.allowed:
            result = Result(f"the user declined this call: {decision.reason}", error=True)
        else:
            result = tb.call(call.name, call.args)
        if result.cut:
            yield Note(f"the result of {call.name} was {result.full_chars} characters; the model sees the first "
                       f"and last {tb.result_cap} (a note in the result says so)")
        yield CallDone(call, result, decision)
        return result, decision

    def _fit(self, stepper: Stepper) -> Iterator:
        """Compact (policy ``compact``) or drop whole old turns until the conversation fits."""
        s = self.session
        n_ctx = s.engine.n_ctx
        n = stepper.count(s.conversation())
        if s.context_policy == "compact" and n > COMPACT_AT * n_ctx:
            done = compact(s, stepper)
            if done is not None:
                s.last_compaction = done
                yield Note(done.line())
                n = done.after
        budget = n_ctx - s.reserve_tokens
        dropped = 0
        while n > budget and s.context_policy != "stop":
            users = [i for i, m in enumerate(s.messages) if m.role == "user"]
            if len(users) < 2:
                break
            del s.messages[:users[1]]  # the oldest whole turn, its tool calls and results with it
            dropped += users[1]
            n = stepper.count(s.conversation())
        if dropped:
            yield Note(f"context full: dropped the {dropped} oldest message(s) to fit {n_ctx} tokens")
