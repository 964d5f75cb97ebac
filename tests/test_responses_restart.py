"""A conversation continued by previous_response_id across a server restart (issue 28): the responses are
in the SQLite store and the KV cache of the last turn in the disk tier (`serve --cache-dir`), so the first
turn after the restart prefills only its new tokens, and greedy answers equal the conversation sent whole."""

from __future__ import annotations

import httpx
import pytest
from helpers import ServerThread, metric_value
from test_responses import TURNS, check_cached, converse_by_id, converse_whole

pytestmark = pytest.mark.model

openai = pytest.importorskip("openai")


def serve(tmp_path, smollm_path):
    from localrun.commands.serve import make_registry, parse_kv_tiers
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    settings = Settings(home=tmp_path, models_dir=tmp_path / "models")
    opts = ServeOptions()
    opts.responses_db = tmp_path / "responses.db"
    reg = make_registry(settings, opts, parallel=2, ctx=2048, threads=1,
                        kv_tiers=parse_kv_tiers("64MiB", tmp_path / "kv", "256MiB"))
    reg.preload(str(smollm_path))
    srv = ServerThread(create_app(None, settings, opts, registry=reg))
    return srv, reg, openai.OpenAI(base_url=srv.url + "/v1", api_key="x", timeout=600, max_retries=0)


def test_a_conversation_continues_after_a_restart_from_the_disk_tier(tmp_path, smollm_path):
    srv, reg, client = serve(tmp_path, smollm_path)
    try:
        before = converse_by_id(client, 16, turns=TURNS[:2])
    finally:
        srv.stop()
        reg.close()  # the engine closes: its slots are written to the disk tier
    srv, reg, client = serve(tmp_path, smollm_path)
    try:
        after = converse_by_id(client, 16, first_previous=before[-1].id, turns=TURNS[2:])
        check_cached(before + after)  # turn 3 (the first after the restart) too
        model = after[0].model
        metrics = httpx.get(srv.url + "/metrics").text
        assert metric_value(metrics, "localrun_kv_tier_hits_total", model=model, tier="disk") >= 1
        assert [r.output_text for r in before + after] == converse_whole(client, 16)
    finally:
        srv.stop()
        reg.close()
