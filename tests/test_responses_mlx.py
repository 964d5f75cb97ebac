"""The Responses API on MLX (issue 28): the same route above the engine as on llama.cpp. SmolLM2's GGUF
through mlx[cpu]: create and stream agree, a conversation continued by previous_response_id equals the
conversation sent whole, and turns 2.. reuse the previous turn's KV (MLX keeps the last request's cache)."""

from __future__ import annotations

import pytest
from helpers import ServerThread
from test_responses import TURNS, check_cached, comparable, converse_by_id, converse_whole

pytestmark = pytest.mark.model
pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(smollm_path, tmp_path_factory):
    from localrun.commands.serve import load_for_serving
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    home = tmp_path_factory.mktemp("mlx_responses_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALRUN_HOME", str(home))
        settings = Settings(home=home, models_dir=home / "models")
        engine, plan, hw = load_for_serving(str(smollm_path), settings, parallel=1, ctx=2048, threads=1,
                                            force=False, chat_template=None, backend="mlx")
        srv = ServerThread(create_app(engine, settings, ServeOptions(plan=plan, hardware=hw)))
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=300, max_retries=0)
        srv.stop()
        engine.close()


def test_create_and_stream_agree_on_mlx(client):
    kw = dict(model="x", input="What is the capital of France?", temperature=0, max_output_tokens=8)
    full = client.responses.create(**kw)
    with client.responses.stream(**kw) as s:
        final = s.get_final_response()
    a, b = comparable(full), comparable(final)
    a["usage"].pop("input_tokens_details"), b["usage"].pop("input_tokens_details")
    assert a == b and full.output_text


def test_a_conversation_by_previous_response_id_on_mlx(client):
    chained = converse_by_id(client, 6, turns=TURNS[:3])  # a reply cut short is history as much as a whole one
    check_cached(chained)
    assert [r.output_text for r in chained] == converse_whole(client, 6, turns=TURNS[:3])
