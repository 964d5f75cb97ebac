"""``create_app(engine, settings, options)``: the FastAPI app behind ``localrun serve``.

One app = one ``ModelRegistry`` (server/models.py: the resident models, each a ``ServerState`` with its
engine and scheduler thread) and one metrics registry; nothing is module-global, so tests run several apps
in one process. Schedulers and the keep-alive reaper start and stop with the app's lifespan; a request's
hold on its model (``LEASES`` in the ASGI scope) ends with its response, here in ``_Gate``.

Around every route:
* ``_Gate`` (pure ASGI): ``Authorization: Bearer <key>`` (or Anthropic's ``x-api-key: <key>``) when an API
  key is set (``/health`` stays open),
  one log line per request (method, path, status, seconds, tokens, TTFT; the prompt only with
  ``log_prompts``), and the ``localrun_requests_total`` counter;
* exception handlers: a ``LocalrunError`` → status by type (``errors.error_info``), a pydantic
  ``ValidationError`` → 400 naming the field and quoting the value, anything else → 500; the server keeps
  serving. Bodies take the shape of the path's wire format (``wings.error_response``): OpenAI's
  ``{"error": {...}}``, Ollama's ``{"error": "..."}`` under ``/api/``, or Anthropic's
  ``{"type": "error", "error": {...}}`` under ``/v1/messages`` (a full queue: 529 overloaded_error).

The routes are the wire formats' wings (``server/openai/``, ``server/ollama/``, ``server/anthropic/``), each
added by its ``register`` (``wings.register_all``: one line per wing in ``wings.WINGS``).

``GET /`` (and ``HEAD /``) answers ``Ollama is running`` as Ollama's root does, so clients that probe it
connect; a browser's (``Accept`` prefers text/html) goes to the web page, ``/ui`` (``server/web/``).
``serve_forever`` runs the app under uvicorn and, on SIGINT/SIGTERM, ends every running
generation at once (``ServerState.shutdown``) so the process exits within about a second.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from contextlib import asynccontextmanager

from localrun.backends.base import Engine
from localrun.errors import LocalrunError
from localrun.server.errors import QueueFullError, error_body, error_info
from localrun.server.metrics import ServerMetrics
from localrun.server.models import LEASES, ModelRegistry
from localrun.server.runtime import ClientGone, ServeOptions
from localrun.server.wings import endpoints, error_response, register_all

log = logging.getLogger("localrun.server")

_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "literal", "function-after", "function-before"}
_OPEN_PATHS = {"/", "/health", "/ui", "/ui/"}  # answered without the API key (probes; the web page, which asks for it)
_OPEN_PREFIXES = ("/ui/static/",)  # the web page's script and style files
_CORE_PATHS = frozenset({"/", "/health", "/metrics"})  # counted by name, with each wing's ENDPOINTS


def create_app(engine: Engine | None, settings, options: ServeOptions | None = None, *, embedder_factory=None,
               registry: ModelRegistry | None = None):
    """Build the app. ``registry`` (``server.models.ModelRegistry``) holds the models and loads others on
    demand; without one, the app serves ``engine`` alone (any ``model`` name answers with it). A given
    ``engine`` is served as it is (the caller closes it); the scheduler drives it as a ``BatchEngine``
    (``backends.as_batch_engine``: llama.cpp's as it is, MLX's one request at a time).
    ``app.state.models`` is the registry; ``app.state.localrun`` the default model's ``ServerState`` (None
    when the server started with no model). ``embedder_factory(engine)`` makes the ``/v1/embeddings``
    context on first use (default: ``LlamaCppEmbedder`` for llama.cpp engines)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, Response

    options = options or ServeOptions(api_key=settings.api_key)
    if registry is None:
        registry = ModelRegistry(settings, options, ServerMetrics(), embedder_factory=embedder_factory)
    reg = registry
    if engine is not None:
        reg.adopt(engine, plan=options.plan, hardware=options.hardware, model_id=options.model_id or None,
                  owned=False, pinned=True)
    metrics = reg.metrics

    @asynccontextmanager
    async def lifespan(app):
        import asyncio

        reg.start()
        reaper = asyncio.ensure_future(reg.reap())
        try:
            yield
        finally:
            reaper.cancel()
            if not reg.close():
                log.warning("a scheduler is still inside llama_decode; its engine is left open")

    app = FastAPI(title="localrun", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.models = reg
    app.state.localrun = reg.default_state

    def _err(request, status: int, body: dict, headers: dict | None = None, *, overloaded: bool = False):
        # the per-request log line names the error's code (context_length_exceeded, invalid_value, ...)
        err = body.get("error")
        request.scope.setdefault("state", {}).setdefault("localrun", {})["error"] = (
            err.get("code") if isinstance(err, dict) else None) or status
        status, body = error_response(request.url.path, status, body, overloaded=overloaded)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(LocalrunError)
    async def _localrun_error(request: Request, exc: LocalrunError):
        status, body = error_info(exc)
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, QueueFullError) else None
        return _err(request, status, body, headers, overloaded=isinstance(exc, QueueFullError))

    @app.exception_handler(ValidationError)
    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc):
        first = exc.errors()[0] if exc.errors() else {}
        # pydantic names union branches in the location ("content.str", "stop.list[str]"): keep field names
        loc = ".".join(str(x) for x in first.get("loc", ())
                       if x != "body" and not (isinstance(x, str) and (x in _TYPE_TAGS or "[" in x or "(" in x)))
        msg = f"{loc or 'body'}: {first.get('msg', 'invalid value')}{_quoted_input(first)}"
        return _err(request, 400, error_body(msg, param=loc or None, code="invalid_value"))

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        return _err(request, exc.status_code, error_body(str(exc.detail), code="not_found" if exc.status_code == 404
                                                         else None), getattr(exc, "headers", None))

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone):
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return _err(request, 500, error_body(f"internal error: {type(exc).__name__}: {exc}", etype="server_error"))

    async def root(request) -> Response:
        """Ollama's root answer: clients (Open WebUI, ollama-python) probe it to see a server is up. A browser
        (``Accept`` prefers text/html) is sent to the web page, ``/ui`` (docs/serve.md "Web page")."""
        if _prefers_html(request.headers.get("accept", "")):
            from starlette.responses import RedirectResponse

            return RedirectResponse("/ui", status_code=303, headers={"Vary": "Accept"})
        return Response("Ollama is running", media_type="text/plain", headers={"Vary": "Accept"})

    app.router.add_route("/", root, methods=["GET", "HEAD"])  # a plain Starlette route: it reads Accept

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict:
        """Up; the default model (null: none loaded), the resident models, sequences running and waiting."""
        states = [r.state for r in reg.residents.values()]
        st = reg.default_state
        return {"status": "ok", "model": st.model_id if st is not None else None,
                "models": [s.model_id for s in states],
                "active_sequences": sum(s.scheduler.n_running for s in states),
                "queued": sum(s.scheduler.n_waiting for s in states),
                "n_parallel": st.engine.n_parallel if st is not None else 0}

    @app.get("/metrics")
    async def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    register_all(app, reg)  # every wire format's routes (server/wings.py WINGS)

    if options.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(options.cors_origins), allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(_Gate, registry=reg)
    return app


def _prefers_html(accept: str) -> bool:
    """Whether an ``Accept`` header asks for ``text/html`` (a browser's page load does; ``*/*``, curl's and the
    API clients', does not), without refusing it (``;q=0``)."""
    for part in accept.lower().split(","):
        kind, _, params = part.partition(";")
        if kind.strip() == "text/html":
            return params.replace(" ", "") not in ("q=0", "q=0.0")
    return False


def _quoted_input(err: dict) -> str:
    """`` (got 'wizard')`` for a validation error on a short scalar value; empty for objects and long text."""
    if "input" not in err or isinstance(err["input"], (dict, list)):
        return ""
    import json

    try:  # as the client wrote it: JSON's true / null / "text", not Python's True / None / 'text'
        text = json.dumps(err["input"], ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(err["input"])
    return f" (got {text})" if len(text) <= 80 else f" (got {text[:77]}...)"


def serve_forever(app, host: str, port: int, *, log_level: str = "info", grace_s: float = 1.0) -> None:
    """Run ``app`` (from ``create_app``) under uvicorn until SIGINT (returns) or SIGTERM (uvicorn re-raises
    it after the shutdown: the process ends by that signal).

    uvicorn's graceful shutdown waits for open responses, and a streaming generation may run for minutes;
    so the signal first ends every running and queued generation (ShuttingDownError: an error event in a
    stream, a 503 otherwise) and stops the scheduler between two ``llama_decode`` calls (a prefill one is
    cut short between graph nodes by ``engine.interrupt``). Responses still open after ``grace_s`` seconds
    are cancelled (uvicorn's ``timeout_graceful_shutdown``), and the app waits at most ``grace_s`` for
    the schedulers: afterwards ``app.state.models.idle`` says whether the engines may be closed."""
    import uvicorn

    reg = app.state.models
    reg.close_wait_s = grace_s

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            reg.shutdown()

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=grace_s)
    try:
        _Server(config).run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled; like uvicorn.run, end normally
        pass


class _Gate:
    """Pure-ASGI middleware: API-key check, per-request log line, request counter."""

    def __init__(self, app, registry: ModelRegistry) -> None:
        self.app = app
        self.reg = registry
        self.known_paths = _CORE_PATHS | endpoints()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope.get("path", ""), scope.get("method", "")
        key = self.reg.options.api_key
        if (key and path not in _OPEN_PATHS and not path.startswith(_OPEN_PREFIXES) and method != "OPTIONS"
                and not _authorized(scope, key)):
            await _send_json(send, 401, _unauthorized_body(path),
                             [(b"www-authenticate", b'Bearer realm="localrun"')])
            return self._log(scope, method, path, 401, 0.0)
        t0 = time.perf_counter()
        status = {"code": 500, "logged": False}

        leases: list = []
        scope[LEASES] = leases

        async def send_wrapper(msg):
            if msg["type"] == "http.response.start":
                status["code"] = msg["status"]
                if leases:
                    msg = dict(msg, headers=list(msg.get("headers", [])) + _model_headers(leases[-1].resident))
            if msg["type"] == "http.response.body" and not msg.get("more_body", False):
                # counted before the last bytes go out: a client that reads /metrics next sees its request
                status["logged"] = True
                self._log(scope, method, path, status["code"], time.perf_counter() - t0)
            await send(msg)

        try:
            await self.app(scope, receive, send_wrapper)
        except OSError:  # the client went away mid-response
            pass
        finally:
            self.reg.release(leases)
        if not status["logged"]:  # a stream the client left before its end: nginx's 499
            self._log(scope, method, path, 499, time.perf_counter() - t0)

    def _log(self, scope, method: str, path: str, status: int, dt_s: float) -> None:
        endpoint = path if path in self.known_paths else "other"
        leases = scope.get(LEASES) or []
        model = leases[-1].resident.model_id if leases else ""
        self.reg.metrics.requests.labels(endpoint, str(status), model).inc()
        info = (scope.get("state") or {}).get("localrun") or {}
        client = scope.get("client") or ("-", 0)
        extra = " ".join(f"{k}={v!r}" if k == "prompt" else f"{k}={v}" for k, v in info.items())
        log.info("%s %s %s %d %.3fs %s", client[0], method, path, status, dt_s, extra)


def _model_headers(r) -> list[tuple[bytes, bytes]]:
    """``X-Localrun-Model``: the model that answered; when it was loaded with less than asked (a shorter
    context, fewer GPU layers, a quantized KV cache) also ``X-Localrun-Asked`` / ``X-Localrun-Given``
    (``key=value`` pairs) and ``X-Localrun-Given-Reason`` (the planner's reasons)."""
    out = [(b"x-localrun-model", r.model_id.encode("utf-8", "replace"))]
    ag = r.asked_given()
    if ag:
        def pairs(d: dict) -> bytes:
            return " ".join(f"{k}={v}" for k, v in d.items()).encode("latin-1", "replace")

        why = "; ".join(ag["reasons"][:4]).encode("latin-1", "replace")
        out += [(b"x-localrun-asked", pairs(ag["asked"])), (b"x-localrun-given", pairs(ag["given"])),
                (b"x-localrun-given-reason", why)]
    return out


def _authorized(scope, key: str) -> bool:
    """``Authorization: Bearer <key>`` (OpenAI, Ollama) or ``x-api-key: <key>`` (Anthropic) matches ``key``."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            v = value.decode("latin-1")
            if v.lower().startswith("bearer ") and hmac.compare_digest(v[7:].strip().encode(), key.encode()):
                return True
        elif name == b"x-api-key" and hmac.compare_digest(value.strip(), key.encode()):
            return True
    return False


def _unauthorized_body(path: str) -> dict:
    msg = "missing or wrong API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
    return error_response(path, 401, error_body(msg, code="invalid_api_key"))[1]


async def _send_json(send, status: int, body: dict, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
                + (headers or [])})
    await send({"type": "http.response.body", "body": data})


def _version() -> str:
    from localrun import __version__

    return __version__
