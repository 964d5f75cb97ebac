"""The ``compact`` context policy on SmolLM2 with a small context: a conversation pushed past 0.8 of the window
is compacted and keeps running; the summary is a fork of the cached conversation (its prefill evaluates at
most 5 % of the history's tokens, the rest comes from the KV cache); /undo-compact restores the history and the
KV snapshot taken before the compaction, so the next turn does not prefill it again (SmolLM2, and Gemma-3 whose
sliding-window cache resumes a snapshot only at its exact end)."""

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


@pytest.mark.parametrize("model", ["smollm", "gemma"])
def test_undo_compact_brings_back_the_kv(model, smollm_path, gemma_path):
    """Compaction snapshots the slot's KV before the summary fork cuts it; /undo-compact restores it, and the
    next turn reuses it. Without the snapshot that turn's prompt shared only the summary fork's prefix with the
    KV: 177 of SmolLM2's 350 prompt tokens here (334 with it), 14 of 535 after an automatic compaction and one
    more turn (496 with it)."""
    from localrun.agent.compact import undo_line
    from localrun.backends.base import SamplingParams
    from localrun.chat import ChatSession
    from localrun.loading import load_model

    path, kw = (smollm_path, {}) if model == "smollm" else (gemma_path, {"chat_template": "gemma"})
    engine = load_model(str(path), n_ctx=768, n_threads=1, **kw).engine
    try:
        s = ChatSession(engine, SamplingParams(temperature=0.0, max_tokens=8), context_policy="compact")
        for i in range(2):
            "".join(p.text for p in s.send(f"{FILLER} This is note {i}."))
        history = list(s.messages)
        n_history = s.prompt_tokens(s.conversation())
        c = s.compact()  # what the policy does past 0.8 of the window (the test above), here at once
        assert c is not None and s.messages[0].content.startswith("[Summary")
        assert c.kv_tokens >= 0.9 * n_history and f"with their KV ({c.kv_tokens} tokens kept)" in c.line()
        assert s.undo_compact() == len(history) and s.messages == history
        assert s.undo_kv_tokens >= 0.9 * n_history
        assert "its KV came back" in undo_line(len(history), s.undo_kv_tokens)
        "".join(p.text for p in s.send("Which note came first?"))
        st = s.last_stats
        assert st.cached_tokens >= 0.9 * n_history, (st.cached_tokens, st.prompt_tokens, n_history)
    finally:
        engine.close()
