"""The two ways bench drives a model, both timing every generated token.

* ``EngineClient`` — in-process: drives a loaded localrun ``Engine`` through its multi-sequence API
  (``start`` / ``step`` / ``release``, see ``backends/llamacpp.py``) from one thread, up to
  ``engine.n_parallel`` sequences decoded together, the way ``localrun serve`` schedules them but with
  no HTTP in between. Every ``step`` returns one chunk per sampled token, so token times are exact.
* ``HttpClient`` — any OpenAI-compatible server (``localrun serve``, llama-server, Ollama, vLLM):
  streaming ``/v1/completions`` (or ``/v1/chat/completions``) over SSE with httpx; one chunk is taken
  as one token (true for llama.cpp, Ollama and vLLM streams), and ``usage`` (``stream_options.include_usage``)
  supplies the exact token counts and cached prompt tokens when the server reports them.

Both return ``RequestResult``s; times are ``time.perf_counter()`` seconds.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from localrun.bench.workload import Request, Workload
from localrun.errors import ConfigError, LocalrunError


@dataclass
class RequestResult:
    """One request as the client saw it. ``token_times`` holds the arrival time of every token chunk."""

    index: int
    ok: bool = True
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache; None = not reported
    t_arrival: float = 0.0  # when the request was due (Poisson) or sent (closed loop)
    t_start: float = 0.0  # when the engine/server took it (in-process) or it was sent (HTTP)
    t_first: float = 0.0
    t_end: float = 0.0
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def ttft_s(self) -> float:
        """Arrival → first token (queueing and prefill included)."""
        return self.t_first - self.t_arrival

    @property
    def e2e_s(self) -> float:
        return self.t_end - self.t_arrival

    @property
    def queue_s(self) -> float:
        return max(0.0, self.t_start - self.t_arrival)

    @property
    def prefill_s(self) -> float:
        """Taken → first token: the prefill (plus, under load, the decode steps it shared)."""
        return self.t_first - self.t_start

    @property
    def itl_s(self) -> list[float]:
        """Gaps between successive token chunks (inter-token latency)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot_s(self) -> float | None:
        """(last token − first token) / (completion tokens − 1); None for a single-token answer."""
        if self.completion_tokens < 2 or not self.token_times:
            return None
        return (self.token_times[-1] - self.t_first) / (self.completion_tokens - 1)

    def to_dict(self) -> dict:
        return {"index": self.index, "ok": self.ok, "error": self.error, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cached_tokens": self.cached_tokens,
                "ttft_s": self.ttft_s if self.ok else None, "tpot_s": self.tpot_s if self.ok else None,
                "e2e_s": self.e2e_s if self.ok else None, "queue_s": self.queue_s if self.ok else None,
                "finish_reason": self.finish_reason}


OnResult = Callable[[RequestResult], None]


def _due(requests: Iterable[Request], w: Workload, t0: float):
    """Stop yielding once the level's ``duration_s`` has passed (or a request would arrive after it)."""
    for r in requests:
        if w.duration_s and (time.perf_counter() - t0 >= w.duration_s
                             or (r.arrival_s is not None and r.arrival_s >= w.duration_s)):
            return
        yield r


# ------------------------------------------------------------------------------------------------
class EngineClient:
    """In-process bench on a loaded engine (needs ``start``/``step``/``release``; llama.cpp backend).

    Not thread-safe, like the engine: call ``run_level`` from the thread that owns the engine.
    """

    label = "in-process"

    def __init__(self, engine) -> None:
        if not all(hasattr(engine, a) for a in ("start", "step", "release")):
            raise ConfigError(f"the {engine.backend} backend has no multi-sequence API for an in-process bench",
                              hint="run `localrun serve` and bench it with --url")
        self.engine = engine
        self.max_concurrency = int(getattr(engine, "n_parallel", 1))
        self._eog = [t for t in range(int(engine.n_vocab)) if engine.is_eog(t)]

    def tokenize(self, text: str) -> list[int]:
        return self.engine.tokenize(text, add_special=False)

    def params(self, w: Workload):
        from localrun.backends.base import SamplingParams

        bias = {t: float("-inf") for t in self._eog} if w.ignore_eos else {}
        return SamplingParams(temperature=0.0, max_tokens=w.max_tokens, logit_bias=bias)

    def warmup(self, w: Workload) -> None:
        """One short request (not measured) so the first level does not pay for page faults."""
        from localrun.backends.base import SamplingParams

        bos = self.tokenize("Hello there, warm up.")
        gen = self.engine.start(bos, SamplingParams(temperature=0.0, max_tokens=4))
        try:
            while not gen.done:
                self.engine.step([gen])
        finally:
            self.engine.release(gen, keep_kv=False)

    def run_level(self, requests: Iterable[Request], concurrency: int, w: Workload,
                  on_result: OnResult | None = None) -> tuple[list[RequestResult], float, float]:
        """Run one level; returns (results, level start, level end) in perf_counter seconds."""
        if concurrency > self.max_concurrency:
            raise ConfigError(f"concurrency {concurrency} is more than the {self.max_concurrency} sequences loaded")
        eng, params = self.engine, self.params(w)
        t0 = time.perf_counter()
        source = iter(_due(requests, w, t0))
        waiting: list[tuple[Request, float]] = []  # arrived (Poisson), not yet admitted
        nxt = next(source, None)
        active: dict[int, tuple] = {}  # id(gen) -> (gen, RequestResult)
        results: list[RequestResult] = []
        while nxt is not None or waiting or active:
            now = time.perf_counter()
            while nxt is not None and (nxt.arrival_s is not None and t0 + nxt.arrival_s <= now):
                waiting.append((nxt, t0 + nxt.arrival_s))
                nxt = next(source, None)
            while len(active) < concurrency:
                if waiting:
                    req, t_arr = waiting.pop(0)
                elif nxt is not None and nxt.arrival_s is None:  # closed loop: send now
                    req, t_arr, nxt = nxt, time.perf_counter(), None
                else:
                    break
                res = RequestResult(index=req.index, t_arrival=t_arr, prompt_tokens=len(req.tokens))
                try:
                    gen = eng.start(req.tokens, params)
                except LocalrunError as e:
                    res.ok, res.error, res.t_end = False, e.message, time.perf_counter()
                    results.append(res)
                    if on_result:
                        on_result(res)
                else:
                    res.t_start = gen.t_start
                    res.cached_tokens = gen.cached_tokens
                    active[id(gen)] = (gen, res)
                if nxt is None and not waiting:
                    nxt = next(source, None)
            if not active:
                if nxt is not None and nxt.arrival_s is not None:
                    time.sleep(max(0.0, t0 + nxt.arrival_s - time.perf_counter()))
                continue
            gens = [g for g, _ in active.values()]
            events = eng.step(gens)
            now = time.perf_counter()
            for g, chunk in events:
                res = active[id(g)][1]
                if not res.token_times:
                    res.t_first = now
                res.token_times.append(now)
                if chunk.finish_reason:
                    res.t_end, res.finish_reason = now, chunk.finish_reason
                    res.completion_tokens = len(g.generated)
                    eng.release(g)
                    del active[id(g)]
                    results.append(res)
                    if on_result:
                        on_result(res)
        return sorted(results, key=lambda r: r.index), t0, time.perf_counter()


# ------------------------------------------------------------------------------------------------
class HttpClient:
    """Streams requests to an OpenAI-compatible server at ``url`` (``http://host:port``, with or
    without ``/v1``). ``endpoint`` is ``completions`` (raw prompt, exact length) or ``chat``."""

    label = "http"

    def __init__(self, url: str, *, model: str | None = None, api_key: str | None = None,
                 endpoint: str = "completions", timeout_s: float = 600.0) -> None:
        try:
            import httpx
        except ImportError:
            from localrun.errors import BackendUnavailableError

            raise BackendUnavailableError("bench --url needs httpx", hint="pip install httpx") from None

        if endpoint not in ("completions", "chat"):
            raise ConfigError(f"--endpoint must be completions or chat, got {endpoint!r}")
        base = url.rstrip("/")
        if not base.startswith(("http://", "https://")):
            base = "http://" + base
        self.base = base if base.endswith("/v1") else base + "/v1"
        self.endpoint = endpoint
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(timeout_s, connect=10.0)
        self.model = model or self._first_model()
        self.max_concurrency = 1 << 30

    def _first_model(self) -> str:
        import httpx

        try:
            r = httpx.get(self.base + "/models", headers=self.headers, timeout=10.0)
        except httpx.HTTPError as e:
            raise LocalrunError(f"cannot reach {self.base} ({e.__class__.__name__}: {e})",
                                hint="is the server running? start one with `localrun serve`") from None
        if r.status_code == 401:
            raise ConfigError(f"{self.base} wants an API key", hint="pass --api-key KEY")
        try:
            return r.json()["data"][0]["id"]
        except Exception:
            raise LocalrunError(f"{self.base}/models did not list a model (HTTP {r.status_code})",
                                hint="name the model with --model-name") from None

    def tokenize(self, text: str):  # the server tokenizes; prompts are sized in words
        return None

    def warmup(self, w: Workload) -> None:
        import asyncio

        import httpx

        async def one():
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                await self._one(client, Request(index=-1, text="Hello there, warm up."), 4, False)

        asyncio.run(one())

    def _body(self, req: Request, max_tokens: int, ignore_eos: bool) -> dict:
        body: dict = {"model": self.model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                      "stream_options": {"include_usage": True}}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": req.text}]
        else:
            body["prompt"] = req.text
        if ignore_eos:
            body["ignore_eos"] = True  # vLLM / llama-server extension; others ignore it
        return body

    async def _one(self, client, req: Request, max_tokens: int, ignore_eos: bool,
                   t_arrival: float | None = None) -> RequestResult:
        url = f"{self.base}/{'chat/completions' if self.endpoint == 'chat' else 'completions'}"
        return await stream_completion(client, url, self._body(req, max_tokens, ignore_eos),
                                       chat=self.endpoint == "chat", headers=self.headers, index=req.index,
                                       t_arrival=t_arrival)

    def run_level(self, requests: Iterable[Request], concurrency: int, w: Workload,
                  on_result: OnResult | None = None) -> tuple[list[RequestResult], float, float]:
        import asyncio

        return asyncio.run(self._run_level(requests, concurrency, w, on_result))

    async def _run_level(self, requests, concurrency, w, on_result):
        import asyncio

        import httpx

        limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
        results: list[RequestResult] = []
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits) as client:
            t0 = time.perf_counter()

            async def run(req: Request):
                t_arr = t0 + req.arrival_s if req.arrival_s is not None else None
                async with sem:
                    res = await self._one(client, req, w.max_tokens, w.ignore_eos, t_arr)
                results.append(res)
                if on_result:
                    on_result(res)

            tasks = []
            if w.rate_rps is None:  # closed loop: `concurrency` workers, each sends its next when done
                queue = iter(_due(requests, w, t0))

                async def worker():
                    for req in queue:
                        await run(req)

                tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
            else:
                for req in _due(requests, w, t0):
                    delay = t0 + req.arrival_s - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.create_task(run(req)))
            await asyncio.gather(*tasks)
        return sorted(results, key=lambda r: r.index), t0, time.perf_counter()


async def stream_completion(client, url: str, body: dict, *, chat: bool, headers: dict | None = None,
                            index: int = -1, t_arrival: float | None = None) -> RequestResult:
    """POST one streaming OpenAI request (``/chat/completions`` when ``chat``, else ``/completions``) with
    the ``httpx.AsyncClient`` ``client`` and time every content chunk (``token_times``, seconds of
    ``time.perf_counter``). ``completion_tokens`` is the server's ``usage`` when it sends one, else the
    chunk count. Never raises: an HTTP error, a reset or a timeout is ``ok=False`` with ``error`` set."""
    res = RequestResult(index=index)
    res.t_start = time.perf_counter()
    res.t_arrival = t_arrival if t_arrival is not None else res.t_start
    usage = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                res.ok, res.error = False, f"HTTP {r.status_code}: {text[:300]}"
                res.t_end = time.perf_counter()
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                try:
                    obj = json.loads(data)
                except ValueError:
                    continue
                if obj.get("error"):  # an error event mid-stream (both localrun and llama-server send one)
                    res.ok, res.error = False, str(obj["error"])[:300]
                if obj.get("usage"):
                    usage = obj["usage"]
                for ch in obj.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
                    if piece:
                        if not res.token_times:
                            res.t_first = now
                        res.token_times.append(now)
                    if ch.get("finish_reason"):
                        res.finish_reason = ch["finish_reason"]
    except Exception as e:  # connection reset, timeout: the request failed, the bench goes on
        res.ok, res.error = False, f"{e.__class__.__name__}: {e}"
        res.t_end = time.perf_counter()
        return res
    res.t_end = time.perf_counter()
    if not res.token_times:
        res.t_first = res.t_end
    if usage:
        res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        res.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            res.cached_tokens = int(details["cached_tokens"])
    else:
        res.completion_tokens = len(res.token_times)
    return res
