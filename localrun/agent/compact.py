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
   restores it exactly, the turns since kept after it (``undo``); before the fork cuts the slot, its KV (the
   whole conversation up to the last answer) is saved as a KV-tier snapshot (``snapshot_kv``: the engine's
   ``kv_cache.KVCache`` when tiers are on, else a RAM-only one of the session's), and ``undo`` restores it
   into the slot (``restore_kv``), so the next turn is served from it and prefills only what came after;
3. the older turns become one user message ``[Summary of the earlier conversation] …`` and a short
   assistant acknowledgement (templates that require user/assistant alternation render it).

Only llama.cpp engines take KV snapshots (``engine.slots``); elsewhere the history comes back without its KV and
the next turn prefills it. On a sliding-window (Gemma-3) or recurrent model a snapshot resumes only at exactly
its end, so it is restored only when its tokens are a strict prefix of the restored history followed by a user
turn (``kv_cache.KVCache.best``).

On the generic format the summary is held to ``{"response": ...}`` like any answer (``Stepper``,
``choice="none"``). Shapes: messages are ``chat.ChatMessage``s; token counts are prompt tokens as the
caller's ``Stepper`` renders them.
"""

from __future__ import annotations

import json
import re
from contextlib import closing
from dataclasses import dataclass

from localrun.backends.text import common_prefix

COMPACT_AT = 0.8  # fraction of n_ctx at which the conversation is compacted
KEEP_USER_TURNS = 2  # the last user turns kept whole
SUMMARY_REQUEST = "Summarize the conversation so far."  # short: its prefill is the compaction's cost
SUMMARY_HEAD = "[Summary of the earlier conversation]"
SUMMARY_ACK = "Understood."
PROBE = "\ue000"  # a private-use character: the user's text of the turn that follows a restored history


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
    kv_tokens: int = 0  # tokens of the snapshot of the KV before it (0: none kept)

    def line(self) -> str:
        """'compacted: 850 → 212 tokens (12 messages summarized; the summary's prefill evaluated 21 of 640
        prompt tokens, the rest came from the KV cache) · /undo-compact restores them, with their KV (838
        tokens kept)'"""
        kv = f", with their KV ({self.kv_tokens} tokens kept)" if self.kv_tokens else ""
        return (f"compacted: {self.before} → {self.after} tokens ({self.replaced} messages summarized; the "
                f"summary's prefill evaluated {self.evaluated_tokens} of {self.prompt_tokens} prompt tokens, the rest "
                f"came from the KV cache) · /undo-compact restores them{kv}")


@dataclass
class Undo:
    """What ``undo`` needs: the ``older`` messages the summary ``pair`` replaced, the whole history
    ``before`` the compaction, the ``stepper`` that rendered it (tools included: the KV holds that rendering)
    and ``kv_tokens``, the tokens of its KV snapshot (0: none kept)."""

    older: list
    pair: list
    before: list
    stepper: object = None
    kv_tokens: int = 0


def undo(session) -> int:
    """Restore the history before the last compaction → its message count now. The turns that came after it
    are kept (the summary pair is swapped back for the messages it replaced); if the summary pair is no longer
    at the head (another policy dropped it), the history is set back to exactly what it was then. The KV
    snapshot taken before the compaction is restored into the slot when it fits the history (``restore_kv``):
    ``session.undo_kv_tokens`` says how many of its tokens the next turn reuses (0: it prefills them). Raises
    IndexError when nothing was compacted."""
    u = session.compacted.pop()
    msgs = session.messages
    if len(msgs) >= 2 and msgs[0] is u.pair[0] and msgs[1] is u.pair[1]:
        session.messages = u.older + msgs[2:]
    else:
        session.messages = list(u.before)
    session.undo_kv_tokens = restore_kv(session, u)
    return len(session.messages)


def undo_line(n_messages: int, kv_tokens: int) -> str:
    """The line ``/undo-compact`` shows: 'restored the history before the last compaction: 17 messages; its KV
    came back (1210 tokens: the next turn does not prefill them)'."""
    kv = (f"its KV came back ({kv_tokens} tokens: the next turn does not prefill them)" if kv_tokens
          else "its KV was not kept: the next turn prefills it")
    return f"restored the history before the last compaction: {n_messages} messages; {kv}"


def _store(session, *, create: bool):
    """Where compaction keeps KV snapshots: the engine's tiers (``engine.kv_cache``, a llama.cpp ``KVCache``)
    or, without them, the session's own RAM-only ``KVCache`` (made when ``create``; its budget the RAM-tier
    default, ``offload.kv_tiers.default_cache_ram_bytes``) → the store, None (not a llama.cpp engine)."""
    from localrun.backends.kv_cache import KVCache

    engine = session.engine
    if getattr(engine, "backend", None) != "llamacpp" or not getattr(engine, "slots", None):
        return None
    if isinstance(getattr(engine, "kv_cache", None), KVCache):
        return engine.kv_cache
    if session.kv_snapshots is None and create:
        import functools

        import psutil

        from localrun.backends.kv_cache import engine_settings, model_identity
        from localrun.offload.kv_tiers import default_cache_ram_bytes

        session.kv_snapshots = KVCache(functools.partial(model_identity, engine.model_path), engine_settings(engine),
                                       ram_bytes=default_cache_ram_bytes(psutil.virtual_memory().available))
    return session.kv_snapshots


def snapshot_kv(session, full: list[int]) -> int:
    """Save slot 0's KV (chat's sequence) as a snapshot before the summary fork cuts it → its tokens, 0 when
    none was taken: not a llama.cpp engine, the slot busy, or holding less than ``kv_cache.MIN_TOKENS`` of
    ``full`` (the pre-compaction conversation's prompt tokens: the slot holds another prompt). Raises
    nothing: a snapshot that cannot be taken only means /undo-compact prefills the history."""
    store = _store(session, create=True)
    if store is None:
        return 0
    slot = session.engine.slots[0]
    if slot.busy or common_prefix(slot.tokens, full) < store.min_tokens:
        return 0
    snap = store.save(session.engine, slot)
    return len(snap.tokens) if snap is not None else 0


def restore_kv(session, u: Undo) -> int:
    """Put the KV snapshot that best fits the restored history back into slot 0 → the tokens of the history
    (system prompt included) whose KV the slot now holds; 0 when none was taken, it was evicted, or it does
    not fit. The fit is tested on the history followed by a user turn (``PROBE`` as its text), as the next
    turn renders it: the longest shared prefix counts (the engine cuts the KV back to it), and on
    sliding-window or recurrent models only a snapshot whose tokens are a strict prefix of it
    (``KVCache.best``). The slot's own tokens win when they reuse as much. Raises nothing."""
    if not u.kv_tokens or u.stepper is None:
        return 0
    store = _store(session, create=False)
    engine = session.engine
    if store is None or engine.slots[0].busy:
        return 0
    from localrun.backends.base import Message
    from localrun.backends.kv_cache import exact_only
    from localrun.errors import LocalrunError

    conv = session.conversation()
    system = conv[: len(conv) - len(session.messages)]
    try:
        probe = u.stepper.prompt(system + session.messages + [Message("user", PROBE)])[0]
    except LocalrunError:
        return 0
    slot, sliding = engine.slots[0], exact_only(engine)
    snap, usable = store.best(probe, sliding=sliding)
    own = common_prefix(slot.tokens, probe)  # what the slot reuses itself; cut back only without sliding layers
    own = own if not sliding or own == len(slot.tokens) else 0
    if snap is None or usable <= own:
        return own if own >= store.min_tokens else 0
    return usable if store.restore(engine, slot, snap) else 0


def cut_index(messages: list, keep_user_turns: int = KEEP_USER_TURNS) -> int:
    """Where the kept part of ``messages`` starts: at the ``keep_user_turns``-th user message from the end
    (fewer when there are not that many older ones, at least the last user turn kept); 0: nothing older
    to summarize. Never inside a turn, so tool calls and their results are never split."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    for k in range(keep_user_turns, 0, -1):
        if len(users) >= k and users[-k] > 0:
            return users[-k]
    return 0


def unwrap_response(text: str) -> str:
    """The text of a generic-format answer ``{"response": "…"}`` that was cut before it closed (the summary
    stops at its ``max_tokens``; a whole one the reply parser already unwrapped) → its text so far, escapes
    decoded; any other ``text`` as it is."""
    m = re.match(r'\s*\{\s*"response"\s*:\s*"', text)
    if m is None:
        return text
    body = re.sub(r'"\s*}?\s*$', "", text[m.end():])  # the closing quote and brace, when they came
    for end in range(len(body), max(-1, len(body) - 8), -1):  # a cut escape (\u00e) is dropped
        try:
            return json.loads(f'"{body[:end]}"')
        except ValueError:
            continue
    return body


def older_cut(session, msgs: list, extra: list, keep_user_turns: int = KEEP_USER_TURNS) -> int:
    """Where the part of ``msgs`` to summarize ends (``cut_index`` of ``msgs + extra``, at most ``len(msgs)``),
    keeping ``keep_user_turns`` user turns whole, or fewer (down to the last one) when the older part would
    hold nothing but the last compaction's summary: a long turn's tool steps are then folded into the
    summary instead of the oldest turns being dropped whole. 0: nothing to summarize."""
    for k in range(keep_user_turns, 0, -1):
        cut = min(cut_index(msgs + extra, k), len(msgs))
        if cut and not _only_the_last_summary(session, msgs[:cut]):
            return cut
    return 0


def _only_the_last_summary(session, older: list) -> bool:
    """Whether ``older`` is the last compaction's summary pair and nothing else: summarizing it again would
    give the same tokens back (a turn whose own tool steps fill the window), so there is nothing to compact."""
    if not session.compacted:
        return False
    pair = session.compacted[-1].pair
    return len(older) <= len(pair) and all(a is b for a, b in zip(older, pair))


def compact(session, stepper, extra: list = (), keep_user_turns: int = KEEP_USER_TURNS) -> Compaction | None:
    """Compact ``session.messages`` (module docstring) → the Compaction, or None when there is nothing older
    to summarize (also when the older part is only the last compaction's summary). ``extra``: messages about
    to be added (a new user message) that count as kept turns. ``stepper``: an ``agent.step.Stepper`` of the
    session (its rendering is the conversation's). Raises what a step raises (ChatTemplateError,
    ContextOverflowError); KeyboardInterrupt leaves the history as it was."""
    from localrun.agent.step import StepReply
    from localrun.backends.base import Message

    msgs = list(session.messages)
    cut = older_cut(session, msgs, list(extra), keep_user_turns)
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
    kv_tokens = snapshot_kv(session, stepper.prompt(system + msgs)[0])  # before the fork cuts the slot
    reply = StepReply()
    n_notices = len(session.notices)
    with closing(stepper.run(system + older + [request], "none", reply,
                             overrides={"max_tokens": max_tokens, "temperature": 0.0})) as stream:
        for _ in stream:
            pass
    del session.notices[n_notices:]  # the summary's own finish ("cut at max_tokens") is not the turn's
    summary = unwrap_response(reply.content).strip() or "(the model wrote no summary)"
    stats = getattr(reply.finish, "stats", None)
    prompt = stats.prompt_tokens if stats else 0
    evaluated = prompt - stats.cached_tokens if stats else 0
    make = type(msgs[0])  # the session's message class (chat.ChatMessage)
    pair = [make("user", f"{SUMMARY_HEAD}\n{summary}"), make("assistant", SUMMARY_ACK)]
    session.compacted.append(Undo(msgs[:cut], pair, msgs, stepper, kv_tokens))
    session.messages = pair + msgs[cut:]
    after = stepper.count(system + session.messages + list(extra))
    return Compaction(before, after, cut, history_tokens, prompt, evaluated, summary, kv_tokens)
