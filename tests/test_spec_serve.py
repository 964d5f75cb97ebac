"""Speculative decoding through a real server (issue 15): ``serve --spec ngram`` answers greedy requests with the
same text as ``--spec off``, reports the drafted / accepted tokens in ``usage.speculative`` (OpenAI) and in the
closing chunk (Ollama), and counts them in /metrics; a draft model with another vocabulary than a model's
leaves that model on prompt lookup instead of failing its load."""

from __future__ import annotations

import httpx
import pytest
from helpers import ServerThread, metric_value

pytestmark = pytest.mark.model

EDIT = ("Repeat this list exactly, changing only 'pear' to 'plum':\n"
        "apple, banana, cherry, pear, grape, lemon, mango, orange, peach, kiwi, lime, melon")


def serve(tmp_path, speculation, model):
    from localrun.commands.serve import make_registry
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    settings = Settings(home=tmp_path, models_dir=tmp_path / "models")
    opts = ServeOptions()
    # 256 tokens of context: below 512 KV cells a verify step's rows round as one-token steps do (test_spec.py)
    reg = make_registry(settings, opts, parallel=2, ctx=256, threads=1, speculation=speculation)
    engine = reg.preload(str(model)).engine  # as `localrun serve MODEL` does, before the app starts
    if engine.speculation is not None:  # draft every step: on a busy machine the measured costs may keep the
        engine.speculation.adaptive = False  # adaptive controller off, and this test is about the path
    return ServerThread(create_app(None, settings, opts, registry=reg)), reg


def ask(tmp_path, model, speculation):
    srv, reg = serve(tmp_path, speculation, model)
    try:
        with httpx.Client(base_url=srv.url, timeout=600) as http:
            body = {"model": str(model), "messages": [{"role": "user", "content": EDIT}], "max_tokens": 48,
                    "temperature": 0}
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            o = http.post("/api/chat", json={"model": str(model), "messages": body["messages"], "stream": False,
                                             "options": {"temperature": 0, "num_predict": 48}})
            assert o.status_code == 200, o.text
            return r.json(), o.json(), http.get("/metrics").text
    finally:
        srv.stop()
        reg.close()


def test_greedy_text_with_prompt_lookup_equals_off_and_is_counted(tmp_path, smollm_path):
    from localrun.server.spec_options import SpecOptions

    off, off_ollama, off_metrics = ask(tmp_path, smollm_path, SpecOptions("off"))
    on, on_ollama, metrics = ask(tmp_path, smollm_path, SpecOptions("ngram", None, 6))
    assert on["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"]
    assert on_ollama["message"]["content"] == off_ollama["message"]["content"]
    assert "speculative" not in off["usage"] and "speculative" not in off_ollama
    spec = on["usage"]["speculative"]
    assert spec["draft_tokens"] > 0 and 0 < spec["accepted_tokens"] <= spec["draft_tokens"]
    assert on_ollama["speculative"]["draft_tokens"] > 0
    model = on["model"]
    drafted = metric_value(metrics, "localrun_spec_draft_tokens_total", model=model)
    accepted = metric_value(metrics, "localrun_spec_accepted_tokens_total", model=model)
    # the engine's totals: both requests (OpenAI, then Ollama)
    assert drafted == spec["draft_tokens"] + on_ollama["speculative"]["draft_tokens"]
    assert 0 < accepted <= drafted
    assert metric_value(off_metrics, "localrun_spec_draft_tokens_total") == 0


def test_draft_model_with_another_vocabulary_falls_back_to_prompt_lookup(smollm_path, gemma_path):
    from localrun.server.spec_options import SpecOptions

    opts = SpecOptions("auto", str(gemma_path), 4)
    assert opts.for_model(smollm_path) == {"spec_mode": "auto", "draft_model": None, "draft_max": 4}
    assert opts.for_model(gemma_path)["draft_model"] == str(gemma_path)  # its own vocabulary (262k tokens): kept
