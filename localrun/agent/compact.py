"""The ``compact`` context policy: older turns replaced by a summary the same model writes.

When the conversation passes ``COMPACT_AT`` (0.8) of the context window, ``compact`` keeps the last
``KEEP_USER_TURNS`` user turns whole — each from its user message to the next, so every tool call stays
with its result, finished or not — and replaces what came before with a summary:

1. the summary is written as a fork of the cached conversation: its prompt is the older part followed by
   one short request (``SUMMARY_REQUEST``); the older part is a prefix of what the engine last evaluated,
   so its KV is reused (llama.cpp's slot prefix cache, ``backends/llamacpp/engine.py``) and only the
   request is prefilled — ``Compaction.evaluated_tokens`` (prompt minus ``Stats.cached_tokens``) measures
   it against ``history_tokens``;
2. the history before compaction is kept whole (``session.compacted``, a stack), so ``/undo-compact``
   restores it exactly, the turns since kept after it (``undo``; the next turn then prefills it again,
   unless the prefix cache still holds it);
3. the older turns become one user message ``[Summary of the earlier conversation] …`` and a short
   assistant acknowledgement (templates that require user/assistant alternation render it).

On the generic format the summary is held to ``{"response": ...}`` like any answer (``Stepper``,
``choice="none"``). Shapes: messages are ``chat.ChatMessage``s; token counts are prompt tokens as the
caller's ``Stepper`` renders them.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

COMPACT_AT = 0.8  # fraction of n_ctx at which the conversation is compacted
KEEP_USER_TURNS = 2  # the last user turns kept whole
SUMMARY_REQUEST = "Summarize the conversation so far."  # short: its prefill is the compaction's cost
SUMMARY_HEAD = "[Summary of the earlier conversation]"
SUMMARY_ACK = "Understood."


@dataclass
class Compaction:
    """One compaction: prompt tokens ``before`` → ``after``; ``replaced`` messages summarized;
    ``history_tokens`` the older part's tokens (system prompt included); ``prompt_tokens`` the summary's
    prompt (that part and the request); ``evaluated_tokens`` of those, the ones its prefill evaluated (the
    rest came from the KV cache: ``Stats.cached_tokens``); ``summary`` its text."""

    before: int
    after: int
    replaced: int
    history_tokens: int
    prompt_tokens: int
    evaluated_tokens: int
    summary: str

    def line(self) -> str:
        """'compacted: 850 → 212 tokens (12 messages summarized; the summary's prefill evaluated 21 of 640
        prompt tokens, the rest came from the KV cache) · /undo-compact restores them'"""
        return (f"compacted: {self.before} → {self.after} tokens ({self.replaced} messages summarized; the "
                f"summary's prefill evaluated {self.evaluated_tokens} of {self.prompt_tokens} prompt tokens, the rest "
                f"came from the KV cache) · /undo-compact restores them")


@dataclass
class Undo:
    """What ``undo`` needs: the ``older`` messages the summary ``pair`` replaced, and the whole history
    ``before`` the compaction."""

    older: list
    pair: list
    before: list


def undo(session) -> int:
    """Restore the history before the last compaction → its message count now. The turns that came after it
    are kept (the summary pair is swapped back for the messages it replaced); if the summary pair is no longer
    at the head (another policy dropped it), the history is set back to exactly what it was then. Raises
    IndexError when nothing was compacted."""
    u = session.compacted.pop()
    msgs = session.messages
    if len(msgs) >= 2 and msgs[0] is u.pair[0] and msgs[1] is u.pair[1]:
        session.messages = u.older + msgs[2:]
    else:
        session.messages = list(u.before)
    return len(session.messages)


def cut_index(messages: list, keep_user_turns: int = KEEP_USER_TURNS) -> int:
    """Where the kept part of ``messages`` starts: at the ``keep_user_turns``-th user message from the end
    (fewer when there are not that many older ones, at least the last user turn kept); 0: nothing older
    to summarize. Never inside a turn, so tool calls and their results are never split."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    for k in range(keep_user_turns, 0, -1):
        if len(users) >= k and users[-k] > 0:
            return users[-k]
    return 0


def compact(session, stepper, extra: list = (), keep_user_turns: int = KEEP_USER_TURNS) -> Compaction | None:
    """Compact ``session.messages`` (module docstring) → the Compaction, or None when there is nothing older
    to summarize. ``extra``: messages about to be added (a new user message) that count as kept turns.
    ``stepper``: an ``agent.step.Stepper`` of the session (its rendering is the conversation's). Raises
    what a step raises (ChatTemplateError, ContextOverflowError); KeyboardInterrupt leaves the history as
    it was."""
    from localrun.agent.step import StepReply
    from localrun.backends.base import Message

    msgs = list(session.messages)
    cut = min(cut_index(msgs + list(extra), keep_user_turns), len(msgs))
    if cut == 0:
        return None
    system = session.conversation()[: len(session.conversation()) - len(msgs)]
    before = stepper.count(system + msgs + list(extra))
    older = msgs[:cut]
    request = Message("user", SUMMARY_REQUEST)
    n_ctx = session.engine.n_ctx
    max_tokens = max(32, min(256, n_ctx // 16))
    while len(older) > 1 and stepper.count(system + older + [request]) + max_tokens > n_ctx:
        older = older[1:]  # too long to fork whole: the oldest messages go unsummarized
    history_tokens = stepper.count(system + older)
    reply = StepReply()
    with closing(stepper.run(system + older + [request], "none", reply,
                             overrides={"max_tokens": max_tokens, "temperature": 0.0})) as stream:
        for _ in stream:
            pass
    summary = reply.content.strip() or "(the model wrote no summary)"
    stats = getattr(reply.finish, "stats", None)
    prompt = stats.prompt_tokens if stats else 0
    evaluated = prompt - stats.cached_tokens if stats else 0
    make = type(msgs[0])  # the session's message class (chat.ChatMessage)
    pair = [make("user", f"{SUMMARY_HEAD}\n{summary}"), make("assistant", SUMMARY_ACK)]
    session.compacted.append(Undo(msgs[:cut], pair, msgs))
    session.messages = pair + msgs[cut:]
    after = stepper.count(system + session.messages + list(extra))
    return Compaction(before, after, cut, history_tokens, prompt, evaluated, summary)
