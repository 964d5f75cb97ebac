"""Per-app server state and the request plumbing shared by the OpenAI and Ollama routes.

``ServerState`` is created by ``create_app`` (one per app; nothing module-global). Its helpers turn a
request into engine tokens, submit a ``Job`` to the scheduler, wait for admission, stream ``Chunk``s, and
cancel the job when the client goes away (``http.disconnect`` or a failed send).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import StreamingResponse

from localrun.backends.base import BatchEngine, Chunk, Message, SamplingParams, Stats
from localrun.backends.text import LogprobRelease
from localrun.errors import ContextOverflowError
from localrun.server.body import BodyReader
from localrun.server.errors import RequestError
from localrun.server.scheduler import Job, Scheduler

MiB = 1024 * 1024

log = logging.getLogger("localrun.server")


class ClientGone(Exception):
    """The client disconnected before its answer was ready (nobody reads the response)."""


@dataclass
class ServeOptions:
    """What ``localrun serve`` adds to ``Settings``. ``max_body_bytes`` bounds a request body (413 past it)."""

    model_id: str = ""
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    log_prompts: bool = False
    max_queue: int = 64
    max_body_bytes: int = 8 * MiB
    # message text is tokenised as text; True lets control-token text in it become control tokens (unsafe)
    parse_special_in_content: bool = False
    # raw prompts (/v1/completions, /api/generate raw) are the client's own format: markers become tokens
    parse_special_in_prompt: bool = True
    stop_loops: bool = False  # end looping generations (finish "loop" → "stop") unless a request says otherwise
    reasoning_budget: int | None = None  # tokens of thinking before the engine closes the block; None: no limit
    # tools on a template without tool syntax use the generic format (reply.py); False: refused (--no-generic-tools)
    generic_tools: bool = True
    n_predict: int | None = None  # the most tokens any answer generates (serve --n-predict); None: no cap
    plan: Any = None  # the Plan the engine was loaded with (shown by /api/ps)
    hardware: dict | None = None
    responses_db: Any = None  # the Responses API's SQLite file (None: <home>/responses.db)
    allow_image_urls: bool = False  # fetch http(s) image URLs (server/images.py); off: data URLs and base64 only


class ServerState:
    """Everything one app instance holds: engine, scheduler, metrics, options, model facts."""

    def __init__(self, engine: BatchEngine, settings, options: ServeOptions, metrics, embedder_factory=None, *,
                 reader: BodyReader | None = None) -> None:
        self.engine = engine
        self.reader = reader or BodyReader(options)
        self.settings = settings
        self.options = options
        self.metrics = metrics
        self.scheduler = Scheduler(engine, metrics, max_queue=options.max_queue)
        # the GGUF header, or (an MLX folder has none) what its config.json says
        self.spec = engine.spec
        if self.spec is None:
            from localrun.server.facts import folder_facts

            self.spec = folder_facts(engine.model_path)
        self.model_id = options.model_id or os.path.basename(engine.model_path).removesuffix(".gguf")
        self.started_s = time.time()
        self._embedder_factory = embedder_factory
        self._embedder = None
        self.close_wait_s = 10.0  # how long close() waits for a llama_decode in progress (serve: ~1 s)

    def serves(self, name: str) -> bool:
        """Whether ``name`` names the loaded model: its id, Ollama's ``id:latest``, or the file's name.
        (Generation requests accept any ``model``: the server holds one model and answers with it.)"""
        base = os.path.basename(self.engine.model_path.rstrip("/"))
        return name in (self.model_id, f"{self.model_id}:latest", base, base.removesuffix(".gguf"))

    # ------------------------------------------------------------------ requests → tokens
    async def read_json(self, request: Request, *, lenient_type: bool = False) -> Any:
        return await self.reader.read_json(request, lenient_type=lenient_type)

    async def parse(self, request: Request, model, *, lenient_type: bool = False):
        return await self.reader.parse(request, model, lenient_type=lenient_type)

    async def chat_tokens(self, messages: list[Message], tools: list[dict] | None = None) -> tuple[str, list[int]]:
        """Render with the chat template and tokenize (in a worker thread): only the template's markers
        become control tokens, message text stays text (unless ``--parse-special-in-content``). Raises
        ChatTemplateError, ContextOverflowError."""
        eng = self.engine

        def work():
            return eng.tokenize_chat(messages, tools=tools,
                                     parse_special_in_content=self.options.parse_special_in_content)

        text, tokens = await run_in_threadpool(work)
        self.check_fits(tokens)
        return text, tokens

    def check_token_ids(self, ids: list[int], param: str) -> list[int]:
        """``ids`` if every one is in the vocabulary, else RequestError naming ``param``."""
        n = self.engine.n_vocab
        images = getattr(self.engine, "projector", None) is not None  # an image's ids (< 0): the engine checks them
        bad = [t for t in ids if not 0 <= t < n and not (images and t < 0)]
        if bad:
            raise RequestError(f"token id {bad[0]} is outside the vocabulary (0..{n - 1})", param=param)
        return list(ids)

    async def text_tokens(self, prompt, param: str = "prompt", *, raw: bool = True) -> list[int]:
        """A prompt (text or token ids) → tokens. A ``raw`` text prompt is the client's own format: its
        control-token text (``<|im_end|>``) becomes control tokens, as in llama-server (off with
        ``--no-parse-special-in-prompt``); ``raw=False`` (text that a template would have wrapped) is
        always plain text. Raises RequestError on bad ids, ContextOverflowError."""
        eng = self.engine
        if isinstance(prompt, list):
            tokens = self.check_token_ids(prompt, param)
        else:
            special = raw and self.options.parse_special_in_prompt
            tokens = await run_in_threadpool(eng.tokenize, prompt, add_special=True, parse_special=special)
        self.check_fits(tokens, param)
        return tokens

    def check_fits(self, tokens: list[int], param: str = "messages") -> None:
        """ContextOverflowError (OpenAI's ``context_length_exceeded`` on ``param``) when ``tokens`` leave
        no room to generate in one sequence's context."""
        if len(tokens) >= self.engine.n_ctx:
            raise ContextOverflowError(len(tokens), self.engine.n_ctx, param=param,
                                       hint="shorten the prompt; the server's context per sequence is fixed "
                                       "at start (--ctx)")

    def check_params(self, p: SamplingParams) -> None:
        """Resolve ``repeat_last_n = -1`` to the context size (llama.cpp's common/arg.cpp and Ollama: -1 =
        the whole context; llama_sampler_init_penalties would read it as 0, penalty off); RequestError for a
        ``logit_bias`` token outside the vocabulary."""
        if p.repeat_last_n < 0:
            p.repeat_last_n = self.engine.n_ctx
        bad = [t for t in p.logit_bias if not 0 <= t < self.engine.n_vocab]
        if bad:
            raise RequestError(f"logit_bias token id {bad[0]} is outside the vocabulary", param="logit_bias")

    # ------------------------------------------------------------------ jobs
    async def start(self, request: Request, tokens: list[int], params: SamplingParams) -> Job:
        """Submit a generation and wait until it holds a slot. Raises QueueFullError, the engine's
        LocalrunErrors (context overflow, bad grammar), ClientGone. ``serve --n-predict`` caps
        ``params.max_tokens`` here, for every route."""
        cap = self.options.n_predict
        if cap and (params.max_tokens is None or params.max_tokens > cap):
            params.max_tokens = cap
        self.check_params(params)
        if log.isEnabledFor(logging.DEBUG):
            client = request.client.host if request.client else "-"
            log.debug("%s %s: %d prompt tokens, sampling %s", client, request.url.path, len(tokens),
                      _describe(params))
        job = Job(loop=asyncio.get_running_loop(), queue=asyncio.Queue(), tokens=tokens, params=params)
        self.scheduler.submit(job)
        kind, val = await self._next(request, job)
        if kind == "error":
            raise val
        return job

    async def call(self, request: Request, fn: Callable[[Any], Any]):
        """Run ``fn(engine)`` on the scheduler thread between decode steps; returns its result."""
        job = Job(loop=asyncio.get_running_loop(), queue=asyncio.Queue(), fn=fn)
        self.scheduler.submit(job)
        kind, val = await self._next(request, job)
        if kind == "error":
            raise val
        return val

    async def _next(self, request: Request, job: Job):
        """The job's next event, cancelling the job if the client disconnects meanwhile."""
        getter = asyncio.ensure_future(job.queue.get())
        watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
        try:
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self.scheduler.cancel(job)
            raise
        finally:
            watcher.cancel()
            if not getter.done():
                getter.cancel()
        if getter in done:
            return getter.result()
        self.scheduler.cancel(job)
        raise ClientGone()

    async def chunks(self, job: Job, request: Request | None = None) -> AsyncIterator[Chunk]:
        """The job's chunks up to the one with ``finish_reason``; cancels the job if abandoned. Each chunk's
        ``logprobs`` are those of the tokens whose text it shows (``backends.text.LogprobRelease``: text a
        stop string held back brings its tokens' entries along; a matched stop string's tokens have none)."""
        release = LogprobRelease()
        # one watcher for the whole reply (a client that disconnects ends it with ClientGone on the queue), not
        # one per token: a task that awaits the ASGI receive, started and cancelled for every token, cost the
        # event loop more than the token itself
        watcher = (asyncio.ensure_future(_watch_disconnect(request.receive, self.scheduler, job))
                   if request is not None else None)
        try:
            while True:
                kind, val = await job.queue.get()
                if kind == "error":
                    raise val
                val.logprobs = release.push(val.text, val.logprobs, final=val.finish_reason is not None) or None
                yield val
                if val.finish_reason is not None:
                    return
        finally:
            if watcher is not None:
                watcher.cancel()
            if not job.finished:
                self.scheduler.cancel(job)

    async def collect(self, request: Request, job: Job) -> tuple[str, Chunk, list]:
        """Run ``job`` to the end (non-streaming) → (text, last chunk, logprobs)."""
        parts, lps, last = [], [], None
        async for c in self.chunks(job, request):
            parts.append(c.text)
            if c.logprobs:
                lps.extend(c.logprobs)
            last = c
        return "".join(parts), last, lps

    def stream(self, job: Job, body: AsyncIterator[str], media_type: str) -> StreamingResponse:
        return _JobStream(body, job=job, scheduler=self.scheduler, media_type=media_type,
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def note(self, request: Request, stats: Stats | None, finish: str | None, prompt: str | None = None) -> None:
        """Record what the per-request log line reports (see app.py's access-log middleware)."""
        info = request.scope.setdefault("state", {}).setdefault("localrun", {})
        s = stats or Stats()
        info.update(prompt_tokens=s.prompt_tokens, cached_tokens=s.cached_tokens,
                    completion_tokens=s.completion_tokens, ttft_s=round(s.ttft_s, 4), finish=finish)
        if prompt is not None and self.options.log_prompts:
            info["prompt"] = prompt

    # ------------------------------------------------------------------ embeddings
    async def embed(self, request: Request, inputs: list, param: str, *, truncate: bool = False
                    ) -> tuple[list[list[float]], int]:
        """Pooled, L2-normalised embeddings of ``inputs`` (texts or token-id lists), computed on the
        scheduler thread between decode steps → (vectors, prompt tokens). ``truncate`` cuts an input to
        the context (Ollama's default) instead of raising ContextOverflowError. Raises RequestError."""
        if not inputs:
            raise RequestError(f"'{param}' must not be empty", param=param)
        if len(inputs) > 256:
            raise RequestError("at most 256 inputs per request", param=param)
        for i, x in enumerate(inputs):  # as OpenAI: an empty input is a 400, not the BOS token's vector
            if isinstance(x, (str, list)) and not x:
                where = f"{param}[{i}]" if len(inputs) > 1 else param
                raise RequestError(f"'{where}' is empty: there is nothing to embed (send at least one character "
                                   "or token)", param=where)
        token_lists = []
        for x in inputs:
            if truncate and isinstance(x, str):
                toks = await run_in_threadpool(self.engine.tokenize, x, add_special=True, parse_special=False)
                token_lists.append(toks[: self.engine.n_ctx - 1])
            else:
                token_lists.append(await self.text_tokens(x, param))

        def run(engine):
            emb = self.embedder(engine)
            return [emb.embed(t) for t in token_lists]

        return await self.call(request, run), sum(len(t) for t in token_lists)

    def embedder(self, engine):
        """The embedding context, created on first use (on the scheduler thread)."""
        if self._embedder is None:
            if self._embedder_factory is None:
                raise RequestError("this server has no embedding model", code="unsupported", status=501)
            self._embedder = self._embedder_factory(engine)
        return self._embedder

    def shutdown(self) -> None:
        """SIGINT/SIGTERM: end every running and queued request now (ShuttingDownError, 503) and stop the
        scheduler after the ``llama_decode`` in progress. Safe to call from a signal handler."""
        self.scheduler.shutdown()

    def close(self) -> bool:
        """Stop the scheduler (waiting up to ``close_wait_s`` for a ``llama_decode`` in progress) and free
        the embedding context. → True when the engine is idle and may be closed."""
        idle = self.scheduler.stop(self.close_wait_s)
        if idle and self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        return idle


class _JobStream(StreamingResponse):
    """A streaming response that cancels its job when the client disconnects or the send fails."""

    def __init__(self, content, *, job: Job, scheduler: Scheduler, **kw) -> None:
        super().__init__(content, **kw)
        self._job = job
        self._scheduler = scheduler

    async def __call__(self, scope, receive, send) -> None:
        job, sched = self._job, self._scheduler

        watcher = asyncio.ensure_future(_watch_disconnect(receive, sched, job))
        try:
            await super().__call__(scope, receive, send)
        except (OSError, ClientGone):
            pass
        finally:
            watcher.cancel()
            if not job.finished:
                sched.cancel(job)
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    pass


async def _wait_disconnect(receive) -> None:
    while True:
        msg = await receive()
        if msg.get("type") == "http.disconnect":
            return


async def _watch_disconnect(receive, scheduler: Scheduler, job: Job) -> None:
    """When the client disconnects: cancel ``job`` and end its reader with ``ClientGone`` (on its queue)."""
    await _wait_disconnect(receive)
    scheduler.cancel(job)
    job.queue.put_nowait(("error", ClientGone()))




def _describe(p: SamplingParams) -> str:
    """The sampling parameters a generation runs with, for the debug log (prompt text left out)."""
    fields = ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "repeat_penalty", "repeat_last_n",
              "presence_penalty", "frequency_penalty", "ignore_eos", "logprobs")
    parts = [f"{f}={getattr(p, f)}" for f in fields]
    if p.stop:
        parts.append(f"stop={list(p.stop)!r}")
    if p.logit_bias:
        parts.append(f"logit_bias={len(p.logit_bias)} tokens")
    if p.grammar:
        parts.append("grammar=yes")
    return " ".join(parts)
