"""KV-cache tiers through a real server (issue 17): `localrun serve --cache-dir` keeps its disk tier across
a restart, the second server's request restores the shared prefix, and /metrics counts the hit per tier."""

from __future__ import annotations

import httpx
import pytest
from helpers import ServerThread, metric_value

pytestmark = pytest.mark.model

MiB = 1 << 20


def serve(tmp_path, cache_dir):
    from localrun.commands.serve import make_registry, parse_kv_tiers
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    settings = Settings(home=tmp_path, models_dir=tmp_path / "models")
    opts = ServeOptions()
    reg = make_registry(settings, opts, parallel=2, ctx=1024, threads=1,
                        kv_tiers=parse_kv_tiers("64MiB", cache_dir, "256MiB"))
    return ServerThread(create_app(None, settings, opts, registry=reg)), reg


def complete(http, model, prompt, n=4):
    r = http.post("/v1/completions", json={"model": str(model), "prompt": prompt, "max_tokens": n,
                                           "temperature": 0, "logprobs": 1})
    assert r.status_code == 200, r.text
    return r.json()


def test_restart_restores_the_prefix_from_disk(tmp_path, smollm_path):
    cache = tmp_path / "kv"
    prefix = " ".join(f"Item {i} is a {['red', 'blue', 'green'][i % 3]} box." for i in range(50))
    srv, reg = serve(tmp_path, cache)
    try:
        with httpx.Client(base_url=srv.url, timeout=600) as http:
            first = complete(http, smollm_path, prefix)
            assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
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
