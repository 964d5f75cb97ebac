"""Thinking through the Responses API (issue 28): SmolLM2 served with QwQ-32B's chat template (its
generation prompt opens ``<think>``), and ``serve --reasoning-budget`` 10, so whatever SmolLM2 writes first is
its thinking until the engine closes the block. The thinking is a ``reasoning`` output item (one
``reasoning_text`` part), counted in ``output_tokens_details.reasoning_tokens``; ``reasoning.effort: none``
turns it off; ``include: ["reasoning.encrypted_content"]`` gives it back to a stateless client."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ServerThread
from test_responses import comparable

pytestmark = pytest.mark.model

openai = pytest.importorskip("openai")

TEMPLATES = Path(__file__).parent / "data" / "templates"
BUDGET = 10
STORY = "Write a long story about a cat named Tom."


@pytest.fixture(scope="module")
def client(smollm_path, tmp_path_factory):
    from localrun.backends import load_engine
    from localrun.config import Settings
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    plan = simple_plan(read_gguf(smollm_path), n_ctx=1024, n_parallel=2)
    plan.n_threads = plan.n_threads_batch = 1
    engine = load_engine(smollm_path, plan, chat_template=(TEMPLATES / "Qwen-QwQ-32B.jinja").read_text())
    home = tmp_path_factory.mktemp("responses_reasoning_home")
    srv = ServerThread(create_app(engine, Settings(home=home, models_dir=home / "models"),
                                  ServeOptions(plan=plan, reasoning_budget=BUDGET)))
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=300, max_retries=0)
    srv.stop()
    engine.close()


def test_thinking_is_a_reasoning_item(client):
    kw = dict(model="x", input="Name a color.", temperature=0, max_output_tokens=160)
    full = client.responses.create(**kw)
    assert full.status == "completed"  # (the SDK's stream gives a final response only for a completed one)
    assert [o.type for o in full.output] == ["reasoning", "message"], full.output
    thought = full.output[0]
    assert thought.summary == [] and thought.content[0].type == "reasoning_text" and thought.content[0].text
    assert "</think>" not in full.output_text and "</think>" not in thought.content[0].text
    n = full.usage.output_tokens_details.reasoning_tokens
    assert BUDGET <= n <= BUDGET + 8 and n < full.usage.output_tokens  # the budget, plus the forced close
    types = []
    with client.responses.stream(**kw) as s:
        for e in s:
            types.append(e.type)
        final = s.get_final_response()
    a, b = comparable(full), comparable(final)
    a["usage"].pop("input_tokens_details"), b["usage"].pop("input_tokens_details")
    assert a == b
    i = types.index("response.reasoning_text.done")
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert set(types[4:i]) == {"response.reasoning_text.delta"}
    assert types[i + 1:i + 3] == ["response.content_part.done", "response.output_item.done"]


def test_effort_none_turns_thinking_off(client):
    r = client.responses.create(model="x", input=STORY, temperature=0, max_output_tokens=12,
                                reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["message"] and r.usage.output_tokens_details.reasoning_tokens == 0


def test_encrypted_reasoning_goes_back_to_a_stateless_client(client):
    first = client.responses.create(model="x", input=STORY, temperature=0, max_output_tokens=30, store=False,
                                    include=["reasoning.encrypted_content"])
    thought = first.output[0]
    assert thought.type == "reasoning" and thought.encrypted_content
    again = client.responses.create(model="x", temperature=0, max_output_tokens=8, store=False, input=[
        {"role": "user", "content": STORY}, *[o.model_dump(exclude_none=True) for o in first.output],
        {"role": "user", "content": "Shorter, please."}])
    assert again.status in ("completed", "incomplete")
    nxt = client.responses.create(model="x", input=STORY, temperature=0, max_output_tokens=30)
    cont = client.responses.create(model="x", input="Shorter, please.", previous_response_id=nxt.id,
                                   temperature=0, max_output_tokens=8)
    assert cont.status in ("completed", "incomplete") and cont.usage.input_tokens_details.cached_tokens > 0
