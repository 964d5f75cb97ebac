"""The ``compact`` context policy on SmolLM2 with a small context: a conversation pushed past 0.8 of the window
is compacted and keeps running; the summary is a fork of the cached conversation (its prefill evaluates at
most 5 % of the history's tokens, the rest comes from the KV cache); /undo-compact restores the history."""

import pytest

pytestmark = pytest.mark.model

FILLER = ("Here is a note about my garden, please remember it. " + "The roses are red, the tulips are yellow, "
          "and the old apple tree by the fence needs water every second day. " * 5)


def test_compaction_forks_the_cache_keeps_running_and_undoes(smollm_path):
    from localrun.backends.base import SamplingParams
    from localrun.chat import ChatSession
    from localrun.loading import load_model

    engine = load_model(str(smollm_path), n_ctx=768, n_threads=1).engine  # one thread: see test_agent_chat_tty
    try:
        s = ChatSession(engine, SamplingParams(temperature=0.0, max_tokens=8), context_policy="compact")
        notes: list[str] = []
        s.on_notice = notes.append
        for i in range(8):
            prev = list(s.messages)
            answer = "".join(p.text for p in s.send(f"{FILLER} This is note {i}."))
            if s.compacted:
                break
        assert s.compacted, "the conversation never reached 0.8 of the window"
        c = s.last_compaction
        line = next(n for n in notes if n.startswith("compacted:"))
        assert f"{c.before} → {c.after} tokens" in line
        assert c.after < 0.8 * engine.n_ctx < c.before
        assert c.evaluated_tokens <= 0.05 * c.history_tokens, line  # a fork of the cache, not a new prefill
        assert s.messages[0].content.startswith("[Summary of the earlier conversation]")
        # the turn that triggered it was answered, and the next one runs on the compacted history
        assert s.messages[-1].role == "assistant" and s.messages[-1].content == answer
        assert s.last_stats is not None and s.last_stats.n_ctx_used < engine.n_ctx
        last_turn = s.messages[-2:]
        n = s.undo_compact()
        assert s.messages == prev + last_turn and n == len(prev) + 2  # exactly as before, the new turn after it
        with pytest.raises(Exception, match="nothing to undo"):
            s.undo_compact()
    finally:
        engine.close()
