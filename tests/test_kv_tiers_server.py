"""KV-cache tiers through a real server (issue 17): `localrun serve --cache-dir` keeps its disk tier across
a restart, the second server's request restores the shared prefix, and /metrics counts the hit per tier."""

from __future__ import annotations

import httpx
import pytest
from helpers import ServerThread, metric_value

pytestmark = pytest.mark.model

MiB = 1 << 20


def serve(tmp_path, cache_dir, *, parallel=2, templates=None):
    from localrun.commands.serve import make_registry, parse_kv_tiers
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    settings = Settings(home=tmp_path, models_dir=tmp_path / "models")
    opts = ServeOptions()
    reg = make_registry(settings, opts, parallel=parallel, ctx=1024, threads=1,
                        kv_tiers=parse_kv_tiers("64MiB", cache_dir, "256MiB"))
    for path, name in (templates or {}).items():
        reg.loader.set_template(path, name)
    return ServerThread(create_app(None, settings, opts, registry=reg)), reg


def complete(http, model, prompt, n=4, logprobs=1):
    r = http.post("/v1/completions", json={"model": str(model), "prompt": prompt, "max_tokens": n,
                                           "temperature": 0, "logprobs": logprobs})
    assert r.status_code == 200, r.text
    return r.json()


def test_restart_restores_the_prefix_from_disk(tmp_path, smollm_path):
    cache = tmp_path / "kv"
    # ≈ 260 tokens; greedy continues with " Item" (by ≈ 2 nats here; shorter lists are near-ties or end the
    # line), so the restored snapshot (prompt + answer) runs past the first prompt into the second one: the
    # margin is checked below, as CPUs round differently
    prefix = " ".join(f"Item {i} is a {['red', 'blue', 'green'][i % 3]} box." for i in range(30))
    srv, reg = serve(tmp_path, cache)
    try:
        with httpx.Client(base_url=srv.url, timeout=600) as http:
            first = complete(http, smollm_path, prefix, logprobs=2)
            assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            top = sorted(first["choices"][0]["logprobs"]["top_logprobs"][0].items(), key=lambda kv: -kv[1])
            assert top[0][0] == " Item" and top[0][1] - top[1][1] > 1.0, top  # the premise, with its margin
    finally:
        srv.stop()
        reg.close()  # the engine closes: its slots are written to the disk tier
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert len(files) == 1 and sum(p.stat().st_size for p in files) <= 256 * MiB
    srv, reg = serve(tmp_path, cache)
    try:
        with httpx.Client(base_url=srv.url, timeout=600) as http:
            again = complete(http, smollm_path, prefix + " Item 7 is a")
            n_prompt = again["usage"]["prompt_tokens"]
            assert first["usage"]["prompt_tokens"] < again["usage"]["prompt_tokens_details"]["cached_tokens"] < n_prompt
            text = http.get("/metrics").text
            model = again["model"]
            assert metric_value(text, "localrun_kv_tier_hits_total", model=model, tier="disk") == 1
            assert metric_value(text, "localrun_kv_tier_hits_total", model=model, tier="ram") == 0
            assert metric_value(text, "localrun_kv_tier_restore_seconds_total", model=model) > 0
            assert metric_value(text, "localrun_kv_tier_bytes", model=model, tier="ram") > 0
    finally:
        srv.stop()
        reg.close()


def test_gemma_chat_with_the_same_system_prompt_restores_its_snapshot(tmp_path, gemma_path):
    """One slot, Gemma-3 (sliding window: a snapshot resumes only where it was taken): a chat, another
    client's prompt on the slot, then a chat with the same system prompt and another question: it restores
    the snapshot taken at the system prompt's end (mid-prefill of the first chat) and evaluates only its
    own turn."""
    system = "You are a careful assistant. Inventory: " + " ".join(  # ≈ 560 tokens: past the 512-token window
        f"Item {i} is a {['red', 'blue', 'green'][i % 3]} box." for i in range(62))
    srv, reg = serve(tmp_path, None, parallel=1, templates={gemma_path: "gemma"})
    try:
        with httpx.Client(base_url=srv.url, timeout=600) as http:
            usage = []
            for question in ("What colour is item 7?", None, "How many of the boxes are green, and which?"):
                if question is None:  # another client takes the slot
                    complete(http, gemma_path, "The weather in spring is mild, with rain in April. " * 3, n=1)
                    continue
                r = http.post("/v1/chat/completions", json={
                    "model": str(gemma_path), "max_tokens": 2, "temperature": 0,
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]})
                assert r.status_code == 200, r.text
                usage.append(r.json()["usage"])
            text = http.get("/metrics").text
            model = r.json()["model"]
    finally:
        srv.stop()
        reg.close()
    first, second = usage
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 512 < cached < second["prompt_tokens"] - 8  # past the window: the system prompt, not the turn
    assert second["prompt_tokens"] - cached <= 24  # evaluated: the user's turn and the model header
    assert metric_value(text, "localrun_kv_tier_hits_total", model=model, tier="ram") == 1
