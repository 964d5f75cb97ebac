"""The model registry (server/models.py) in milliseconds: scripted engines (tests/fakes.py) behind the real
app, a loader that plans fixed byte counts. Residency decisions, keep-alive, one load per model, busy models
never evicted, 503 + Retry-After, too big alone; keep_alive parsing. The same on real models: test_multimodel.py."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from fakes import ScriptedEngine
from helpers import metric_value

from localrun.config import Settings
from localrun.server.app import create_app
from localrun.server.budget import Budget, Need
from localrun.server.errors import RequestError
from localrun.server.keepalive import parse_keep_alive
from localrun.server.metrics import ServerMetrics
from localrun.server.models import ModelRegistry, Planned
from localrun.server.runtime import ServeOptions

TIMEOUT_S = 10.0
MiB = 1 << 20


@pytest.mark.parametrize("value, secs", [
    (None, None), (0, 0.0), ("0", 0.0), (300, 300.0), (1.5, 1.5), ("5m", 300.0), ("1h30m", 5400.0),
    ("300ms", 0.3), ("-1", math.inf), (-1, math.inf), ("-1m", math.inf), ("300", 300.0), ("2h45m10s", 9910.0),
])
def test_keep_alive_parses_like_ollama(value, secs):
    assert parse_keep_alive(value) == secs


@pytest.mark.parametrize("value", ["soon", "5 minutes", "5x", True, [1], {}])
def test_a_bad_keep_alive_is_a_400_naming_the_field(value):
    with pytest.raises(RequestError) as ei:
        parse_keep_alive(value)
    assert ei.value.param == "keep_alive"


class FakeLoader:
    """Plans ``needs[path]`` bytes of RAM; loads a ``ScriptedEngine`` (made in advance in ``engines`` so a
    test can gate it). ``loads`` counts loads per path; ``hold`` (an asyncio-free threading.Event) delays
    them."""

    def __init__(self, needs: dict[str, int], *, fits: dict[str, bool] | None = None,
                 given: dict[str, dict] | None = None) -> None:
        import threading

        self.needs = needs
        self.fits = fits or {}
        self.given = given or {}
        self.engines: dict[str, ScriptedEngine] = {}
        self.loads: dict[str, int] = {}
        self.hold = threading.Event()
        self.hold.set()

    def engine(self, path: str) -> ScriptedEngine:
        if path not in self.engines:
            eng = ScriptedEngine(1, reply=lambda p: "ok")
            eng.model_path = path
            self.engines[path] = eng
        return self.engines[path]

    def plan(self, path: str, n_ctx: int | None = None, held: dict | None = None) -> Planned:
        asked = {"n_ctx": n_ctx or 8192, "kv_type": "f16"}
        return Planned(path, Need(0, self.needs[path]), fits=self.fits.get(path, True),
                       reasons=[f"{path} needs {self.needs[path]} bytes"], asked=asked,
                       given=self.given.get(path, asked))

    def load(self, planned: Planned):
        """The path's engine (a fresh one after an unload closed it; with the context planned when a request
        asked one, else ScriptedEngine's 256)."""
        assert self.hold.wait(TIMEOUT_S)
        self.loads[planned.path] = self.loads.get(planned.path, 0) + 1
        if planned.path in self.engines and self.engines[planned.path].closed:
            del self.engines[planned.path]
        eng = self.engine(planned.path)
        if planned.asked["n_ctx"] != 8192:
            eng.n_ctx = planned.given["n_ctx"]
        return eng


@pytest.fixture
def files(tmp_path):
    out = {}
    for n in ("a", "b", "c", "huge"):
        p = tmp_path / f"{n}.gguf"
        p.write_bytes(b"GGUF")
        out[n] = str(p.resolve())
    return out


def make(tmp_path, files, *, ram_mib: int = 150, max_models=None, load_wait_s: float = 5.0, **kw):
    needs = {files["a"]: 100 * MiB, files["b"]: 100 * MiB, files["c"]: 40 * MiB, files["huge"]: 400 * MiB}
    loader = FakeLoader(needs, **kw)
    settings = Settings(home=tmp_path, models_dir=tmp_path / "models")
    opts = ServeOptions()
    reg = ModelRegistry(settings, opts, ServerMetrics(), loader=loader,
                        budget=Budget(ram_mib * MiB, None, max_models), load_wait_s=load_wait_s)
    app = create_app(None, settings, opts, registry=reg)
    return app, reg, loader


def run(app, reg, body):
    async def main():
        transport = httpx.ASGITransport(app=app)
        reaper = asyncio.ensure_future(reg.reap(0.02))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=TIMEOUT_S) as http:
                await body(http)
        finally:
            reaper.cancel()
            for eng in getattr(reg.loader, "engines", {}).values():
                eng.open()
            reg.close()

    asyncio.run(main())


def gen(http, model, **kw):
    return http.post("/api/generate", json={"model": model, "prompt": "hi", "stream": False, **kw})


async def until(cond, timeout_s: float = TIMEOUT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def loaded(reg) -> set[str]:
    return {r.key for r in reg.residents.values()}


def test_lru_idle_model_is_evicted_when_the_next_does_not_fit(tmp_path, files):
    app, reg, loader = make(tmp_path, files, ram_mib=150)

    async def body(http):
        r = await gen(http, files["a"])
        assert r.status_code == 200 and r.json()["response"] == "ok"
        r = await gen(http, files["c"])  # 100 + 40 fit in 150: both stay
        assert r.status_code == 200 and loaded(reg) == {files["a"], files["c"]}
        await gen(http, files["a"])  # a is now the most recently used; c is LRU
        r = await gen(http, files["b"])  # 100 more: only evicting a (c alone is not enough) makes room
        assert r.status_code == 200
        assert loaded(reg) == {files["c"], files["b"]} or loaded(reg) == {files["b"]}
        assert files["a"] not in loaded(reg)
        assert loader.engines[files["a"]].closed
        text = (await http.get("/metrics")).text
        assert "localrun_model_evictions_total" in text

    run(app, reg, body)


def test_lru_order_picks_the_least_recently_used(tmp_path, files):
    app, reg, loader = make(tmp_path, files, ram_mib=250)

    async def body(http):
        for name in ("a", "c", "a"):
            assert (await gen(http, files[name])).status_code == 200
        assert (await gen(http, files["b"])).status_code == 200  # 100+40+100 = 240 fits: nobody evicted
        assert loaded(reg) == {files["a"], files["b"], files["c"]}
        assert (await gen(http, files["huge"])).status_code == 400  # 400 MiB > 250 even alone
        for name in ("c", "b"):
            assert (await gen(http, files[name])).status_code == 200
        loader.needs[files["huge"]] = 120 * MiB  # now: a (LRU) and then c must go; b (newest) stays
        assert (await gen(http, files["huge"])).status_code == 200
        assert loaded(reg) == {files["b"], files["huge"]}

    run(app, reg, body)


def test_a_busy_model_is_never_evicted_the_new_request_waits(tmp_path, files):
    app, reg, loader = make(tmp_path, files, ram_mib=150)
    a = loader.engine(files["a"])

    async def body(http):
        a.gate()
        stream_a = asyncio.ensure_future(gen(http, files["a"], options={"num_predict": 2}))
        await until(lambda: files["a"] in reg.residents and reg.residents[files["a"]].state.scheduler.n_running)
        want_b = asyncio.ensure_future(gen(http, files["b"]))
        await asyncio.sleep(0.3)
        assert not want_b.done() and files["a"] in reg.residents and not a.closed  # b waits, a serves
        a.open()
        ra = await asyncio.wait_for(stream_a, TIMEOUT_S)
        assert ra.status_code == 200 and ra.json()["response"] == "ok"
        rb = await asyncio.wait_for(want_b, TIMEOUT_S)
        assert rb.status_code == 200 and rb.json()["response"] == "ok"
        assert loaded(reg) == {files["b"]} and a.closed

    run(app, reg, body)


def test_waiting_too_long_for_memory_is_a_503_with_retry_after(tmp_path, files):
    app, reg, loader = make(tmp_path, files, ram_mib=150, load_wait_s=0.3)
    a = loader.engine(files["a"])

    async def body(http):
        a.gate()
        held = asyncio.ensure_future(gen(http, files["a"]))
        await until(lambda: files["a"] in reg.residents and reg.residents[files["a"]].state.scheduler.n_running)
        r = await gen(http, files["b"])
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1 and "busy" in r.json()["error"]
        r = await http.post("/v1/completions", json={"model": files["b"], "prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
        a.open()
        assert (await held).status_code == 200

    run(app, reg, body)


def test_simultaneous_first_requests_load_once(tmp_path, files):
    app, reg, loader = make(tmp_path, files)

    async def body(http):
        loader.hold.clear()
        reqs = [asyncio.ensure_future(gen(http, files["a"])) for _ in range(6)]
        await asyncio.sleep(0.2)
        loader.hold.set()
        for r in await asyncio.gather(*reqs):
            assert r.status_code == 200
        assert (await gen(http, "a.gguf")).status_code == 200  # the resident's file name
        assert loader.loads == {files["a"]: 1}

    run(app, reg, body)


def test_keep_alive_zero_unloads_and_expiry_unloads(tmp_path, files):
    app, reg, loader = make(tmp_path, files)

    async def body(http):
        assert (await gen(http, files["a"], keep_alive=0)).status_code == 200
        await until(lambda: loader.engines[files["a"]].closed)
        assert files["a"] not in reg.residents
        assert (await gen(http, files["c"], keep_alive="50ms")).status_code == 200
        ps = (await http.get("/api/ps")).json()["models"]
        assert [m["busy"] for m in ps] == [False] and ps[0]["expires_at"].endswith("Z")
        await until(lambda: files["c"] not in reg.residents)  # the reaper unloads it
        assert (await gen(http, files["b"], keep_alive=-1)).status_code == 200
        ps = (await http.get("/api/ps")).json()["models"]
        assert ps[0]["localrun"]["never_expires"] and ps[0]["expires_at"] > "2200"

    run(app, reg, body)


def test_empty_prompt_loads_and_keep_alive_zero_unloads(tmp_path, files):
    app, reg, loader = make(tmp_path, files)

    async def body(http):
        r = (await http.post("/api/generate", json={"model": files["a"]})).json()
        assert r["done"] is True and r["done_reason"] == "load" and r["response"] == ""
        assert files["a"] in reg.residents
        r = (await http.post("/api/chat", json={"model": files["c"], "messages": []})).json()
        assert r["done_reason"] == "load" and files["c"] in reg.residents
        r = (await http.post("/api/generate", json={"model": files["a"], "keep_alive": 0})).json()
        assert r["done_reason"] == "unload" and files["a"] not in reg.residents
        r = (await http.post("/api/generate", json={"model": files["b"], "keep_alive": 0})).json()
        assert r["done_reason"] == "unload" and files["b"] not in reg.residents  # not loaded: nothing to do
        assert loader.loads.get(files["b"]) is None

    run(app, reg, body)


def test_max_models_caps_the_count(tmp_path, files):
    app, reg, loader = make(tmp_path, files, ram_mib=10_000, max_models=1)

    async def body(http):
        for name in ("a", "c", "b"):
            assert (await gen(http, files[name])).status_code == 200
            assert loaded(reg) == {files[name]}

    run(app, reg, body)


def test_too_big_alone_is_a_400_with_the_planners_reasons(tmp_path, files):
    app, reg, loader = make(tmp_path, files, fits={files["c"]: False})

    async def body(http):
        r = await gen(http, files["huge"])
        assert r.status_code == 400 and "even alone" in r.json()["error"] and "needs 419430400 bytes" in r.json()[
            "error"]
        r = await http.post("/v1/completions", json={"model": files["c"], "prompt": "x"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_too_large"
        assert r.json()["error"]["param"] == "model"
        assert not reg.residents

    run(app, reg, body)


def test_an_unknown_name_is_a_404_without_a_startup_model(tmp_path, files):
    app, reg, loader = make(tmp_path, files)

    async def body(http):
        r = await gen(http, "no-such-model-anywhere")
        assert r.status_code == 404 and "no-such-model-anywhere" in r.json()["error"]
        r = await http.post("/api/show", json={"model": "no-such-model-anywhere"})
        assert r.status_code == 404

    run(app, reg, body)


def test_asked_vs_given_in_headers_and_ps(tmp_path, files):
    given = {"n_ctx": 2048, "kv_type": "q8_0"}
    app, reg, loader = make(tmp_path, files, given={files["c"]: given})

    async def body(http):
        r = await gen(http, files["a"])  # given what was asked: only the model's name
        assert r.headers["x-localrun-model"] == r.json()["model"] == "a"
        assert "x-localrun-given" not in r.headers
        r = await gen(http, files["c"])
        assert r.headers["x-localrun-asked"] == "n_ctx=8192 kv_type=f16"
        assert r.headers["x-localrun-given"] == "n_ctx=2048 kv_type=q8_0"
        assert "needs 41943040 bytes" in r.headers["x-localrun-given-reason"]
        ps = {m["localrun"]["path"]: m["localrun"] for m in (await http.get("/api/ps")).json()["models"]}
        assert ps[files["a"]]["asked_vs_given"] is None
        assert ps[files["c"]]["asked_vs_given"]["given"] == given

    run(app, reg, body)


def test_a_pinned_model_is_never_evicted_and_per_model_keep_alive(tmp_path, files):
    app, reg, loader = make(tmp_path, files, ram_mib=150, load_wait_s=0.2)
    reg.keep_alive_by_model["c"] = 0.0  # c's own default: unload after each request
    reg.preload(files["a"], pinned=True)  # as `serve --pin a.gguf`: loaded at start-up

    async def body(http):
        r = await gen(http, files["b"])  # a is idle but pinned: b cannot make room
        assert r.status_code == 503 and files["a"] in reg.residents
        assert (await gen(http, files["c"])).status_code == 200  # 40 MiB fit beside a
        await until(lambda: files["c"] not in reg.residents)  # and leave after the request (keep-alive 0)
        assert files["a"] in reg.residents
        r = (await http.post("/api/generate", json={"model": files["a"], "keep_alive": 0})).json()
        assert r["done_reason"] == "unload" and files["a"] not in reg.residents  # an explicit unload does

    run(app, reg, body)


def test_serve_flags_for_residency():
    from localrun.commands.serve import parse_residency
    from localrun.errors import ConfigError

    r = parse_residency(["10m", "gemma-3-270m=-1", "smol=0"], "2GiB", None, 3, ["gemma-3-270m"])
    assert r["keep_alive_s"] == 600 and r["keep_alive_by_model"] == {"gemma-3-270m": math.inf, "smol": 0.0}
    assert r["max_ram_bytes"] == 2 << 30 and r["max_models"] == 3 and r["pins"] == ("gemma-3-270m",)
    with pytest.raises(ConfigError, match="keep-alive"):
        parse_residency(["soon"], None, None, None, [])
    with pytest.raises(ConfigError, match="max-memory"):
        parse_residency([], "lots", None, None, [])


def ctx_of(reg, path) -> int:
    return reg.residents[path].state.engine.n_ctx


def test_num_ctx_reloads_a_resident_with_another_context(tmp_path, files):
    app, reg, loader = make(tmp_path, files)

    async def body(http):
        assert (await gen(http, files["a"])).status_code == 200
        first = loader.engines[files["a"]]
        r = await gen(http, "a:latest", options={"num_ctx": 1024})  # Ollama: another context reloads
        assert r.status_code == 200 and loader.loads[files["a"]] == 2 and first.closed
        assert r.json()["model"] == "a"  # the name it had, whatever name the reloading request used
        assert ctx_of(reg, files["a"]) == 1024
        ps = (await http.get("/api/ps")).json()["models"]
        assert ps[0]["context_length"] == 1024
        assert (await gen(http, files["a"], options={"num_ctx": 1024})).status_code == 200  # the same: kept
        assert (await gen(http, files["a"])).status_code == 200  # no num_ctx: whatever is loaded serves
        r = await http.post("/api/generate", json={"model": files["a"], "options": {"num_ctx": 512}})
        assert r.json()["done_reason"] == "load" and ctx_of(reg, files["a"]) == 512  # an empty prompt too
        assert loader.loads[files["a"]] == 3
        text = (await http.get("/metrics")).text
        assert metric_value(text, "localrun_model_unloads_total", reason="reload") == 2
        for bad in (0, -5):
            r = await gen(http, files["a"], options={"num_ctx": bad})
            assert r.status_code == 400 and "num_ctx" in r.json()["error"]
        assert loader.loads[files["a"]] == 3

    run(app, reg, body)


def test_a_reload_waits_for_the_running_request_and_later_requests_get_the_new_context(tmp_path, files):
    app, reg, loader = make(tmp_path, files)

    async def body(http):
        assert (await gen(http, files["a"])).status_code == 200
        old = loader.engines[files["a"]]
        old.gate()
        running = asyncio.ensure_future(gen(http, files["a"], options={"num_predict": 2}))
        await until(lambda: reg.residents[files["a"]].state.scheduler.n_running)
        wants_2048 = asyncio.ensure_future(gen(http, files["a"], options={"num_ctx": 2048}))
        await until(lambda: reg.residents[files["a"]].reloading)
        any_ctx = asyncio.ensure_future(gen(http, files["a"]))  # arrives during the drain: waits for the reload
        await asyncio.sleep(0.2)
        assert not wants_2048.done() and not any_ctx.done() and not old.closed  # never cut a running request
        old.open()
        for fut in (running, wants_2048, any_ctx):
            r = await asyncio.wait_for(fut, TIMEOUT_S)
            assert r.status_code == 200 and r.json()["response"] == "ok"
        assert old.closed and loader.loads[files["a"]] == 2 and ctx_of(reg, files["a"]) == 2048
        assert len(old.events("start")) == 2  # the first request and the running one; the others: the new

    run(app, reg, body)


def test_a_reload_that_waits_too_long_is_a_503_and_the_model_keeps_serving(tmp_path, files):
    app, reg, loader = make(tmp_path, files, load_wait_s=0.3)

    async def body(http):
        assert (await gen(http, files["a"])).status_code == 200
        old = loader.engines[files["a"]]
        old.gate()
        running = asyncio.ensure_future(gen(http, files["a"]))
        await until(lambda: reg.residents[files["a"]].state.scheduler.n_running)
        r = await gen(http, files["a"], options={"num_ctx": 2048})
        assert r.status_code == 503 and "retry-after" in r.headers and "2048" in r.json()["error"]
        old.open()
        assert (await running).status_code == 200
        assert (await gen(http, files["a"])).status_code == 200 and loader.loads[files["a"]] == 1

    run(app, reg, body)


def test_a_context_given_smaller_than_asked_is_not_reloaded_again(tmp_path, files):
    app, reg, loader = make(tmp_path, files, given={files["c"]: {"n_ctx": 2048, "kv_type": "f16"}})

    async def body(http):
        r = await gen(http, files["c"], options={"num_ctx": 65536})
        assert r.headers["x-localrun-asked"] == "n_ctx=65536 kv_type=f16"
        assert r.headers["x-localrun-given"] == "n_ctx=2048 kv_type=f16"
        r = await gen(http, files["c"], options={"num_ctx": 65536})  # the same ask: the planner's answer stays
        assert r.status_code == 200 and loader.loads[files["c"]] == 1

    run(app, reg, body)


def test_keep_alive_and_ttl_on_the_openai_routes(tmp_path, files):
    app, reg, loader = make(tmp_path, files)

    def complete(model, **kw):
        return http_.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2, **kw})

    async def body(http):
        nonlocal http_
        http_ = http
        r = await complete(files["a"], keep_alive=0)  # Ollama's semantics, as an extension
        assert r.status_code == 200
        await until(lambda: files["a"] not in reg.residents and loader.engines[files["a"]].closed)
        assert (await complete(files["c"], ttl=0)).status_code == 200  # LM Studio's ttl, seconds
        await until(lambda: files["c"] not in reg.residents)
        assert (await complete(files["b"], keep_alive="-1m")).status_code == 200
        ps = (await http.get("/api/ps")).json()["models"]
        assert ps[0]["localrun"]["never_expires"]
        assert (await complete(files["b"], ttl=600)).status_code == 200
        assert reg.residents[files["b"]].keep_alive_s == 600
        for field, bad in (("keep_alive", "soon"), ("ttl", "5m"), ("ttl", True)):
            r = await complete(files["b"], **{field: bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == field
        assert reg.residents[files["b"]].keep_alive_s == 600

    http_ = None
    run(app, reg, body)


def test_an_unloaded_models_names_still_name_it(tmp_path, caplog):
    """After a keep-alive unload, a request naming the model (its alias, file stem) reloads that model: the
    name is not "not on this machine", and the default model is not answered in its place."""
    from localrun.server.names import ModelNames

    names = ModelNames(Settings(home=tmp_path, models_dir=tmp_path / "models"), {})
    names.default_key = "/models/default.gguf"
    names.remember({"gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m:latest"}, "/models/gemma.gguf")
    with caplog.at_level("INFO", logger="localrun.server"):
        key = asyncio.run(names.resolve("gemma-3-270m-q4_k_m"))
    assert key == "/models/gemma.gguf" and "not on this machine" not in caplog.text
