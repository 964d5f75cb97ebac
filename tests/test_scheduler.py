"""The server's continuous-batching scheduler on a scripted engine (tests/fakes.py): no model, milliseconds.

Admission order, cancel mid-stream, the queue bound (and its 503 + Retry-After over HTTP), a failing
``start`` or ``step``, parallel slots, shutdown. Waits are on events with generous timeouts, never sleeps.
"""

from __future__ import annotations

import asyncio

import pytest
from fakes import ScriptedEngine

from localrun.backends.base import SamplingParams
from localrun.errors import BackendError, ContextOverflowError
from localrun.server.errors import QueueFullError, ShuttingDownError
from localrun.server.metrics import ServerMetrics
from localrun.server.scheduler import Job, Scheduler

TIMEOUT_S = 10.0  # per awaited event: generous; a fake step takes microseconds


@pytest.fixture
def make():
    """make(n_parallel, max_queue=…, **engine_kw) → (engine, scheduler, metrics); stopped after the test."""
    made = []

    def _make(n_parallel: int = 1, *, max_queue: int = 64, **kw):
        eng = ScriptedEngine(n_parallel, **kw)
        metrics = ServerMetrics().for_model("fake", n_parallel, eng.n_ctx * n_parallel)
        sched = Scheduler(eng, metrics, max_queue=max_queue)
        made.append((eng, sched))
        return eng, sched, metrics

    yield _make
    for eng, sched in made:
        eng.open()
        assert sched.stop(TIMEOUT_S), "the scheduler thread did not stop"


def job(text: str, max_tokens: int | None = None) -> Job:
    return Job(loop=asyncio.get_running_loop(), queue=asyncio.Queue(), tokens=list(text.encode()),
               params=SamplingParams(temperature=0, max_tokens=max_tokens))


async def event(j: Job) -> tuple[str, object]:
    return await asyncio.wait_for(j.queue.get(), TIMEOUT_S)


async def finish(j: Job) -> tuple[str, str | None, Exception | None]:
    """Read ``j``'s events to its end → (text streamed, finish reason, error)."""
    parts = []
    while True:
        kind, val = await event(j)
        if kind == "error":
            return "".join(parts), None, val
        if kind == "chunk":
            parts.append(val.text)
            if val.finish_reason is not None:
                return "".join(parts), val.finish_reason, None


def count(metrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, {"model": "fake", **labels}) or 0.0


def test_the_fake_keeps_the_engine_contract():
    from localrun.backends import as_batch_engine
    from localrun.backends.base import BatchEngine, Generation

    eng = ScriptedEngine(2)
    assert isinstance(eng, BatchEngine) and as_batch_engine(eng) is eng  # served as it is, not wrapped
    gen = eng.start(eng.tokenize("hi"), SamplingParams())
    assert isinstance(gen, Generation)
    eng.release(gen)
    chunks = list(eng.generate("echo me", SamplingParams(max_tokens=4)))
    assert "".join(c.text for c in chunks) == "echo" and chunks[-1].finish_reason == "length"
    assert not any(s.busy for s in eng.slots)


def test_requests_are_admitted_in_arrival_order(make):
    eng, sched, _ = make(2)

    async def body():
        jobs = [job(f"prompt {i}") for i in range(6)]
        for j in jobs:
            sched.submit(j)
        sched.start()
        results = [await finish(j) for j in jobs]
        assert results == [(f"prompt {i}", "stop", None) for i in range(6)]  # the echo, in full
        assert eng.events("start") == [(f"prompt {i}",) for i in range(6)]

    asyncio.run(body())


def test_max_tokens_ends_with_length_and_the_final_chunk_has_stats(make):
    eng, sched, _ = make(1)

    async def body():
        sched.start()
        j = job("abcdefgh", max_tokens=3)
        sched.submit(j)
        assert await event(j) == ("admitted", 0)
        kind, chunks = None, []
        while not chunks or chunks[-1].finish_reason is None:
            kind, c = await event(j)
            chunks.append(c)
        assert "".join(c.text for c in chunks) == "abc" and chunks[-1].finish_reason == "length"
        assert chunks[-1].stats.completion_tokens == 3 and chunks[-1].stats.prompt_tokens == 8

    asyncio.run(body())


def test_all_parallel_slots_are_used(make):
    eng, sched, metrics = make(3)

    async def body():
        jobs = [job(f"request {i} " * 3) for i in range(5)]
        for j in jobs:
            sched.submit(j)
        sched.start()
        for j in jobs:
            assert (await finish(j))[1] == "stop"
        batches = [len(texts) for (texts,) in eng.events("step")]
        assert max(batches) == 3  # three sequences decoded in one step
        assert all(n <= 3 for n in batches)
        assert count(metrics, "localrun_generations_total", finish_reason="stop") == 5
        assert count(metrics, "localrun_active_sequences") == 0

    asyncio.run(body())


def test_cancel_mid_stream_frees_the_slot(make):
    eng, sched, metrics = make(1, reply=lambda prompt: None if bytes(prompt) == b"endless" else "ok")

    async def body():
        eng.gate()
        sched.start()
        a = job("endless")
        sched.submit(a)
        assert (await event(a))[0] == "admitted"
        eng.allow(2)
        assert (await event(a))[0] == "chunk"
        assert (await event(a))[0] == "chunk"  # mid-stream: two tokens out, it would never stop by itself
        b = job("next")
        sched.submit(b)  # waits: the only slot is a's
        sched.cancel(a)
        eng.open()
        assert await finish(b) == ("ok", "stop", None)
        assert ("endless", False) in eng.events("release")  # freed with its KV dropped
        assert eng.events("start") == [("endless",), ("next",)]
        assert count(metrics, "localrun_generations_total", finish_reason="cancelled") == 1

    asyncio.run(body())


def test_cancel_while_queued_never_starts(make):
    eng, sched, _ = make(1)

    async def body():
        eng.gate()
        sched.start()
        a, b, c = job("a"), job("b"), job("c")
        for j in (a, b, c):
            sched.submit(j)
        assert (await event(a))[0] == "admitted"
        sched.cancel(b)
        assert sched.n_waiting == 1
        eng.open()
        assert (await finish(a))[1] == "stop" and (await finish(c))[1] == "stop"
        assert eng.events("start") == [("a",), ("c",)]

    asyncio.run(body())


def test_queue_bound_counts_free_slots(make):
    eng, sched, _ = make(2, max_queue=3)

    async def body():
        jobs = [job(f"j{i}") for i in range(5)]  # 2 slots + 3 waiting places
        for j in jobs:
            sched.submit(j)
        with pytest.raises(QueueFullError) as e:
            sched.submit(job("one too many"))
        assert e.value.retry_after_s >= 1 and "3 requests are already waiting" in e.value.message
        sched.cancel(jobs[-1])  # a place frees up
        late = job("late")
        sched.submit(late)
        sched.start()
        assert (await finish(late))[1] == "stop"

    asyncio.run(body())


def test_queue_bound_while_running(make):
    eng, sched, _ = make(1, max_queue=1)

    async def body():
        eng.gate()
        sched.start()
        a, b = job("a"), job("b")
        sched.submit(a)
        assert (await event(a))[0] == "admitted"  # a holds the slot
        sched.submit(b)  # b takes the one waiting place
        with pytest.raises(QueueFullError):
            sched.submit(job("c"))
        eng.open()
        assert (await finish(a))[1] == "stop" and (await finish(b))[1] == "stop"
        d = job("d")
        sched.submit(d)  # room again
        assert (await finish(d))[1] == "stop"

    asyncio.run(body())


def test_an_exception_in_start_fails_that_job_only(make):
    eng, sched, metrics = make(1, fail_start=lambda text: text == "boom")

    async def body():
        jobs = [job("before"), job("boom"), job("after")]
        for j in jobs:
            sched.submit(j)
        sched.start()
        assert await finish(jobs[0]) == ("before", "stop", None)
        _, _, err = await finish(jobs[1])
        assert isinstance(err, BackendError) and "RuntimeError" in err.message
        assert await finish(jobs[2]) == ("after", "stop", None)  # the slot was given back
        assert sched.n_running == 0 and count(metrics, "localrun_active_sequences") == 0

    asyncio.run(body())


def test_a_localrun_error_in_start_reaches_the_client_as_is(make):
    overflow = ContextOverflowError(300, 256)
    eng, sched, _ = make(1, fail_start=overflow)

    async def body():
        sched.start()
        j = job("too long")
        sched.submit(j)
        assert await event(j) == ("error", overflow)
        eng.fail_start = None
        ok = job("fits")
        sched.submit(ok)
        assert await finish(ok) == ("fits", "stop", None)

    asyncio.run(body())


def test_the_thread_survives_a_failed_step(make):
    eng, sched, metrics = make(2)

    async def body():
        eng.gate()
        a, b = job("first"), job("second")
        sched.submit(a)
        sched.submit(b)
        sched.start()  # both admitted in the first iteration, then held in the gated step
        assert (await event(a))[0] == "admitted" and (await event(b))[0] == "admitted"
        eng.fail_next_step(RuntimeError("llama_decode returned -3"))
        eng.allow(1)
        for j in (a, b):  # every running job gets the error …
            _, _, err = await finish(j)
            assert isinstance(err, BackendError) and "llama_decode returned -3" in err.message
        assert sorted(eng.events("release")) == [("first", False), ("second", False)]
        eng.open()
        c = job("third")  # … and the scheduler keeps serving
        sched.submit(c)
        assert await finish(c) == ("third", "stop", None)
        assert not sched.idle and count(metrics, "localrun_active_sequences") == 0

    asyncio.run(body())


def test_shutdown_ends_running_and_queued_requests(make):
    eng, sched, _ = make(1)

    async def body():
        eng.gate()
        sched.start()
        a, b = job("running"), job("queued")
        sched.submit(a)
        sched.submit(b)
        assert (await event(a))[0] == "admitted"
        assert sched.stop(TIMEOUT_S)  # interrupts the gated step (engine.interrupt), the thread ends
        for j in (a, b):
            _, _, err = await finish(j)
            assert isinstance(err, ShuttingDownError)
        with pytest.raises(ShuttingDownError):
            sched.submit(job("after"))
        assert sched.idle

    asyncio.run(body())


def test_prefix_of_a_finished_sequence_is_reused(make):
    eng, sched, metrics = make(2)

    async def body():
        sched.start()
        first = job("shared prefix, then one")
        sched.submit(first)
        await finish(first)
        second = job("shared prefix, then two")
        sched.submit(second)
        assert await event(second) == ("admitted", len("shared prefix, then "))
        await finish(second)
        assert count(metrics, "localrun_prefix_cache_hits_total") == 1

    asyncio.run(body())


# ---------------------------------------------------------------------- over HTTP: 503 + Retry-After

def test_a_full_queue_answers_503_with_retry_after(tmp_path):
    import httpx

    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    eng = ScriptedEngine(1)
    app = create_app(eng, Settings(home=tmp_path, models_dir=tmp_path / "models"), ServeOptions(max_queue=1))
    st = app.state.localrun

    async def body():
        eng.gate()
        st.scheduler.start()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fake", timeout=TIMEOUT_S) as http:
            def complete(prompt: str):
                return asyncio.ensure_future(http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4}))

            first = complete("one")
            await _until(lambda: st.scheduler.n_running == 1)
            second = complete("two")
            await _until(lambda: st.scheduler.n_waiting == 1)
            r = await http.post("/v1/completions", json={"prompt": "three", "max_tokens": 4})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "queue_full"
            r = await http.post("/api/generate", json={"model": "x", "prompt": "three", "stream": False})
            assert r.status_code == 503 and r.headers["retry-after"] == "1" and "busy" in r.json()["error"]
            eng.open()
            for fut, text in ((first, "one"), (second, "two")):
                resp = await asyncio.wait_for(fut, TIMEOUT_S)
                assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == text

    try:
        asyncio.run(body())
    finally:
        eng.open()
        assert st.close()


async def _until(cond, timeout_s: float = TIMEOUT_S) -> None:
    """Wait (yielding to the event loop) until ``cond()`` holds; fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)
