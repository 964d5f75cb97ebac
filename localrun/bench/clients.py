"""The two ways bench drives a model, both timing every generated token.

* ``EngineClient`` — in-process: submits each request as a ``Job`` to the server's own ``Scheduler``
  (``server/scheduler.py``) running on the loaded engine, up to ``engine.n_parallel`` sequences decoded
  together: what ``localrun serve`` runs, with no HTTP in between. The scheduler hands over one chunk
  per sampled token, timed as it arrives (as a server's client would see it, without the network).
* ``HttpClient`` — any OpenAI-compatible server (``localrun serve``, llama-server, Ollama, vLLM):
  streaming ``/v1/completions`` (or ``/v1/chat/completions``) over SSE with httpx; one chunk is taken
  as one token (true for llama.cpp, Ollama and vLLM streams), and ``usage`` (``stream_options.include_usage``)
  supplies the exact token counts and cached prompt tokens when the server reports them.

Both send a level's requests with ``drive_level`` (closed loop or Poisson arrivals) and return
``RequestResult``s; times are ``time.perf_counter()`` seconds.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable, Iterable

from localrun.bench.workload import Request, Workload
from localrun.errors import ConfigError, LocalrunError

if TYPE_CHECKING:
    from localrun.backends.base import Engine


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


async def drive_level(requests: Iterable[Request], concurrency: int, w: Workload,
                      one: Callable[[Request, float | None], Awaitable[RequestResult]],
                      on_result: OnResult | None = None) -> tuple[list[RequestResult], float, float]:
    """Send one level's ``requests`` through ``one(request, t_arrival)`` with at most ``concurrency`` in
    flight → (results sorted by index, level start, level end), perf_counter seconds.

    Closed loop (``w.rate_rps`` None): ``concurrency`` workers, each sends its next request when the last
    one ended. Poisson: each request is due at ``level start + arrival_s`` (its ``t_arrival``, so the wait
    for a free place counts as queueing). Requests stop once ``w.duration_s`` has passed."""
    import asyncio

    results: list[RequestResult] = []
    sem = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()

    async def run(req: Request):
        t_arr = t0 + req.arrival_s if req.arrival_s is not None else None
        async with sem:
            res = await one(req, t_arr)
        results.append(res)
        if on_result:
            on_result(res)

    tasks = []
    if w.rate_rps is None:
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


# ------------------------------------------------------------------------------------------------
class EngineClient:
    """In-process bench on a loaded engine, through the server's own ``Scheduler``
    (``server/scheduler.py``: admission, prefix-cache slot choice, one ``step`` for all running
    sequences, release) on its thread, so bench measures what ``serve`` runs, minus HTTP. A one-at-a-time
    engine (MLX) runs as ``serve`` runs it (``backends.as_batch_engine``).

    ``run_level`` starts a scheduler for the level and stops it at the end; call it from one thread.
    """

    label = "in-process"

    def __init__(self, engine: Engine) -> None:
        from localrun.backends import as_batch_engine

        self.engine = as_batch_engine(engine)
        self.max_concurrency = self.engine.n_parallel
        self._eog = [t for t in range(self.engine.n_vocab) if self.engine.is_eog(t)]

    def tokenize(self, text: str) -> list[int]:
        return self.engine.tokenize(text, add_special=False)

    def params(self, w: Workload):
        from localrun.backends.base import SamplingParams

        bias = {t: float("-inf") for t in self._eog} if w.ignore_eos else {}
        return SamplingParams(temperature=0.0, max_tokens=w.max_tokens, logit_bias=bias)

    def warmup(self, w: Workload) -> None:
        """One short request (not measured) so the first level does not pay for page faults."""
        from localrun.backends.base import SamplingParams

        warm = Request(index=-1, text="", tokens=self.tokenize("Hello there, warm up."))
        params = SamplingParams(temperature=0.0, max_tokens=4)
        res = self._with_scheduler(lambda sched: self._one(sched, warm, params, None))
        if not res.ok:
            raise LocalrunError(f"the warm-up request failed: {res.error}")

    def run_level(self, requests: Iterable[Request], concurrency: int, w: Workload,
                  on_result: OnResult | None = None) -> tuple[list[RequestResult], float, float]:
        """Run one level; returns (results, level start, level end) in perf_counter seconds."""
        if concurrency > self.max_concurrency:
            raise ConfigError(f"concurrency {concurrency} is more than the {self.max_concurrency} sequences loaded")
        params = self.params(w)
        return self._with_scheduler(lambda sched: drive_level(
            requests, concurrency, w, lambda req, t_arr: self._one(sched, req, params, t_arr), on_result))

    def _with_scheduler(self, body):
        """``asyncio.run(body(scheduler))`` with a ``Scheduler`` running on the engine meanwhile."""
        import asyncio

        from localrun.server.metrics import ServerMetrics
        from localrun.server.scheduler import Scheduler

        eng = self.engine
        sched = Scheduler(eng, ServerMetrics().for_model("bench", eng.n_parallel, eng.n_ctx * eng.n_parallel))
        sched.start()
        try:
            return asyncio.run(body(sched))
        finally:
            sched.stop()

    async def _one(self, sched, req: Request, params, t_arrival: float | None) -> RequestResult:
        """Submit ``req`` as a scheduler ``Job`` and time its chunks as they arrive (one per token)."""
        import asyncio

        from localrun.server.scheduler import Job

        res = RequestResult(index=req.index, prompt_tokens=len(req.tokens))
        res.t_arrival = t_arrival if t_arrival is not None else time.perf_counter()
        job = Job(loop=asyncio.get_running_loop(), queue=asyncio.Queue(), tokens=list(req.tokens), params=params)
        try:
            sched.submit(job)
        except LocalrunError as e:
            res.ok, res.error, res.t_end = False, e.message, time.perf_counter()
            return res
        while True:
            kind, val = await job.queue.get()
            now = time.perf_counter()
            if kind == "admitted":
                res.t_start, res.cached_tokens = job.gen.t_start, val
            elif kind == "error":
                res.ok, res.error, res.t_end = False, val.message, now  # a LocalrunError
                return res
            elif kind == "chunk":
                if not res.token_times:
                    res.t_first = now
                res.token_times.append(now)
                if val.finish_reason is not None:
                    res.t_end, res.finish_reason = now, val.finish_reason
                    res.completion_tokens = val.stats.completion_tokens if val.stats else len(res.token_times)
                    return res


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
        import httpx

        limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits) as client:
            return await drive_level(requests, concurrency, w,
                                     lambda req, t_arr: self._one(client, req, w.max_tokens, w.ignore_eos, t_arr),
                                     on_result)


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
