"""An agent step cut by --max-tokens while the model is still writing its (constrained) tool call: nothing is
run, and a line says why. Found in the tmux run of docs/chat.md: SmolLM2's generic-format call of
``write_note`` ran past ``-n 128`` and the raw JSON stood in the terminal with no word about it (the finish
notice read the session's own parameters, which carry no constraint, instead of the step's)."""

import pytest

pytestmark = pytest.mark.model


def test_a_tool_call_cut_by_max_tokens_runs_nothing_and_says_so(smollm_path, tmp_path):
    from localrun.agent import AgentLoop, Approvals, Toolbox
    from localrun.agent.loop import CallShown
    from localrun.backends.base import SamplingParams
    from localrun.chat import ChatSession
    from localrun.loading import load_model

    engine = load_model(str(smollm_path), n_ctx=1024, n_threads=1).engine
    try:
        s = ChatSession(engine, SamplingParams(temperature=0.0, max_tokens=6), context_policy="compact")
        agent = AgentLoop(s, Toolbox(["write"], root=str(tmp_path)), Approvals(yes_all=True), max_steps=2,
                          tool_choice="write_file")
        events = []
        for item in agent.run("Write a long poem about the sea to sea.txt"):
            if hasattr(item, "stream"):
                for _ in item.stream:
                    pass
            events.append(item)
        assert not any(isinstance(e, CallShown) for e in events)  # six tokens cannot finish a call
        assert list(tmp_path.iterdir()) == []
        assert any(n.startswith("the reply was cut before the tool call") and "raise --max-tokens" in n
                   for n in s.notices), s.notices
    finally:
        engine.close()
