"""`serve --rpc`: the engine runs in a runner subprocess; this process is a thin front that relays to it.

Why a subprocess: llama.cpp's RPC client aborts the whole process when a worker goes away mid-call
(ggml/src/ggml-rpc/ggml-rpc.cpp ``RPC_STATUS_ASSERT`` → ``GGML_ABORT`` → ``abort()``; no callback can stop
it). Ollama runs each model in a runner subprocess for the same kind of reason. Here the runner is an
ordinary ``localrun serve`` on a loopback port (the caller gives its command line); the front relays every
request to it byte for byte (httpx), so batching, prefix caching, metrics and the three wire formats are
the runner's, unchanged. When the runner dies:

- a request waiting for its answer gets a 503 (in the error shape of its API);
- a stream already started ends with an error event in its format (OpenAI ``data: {"error": …}``, Ollama
  ``{"error": "…"}``, Anthropic ``event: error``): its status line was sent already;
- ``/health`` answers 503 ``{"status": "unhealthy", …}``, and every new request a 503 with Retry-After;
- the supervisor starts a new runner once every worker accepts a TCP connection again.

A worker's death is also seen while the runner idles: its sockets to the worker then sit in CLOSE_WAIT
(the kernel got the worker's FIN, ``psutil``), and the supervisor restarts the runner at once, so the next
request does not abort it. It never opens an RPC connection itself: a worker serves one client at a time
(listen backlog 1), so a probe while the runner is connected would queue behind it; it only connects
(TCP) while no runner runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from typing import Callable

log = logging.getLogger("localrun.runner")

POLL_S = 0.5  # how often the supervisor looks at the runner and the workers
READY_TIMEOUT_S = 600.0  # a runner that loads its models longer than this is killed and retried
RETRY_AFTER_S = 5
# request headers that belong to one connection, not to the request (RFC 9110 §7.6.1), and those httpx sets
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "content-length"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_address(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def reachable(endpoint: str, timeout_s: float = 1.0) -> bool:
    """Whether ``host:port`` accepts a TCP connection (closed at once: no RPC is spoken)."""
    try:
        socket.create_connection(worker_address(endpoint), timeout=timeout_s).close()
        return True
    except OSError:
        return False


class Supervisor:
    """Starts the runner (``argv_for(port)`` on a free loopback port), watches it, restarts it.

    ``state``: ``starting`` | ``up`` | ``down`` (the runner died or a worker went away) | ``failed`` (it
    exited before its first ready: the user's error, printed by the runner itself) | ``stopped``.
    ``reason``: one line on why it is not up. ``workers``: the RPC endpoints the runner uses."""

    def __init__(self, argv_for: Callable[[int], list[str]], workers: list[str], *, env: dict | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.argv_for, self.workers = argv_for, list(workers)
        self.env = {**os.environ, "GGML_NO_BACKTRACE": "1", **(env or {})}  # an abort prints no gdb backtrace
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.state, self.reason = "starting", "loading the model"
        self.restarts = 0
        self.ever_up = False

    # -- the process ------------------------------------------------------------------------------------
    def spawn(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(self.argv_for(self.port), env=self.env, stdin=subprocess.DEVNULL)
        self.state, self.started_at = "starting", time.monotonic()

    def runner_ready(self) -> bool:
        """Whether the runner answers its /health with 200 (its models are loaded: serve preloads first)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"GET /health HTTP/1.0\r\nHost: runner\r\n\r\n")
                return s.recv(16).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def lost_workers(self) -> list[str]:
        """Workers whose connection from the runner the worker's side has closed (CLOSE_WAIT), or that the
        runner is not connected to although it is up. Empty when it cannot tell (psutil refuses)."""
        import psutil

        try:
            conns = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        except (psutil.Error, AttributeError):
            return []
        lost = []
        for ep in self.workers:
            host, port = worker_address(ep)
            mine = [c for c in conns if c.raddr and c.raddr.port == port]
            if any(c.status == psutil.CONN_CLOSE_WAIT for c in mine):
                lost.append(ep)
        return lost

    def kill(self, *, graceful: bool = False) -> None:
        """End the runner. ``graceful`` (SIGTERM, then SIGKILL after 5 s) only when the front itself stops:
        the runner then ends its requests with ``shutting_down``. A runner whose worker is gone gets SIGKILL
        at once: a graceful exit would answer its in-flight requests "the server is shutting down" (a 503 the
        front relays as is) instead of the front's ``rpc_worker_lost``, and it has nothing left to save (any
        llama.cpp call would abort on the lost worker)."""
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            if graceful:
                p.terminate()
                try:
                    p.wait(5)
                    return
                except subprocess.TimeoutExpired:
                    pass
            p.kill()
            p.wait()

    def mark_down(self, reason: str) -> None:
        if self.state != "down":
            log.error("RPC runner down: %s", reason)
        self.state, self.reason = "down", reason

    # -- one look ---------------------------------------------------------------------------------------
    def step(self) -> None:
        """One round of the watch (called every ``POLL_S`` from the front's event loop, in a thread)."""
        if self.state == "stopped":
            return
        rc = self.proc.poll() if self.proc is not None else None
        if self.state in ("starting", "up") and self.proc is not None and rc is not None:
            if not self.ever_up:
                self.state, self.reason = "failed", f"the runner exited with status {rc} before it was ready"
                return
            self.proc = None
            self.mark_down(f"the engine's runner exited (status {rc}): an RPC worker went away or failed")
            return
        if self.state == "starting":
            if self.runner_ready():
                self.state, self.reason, self.ever_up = "up", "", True
                log.info("RPC runner up on 127.0.0.1:%d (pid %d)", self.port, self.proc.pid)
            elif time.monotonic() - self.started_at > self.ready_timeout_s:
                self.kill()
                self.mark_down(f"the runner was not ready after {self.ready_timeout_s:.0f} s")
            return
        if self.state == "up":
            lost = self.lost_workers()
            if lost:
                self.mark_down(f"RPC worker {', '.join(lost)} closed its connection")
                self.kill()
            return
        # down: start again once every worker answers
        missing = [ep for ep in self.workers if not reachable(ep)]
        if missing:
            self.reason = (self.reason.split(";")[0] + f"; waiting for RPC worker {', '.join(missing)} to answer")
            return
        self.kill()  # a runner marked down by a failed relay may still run: it would hold the workers
        self.restarts += 1
        log.info("RPC workers answer again: starting the runner (restart %d)", self.restarts)
        self.spawn()
        self.reason = "the runner is loading the model again"

    def stop(self) -> None:
        self.state = "stopped"
        self.kill(graceful=True)


def _error_for(path: str, status: int, message: str) -> tuple[int, dict]:
    """(status, body) in the error shape of ``path``'s wire format (``wings.error_response``)."""
    from localrun.server.errors import error_body
    from localrun.server.wings import error_response

    return error_response(path, status, error_body(message, etype="server_error", code="rpc_worker_lost"))


def stream_error(path: str, content_type: str, message: str) -> bytes:
    """The last event of a stream cut by the runner's death, in the stream's own format."""
    _, body = _error_for(path, 503, message)
    if "ndjson" in content_type:
        return (json.dumps(body) + "\n").encode()
    from localrun.server.wings import stream_error as sse_error

    return sse_error(path, body).encode()


def create_front(sup: Supervisor):
    """The front's ASGI app: /health from the supervisor's state (the runner's own answer while up), every
    other request relayed to the runner; a dead runner's requests get 503 as the module doc says."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))

    def unavailable(path: str, why: str):
        status, body = _error_for(path, 503, f"the model is unavailable: {why}")
        return JSONResponse(body, status_code=status, headers={"Retry-After": str(RETRY_AFTER_S)})

    def down_health():
        return JSONResponse({"status": "unhealthy" if sup.state != "starting" else "loading",
                             "reason": sup.reason, "rpc_workers": sup.workers, "runner_restarts": sup.restarts},
                            status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    async def relay(request: Request):
        path = request.url.path
        if sup.state != "up":
            return down_health() if path == "/health" else unavailable(path, sup.reason)
        url = f"http://127.0.0.1:{sup.port}{path}" + (f"?{request.url.query}" if request.url.query else "")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        req = client.build_request(request.method, url, headers=headers, content=await request.body())
        try:
            resp = await client.send(req, stream=True)
        except httpx.TransportError:
            sup.mark_down("the engine's runner stopped answering (an RPC worker went away?)")
            return down_health() if path == "/health" else unavailable(path, sup.reason)
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP | {"content-encoding"}}
        ctype = resp.headers.get("content-type", "")
        if "event-stream" not in ctype and "ndjson" not in ctype:
            try:
                body = await resp.aread()
            except httpx.TransportError:
                sup.mark_down("the engine's runner died during the request (an RPC worker went away?)")
                return unavailable(path, sup.reason)
            finally:
                await resp.aclose()
            return Response(body, status_code=resp.status_code, headers=out_headers)

        async def body_iter():
            try:
                async for part in resp.aiter_bytes():  # decoded: content-encoding is dropped
                    yield part
            except httpx.TransportError:
                sup.mark_down("the engine's runner died during a stream (an RPC worker went away?)")
                yield stream_error(path, ctype, f"the model is unavailable: {sup.reason}")
            finally:
                await resp.aclose()

        return StreamingResponse(body_iter(), status_code=resp.status_code, headers=out_headers)

    async def watch():
        while sup.state != "stopped":
            await asyncio.to_thread(sup.step)
            await asyncio.sleep(POLL_S)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(watch())
        try:
            yield
        finally:
            task.cancel()
            await client.aclose()

    methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"]
    app = Starlette(routes=[Route("/{path:path}", relay, methods=methods)], lifespan=lifespan)
    app.state.supervisor = sup
    return app


def wait_first_ready(sup: Supervisor, poll_s: float = 0.2) -> bool:
    """Block until the first runner is up (True) or has exited before (False: it printed its error)."""
    while True:
        sup.step()
        if sup.state == "up":
            return True
        if sup.state in ("failed", "down", "stopped"):
            return False
        time.sleep(poll_s)


def run_front(argv_for: Callable[[int], list[str]], workers: list[str], host: str, port: int, *,
              log_level: str = "info", env: dict | None = None, on_ready: Callable[[], None] | None = None) -> int:
    """Start the runner, wait until it is ready (then call ``on_ready``), then serve the front on
    ``host:port`` until SIGINT/SIGTERM; the runner is stopped on the way out, before the front exits (also
    when the signal comes while the runner still loads). Returns the exit status: the runner's when it failed
    to start (its error is on stderr already), else 0; after SIGTERM the process ends by that signal (as
    `serve` without --rpc), once the runner has stopped. Must run in the main thread for SIGTERM's part."""
    import uvicorn

    sup = Supervisor(argv_for, workers, env=env)
    terminated = False
    with _sigterm_raises():
        try:
            sup.spawn()
            if not wait_first_ready(sup):
                rc = sup.proc.poll() if sup.proc is not None else None
                return rc if rc else 1
            if on_ready is not None:
                on_ready()
            uvicorn.run(create_front(sup), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=1)
            return 0
        except _Terminated:
            terminated = True
            return 128 + signal.SIGTERM
        finally:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the runner's stop
            sup.stop()
            if terminated:  # the runner is gone: now end by the signal, as `serve` without --rpc does
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.raise_signal(signal.SIGTERM)


class _Terminated(BaseException):
    """SIGTERM reached the front (``_sigterm_raises``)."""


@contextlib.contextmanager
def _sigterm_raises():
    """While the front runs, SIGTERM raises ``_Terminated`` in the main thread, so ``run_front``'s ``finally``
    stops the runner. Without it the runner outlived the front: SIGTERM's default action ends a process
    without unwinding, and uvicorn, which handles SIGTERM while it serves, re-raises it once it has shut
    down (uvicorn/server.py ``capture_signals``: ``signal.raise_signal`` with the handler found before it
    started), so the front died inside ``uvicorn.run`` and the runner went on under PID 1."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
