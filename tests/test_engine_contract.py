"""The engine contract (backends/base.py) on the real engines: llama.cpp's is a BatchEngine; MLX's is a
SingleStreamEngine that ``as_batch_engine`` wraps (once) in SerialEngine; and bench's in-process client
runs its requests through the server's Scheduler on either."""

from __future__ import annotations

import pytest

from localrun.backends import as_batch_engine
from localrun.backends.base import BatchEngine, Engine, Generation, SamplingParams, SingleStreamEngine
from localrun.bench.clients import EngineClient
from localrun.bench.workload import Workload, iter_requests


@pytest.fixture(scope="module")
def mlx_engine(smollm_path, tmp_path_factory):
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALRUN_HOME", str(tmp_path_factory.mktemp("mlx_home")))
        plan = simple_plan(read_gguf(smollm_path), n_ctx=512)
        plan.backend = "mlx"
        eng = load_engine(smollm_path, plan)
        yield eng
        eng.close()


def test_llamacpp_engine_is_a_batch_engine(smollm_engine):
    eng = smollm_engine
    assert isinstance(eng, Engine) and isinstance(eng, BatchEngine) and not eng.serial
    assert as_batch_engine(eng) is eng
    assert eng.template_source and "im_start" in eng.template_source  # SmolLM2's ChatML, from the GGUF
    assert eng.supports_tools is False  # its template never reads `tools`
    prompt = eng.tokenize("The capital of France is")
    gen = eng.start(prompt, SamplingParams(temperature=0, max_tokens=2))
    try:
        assert isinstance(gen, Generation) and gen.prompt == prompt and not gen.done
        chunks = []
        while not gen.done:
            chunks += [c for g, c in eng.step([gen]) if g is gen]
        assert chunks[-1].finish_reason == "length" and gen.finish_reason == "length"
        assert chunks[-1].stats.completion_tokens == 2
    finally:
        eng.release(gen)


def test_mlx_engine_is_wrapped_once_as_a_serial_batch_engine(mlx_engine):
    assert isinstance(mlx_engine, SingleStreamEngine) and not isinstance(mlx_engine, BatchEngine)
    served = as_batch_engine(mlx_engine)
    assert isinstance(served, BatchEngine) and served.serial and served.n_parallel == 1
    assert as_batch_engine(served) is served  # a second call does not wrap it again
    # the Engine half is the wrapped engine's
    for name in ("backend", "model_path", "n_ctx", "n_vocab", "spec", "add_bos", "has_chat_template",
                 "template_source", "supports_tools"):
        assert getattr(served, name) == getattr(mlx_engine, name), name
    assert served.n_vocab == 49152 and served.template_source and not served.supports_tools
    text = "Hello <|im_end|> world"
    assert served.tokenize(text) == mlx_engine.tokenize(text)
    assert served.is_eog(served.tokenize("<|im_end|>", add_special=False, parse_special=True)[0])


def test_bench_runs_mlx_through_the_scheduler_one_at_a_time(mlx_engine):
    """bench's in-process client on MLX (before, it refused: no multi-sequence API): exact token counts
    with EOS banned, and the second request reuses the first's shared prefix from MLX's one cache."""
    w = Workload(prompt_tokens=24, max_tokens=3, requests=3, shared_prefix=0.5)
    client = EngineClient(mlx_engine)
    assert client.max_concurrency == 1
    results, t0, t1 = client.run_level(iter_requests(w, 1, 0, tokenizer=client.tokenize), 1, w)
    assert [r.index for r in results] == [0, 1, 2] and all(r.ok for r in results)
    for r in results:
        assert r.completion_tokens == 3 and len(r.token_times) == 3 and r.finish_reason == "length"
        assert t0 <= r.t_arrival <= r.t_start < r.t_first <= r.t_end <= t1
    # closed loop, one slot: each request starts after the previous one ended
    assert all(a.t_end <= b.t_start for a, b in zip(results, results[1:]))
    assert all(r.cached_tokens >= w.shared_tokens for r in results[1:])
    assert mlx_engine.kv_cells_used() == 24 + 3 - 1  # the last request's prompt + output (last token not decoded)


def test_bench_concurrency_is_bounded_by_the_slots(mlx_engine):
    from localrun.errors import ConfigError

    w = Workload(prompt_tokens=8, max_tokens=2, requests=2)
    with pytest.raises(ConfigError, match="more than the 1 sequences"):
        EngineClient(mlx_engine).run_level(iter_requests(w, 2, 0), 2, w)
