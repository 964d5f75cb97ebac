"""bench's pure parts: workloads, percentiles, goodput, calibration arithmetic (plus prompts on the real
SmolLM2 tokenizer)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from localrun.bench.clients import RequestResult
from localrun.bench.metrics import distribution, summarize_level
from localrun.bench.workload import Workload, build_requests, parse_concurrency, poisson_arrivals, scenario
from localrun.errors import ConfigError


def test_prompts_have_exact_length_and_shared_prefix_on_real_tokenizer(smollm_engine):
    w = Workload(prompt_tokens=40, max_tokens=4, shared_prefix=0.5, requests=3)
    tok = lambda s: smollm_engine.tokenize(s, add_special=False)  # noqa: E731
    reqs = build_requests(w, 1, 0, tokenizer=tok)
    assert [len(r.tokens) for r in reqs] == [40, 40, 40]
    a, b = reqs[0].tokens, reqs[1].tokens
    assert a[:20] == b[:20] and a[20:] != b[20:]
    # the shared prefix is the same at another level; the unique parts differ
    other = build_requests(w, 2, 1, tokenizer=tok)
    assert other[0].tokens[:20] == a[:20] and other[0].tokens != a


def test_prompts_without_tokenizer_are_sized_in_words():
    reqs = build_requests(Workload(prompt_tokens=30, shared_prefix=0.0, requests=2), 1)
    assert all(len(r.text.split()) == 30 for r in reqs)
    assert reqs[0].text != reqs[1].text


def test_poisson_arrivals_are_increasing_with_the_asked_mean_rate():
    t = poisson_arrivals(4000, 5.0, random.Random(1))
    gaps = np.diff(t)
    assert t[0] == 0.0 and (gaps > 0).all()
    assert abs(gaps.mean() - 0.2) < 0.02
    w = Workload(rate_rps=2.0, requests=5)
    assert [r.arrival_s for r in build_requests(w, 1)] == sorted(r.arrival_s for r in build_requests(w, 1))


def test_scenarios_and_bad_input_raise_config_errors():
    agent = scenario("agent", max_tokens=8)
    assert agent.shared_prefix > 0.5 and agent.max_tokens == 8 and agent.scenario == "agent"
    assert scenario("rag").prompt_tokens >= 2048
    with pytest.raises(ConfigError):
        scenario("nope")
    for bad in ("0", "1,x", "", "-2"):
        with pytest.raises(ConfigError):
            parse_concurrency(bad)
    assert parse_concurrency("1, 4,8") == [1, 4, 8]
    for kw in (dict(prompt_tokens=0), dict(max_tokens=0), dict(shared_prefix=1.5), dict(requests=0),
               dict(duration_s=-1), dict(rate_rps=0), dict(concurrency=[])):
        with pytest.raises(ConfigError):
            Workload(**kw)


def test_distribution_matches_numpy_percentiles():
    vals = [random.Random(3).random() for _ in range(37)]
    d = distribution(vals)
    for p in (50, 95, 99):
        assert d[f"p{p}"] == pytest.approx(np.percentile(vals, p))
    assert d["p50"] <= d["p95"] <= d["p99"] <= d["max"]
    assert distribution([])["p50"] is None


def _result(i, ttft, tpot, n=5, t0=0.0, ok=True):
    r = RequestResult(index=i, ok=ok, prompt_tokens=10, completion_tokens=n if ok else 0, cached_tokens=4,
                      t_arrival=t0, t_start=t0)
    if ok:
        r.t_first = t0 + ttft
        r.token_times = [r.t_first + k * tpot for k in range(n)]
        r.t_end = r.token_times[-1]
    else:
        r.error, r.t_end = "boom", t0 + 1
    return r


def test_goodput_counts_only_requests_within_the_slos():
    rs = [_result(0, 0.1, 0.01), _result(1, 0.5, 0.01), _result(2, 0.1, 0.2), _result(3, 0, 0, ok=False)]
    lv = summarize_level(rs, 2, 0.0, 2.0, slo_ttft_s=0.2, slo_tpot_s=0.05)
    assert lv["completed"] == 3 and lv["failed"] == 1 and lv["errors"] == ["boom"]
    assert lv["goodput"]["requests_ok"] == 1
    assert lv["goodput"]["requests_per_s"] == pytest.approx(0.5)
    assert lv["requests_per_s"] == pytest.approx(1.5)
    assert lv["completion_tokens"] == 15 and lv["output_tok_s"] == pytest.approx(7.5)
    assert lv["prefix_cache_hit_rate"] == pytest.approx(0.4)
    assert lv["tpot_s"]["p50"] == pytest.approx(0.01)
    assert lv["itl_s"]["n"] == 12
    no_slo = summarize_level(rs, 2, 0.0, 2.0)
    assert no_slo["goodput"]["requests_per_s"] == no_slo["requests_per_s"]


def test_calibration_inverts_the_planners_decode_formula(smollm_path):
    """Stored bandwidth × 1e9 / bytes per token gives back the measured tok/s; plan_for_run then predicts it."""
    from localrun.bench.calibrate import calibration_values, save_calibration
    from localrun.machine.hardware import probe_hardware
    from localrun.machine.measurements import get_measurement
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.search import plan_for_run

    spec = read_gguf(smollm_path)
    hw = probe_hardware()
    hw.gpus = []
    plan = plan_for_run(spec, hw, n_ctx=512)
    vals = calibration_values(spec, plan, decode_tok_s=50.0, prefill_tok_s=400.0)
    assert vals["decode_bandwidth_gbps"] == pytest.approx(vals["bytes_per_token"] * 50.0 / 1e9)
    assert vals["prefill_gflops"] == pytest.approx(2 * vals["active_params"] * 400.0 / 1e9)
    save_calibration(plan, vals, spec.name, hw)
    entry = get_measurement("llamacpp", "cpu")
    assert entry["source"] == "bench --calibrate" and entry["decode_bandwidth_gbps"] == vals["decode_bandwidth_gbps"]
    again = plan_for_run(spec, hw, n_ctx=512, measurement=get_measurement("llamacpp", "cpu"))
    assert again.decode_tok_s == pytest.approx(50.0, rel=0.02)
    assert again.prefill_tok_s == pytest.approx(400.0, rel=0.02)
    assert any("measure" in r for r in again.reasons)


def test_engine_client_poisson_arrivals_for_a_duration(smollm_engine):
    """Poisson arrivals (4 req/s) for 1.5 s on the real engine: requests stop being sent at the deadline,
    each waits in the queue from its arrival, and the token counts are exact (EOS banned)."""
    from localrun.bench.clients import EngineClient
    from localrun.bench.workload import iter_requests

    w = Workload(prompt_tokens=12, max_tokens=3, duration_s=1.5, rate_rps=4.0, seed=7)
    client = EngineClient(smollm_engine)
    reqs = iter_requests(w, 1, 0, tokenizer=client.tokenize)
    results, t0, t1 = client.run_level(reqs, 1, w)
    assert results and all(r.ok for r in results)
    assert all(r.t_arrival - t0 < 1.5 for r in results)  # none sent after the duration
    arrivals = [r.t_arrival for r in results]
    assert arrivals == sorted(arrivals)
    for r in results:
        assert r.completion_tokens == 3 and r.prompt_tokens == 12 and len(r.token_times) == 3
        assert r.queue_s >= 0 and r.ttft_s >= r.prefill_s > 0
    lv = summarize_level(results, 1, t0, t1)
    assert lv["completion_tokens"] == 3 * len(results)
