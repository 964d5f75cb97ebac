"""What the client tests share: a live ``localrun serve`` subprocess, and a proxy that rewrites what a client
sends before the server sees it.

A real agent decides by itself whether to call a tool and never sends ``tool_choice``; a 135M model will
not call one unasked. The proxy forces the call the test wants (a named tool, its input narrowed to one
value), so the test follows the protocol end to end: the constrained call streams to the client, the client
runs it, and its next request carries the result, which the proxy records.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the as-installed client tests' server: Gemma-3 at an agent's context, no tool syntax in its template (the
# generic format), one sequence, and llama-server's server-side cap on each answer (never a rewritten request)
AGENT_SERVE_ARGS = ("--ctx", "32768", "--parallel", "1", "--chat-template", "gemma", "--n-predict", "128")


class Serve:
    """``localrun serve MODEL ARGS…`` on a free port with its own LOCALRUN_HOME under ``home``; ``url``,
    ``log`` (its stderr/stdout file). Waits for ``/health`` (the process dying fails at once)."""

    def __init__(self, model: Path, home: Path, *args: str, startup_s: float = 300) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / "serve.log"
        self._out = open(self.log, "w")
        env = dict(os.environ, LOCALRUN_HOME=str(home))
        self.proc = subprocess.Popen([sys.executable, "-m", "localrun", "serve", str(model), "--port", str(self.port),
                                      *args], env=env, stdout=self._out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + startup_s  # a liveness bound on start-up, not a timing assert
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "localrun serve did not start: " + self.log.read_text()[-3000:]
            time.sleep(0.05)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._out.close()


class RewritingProxy:
    """Forwards POSTs to ``upstream`` after ``rewrite(path, body) -> body``; streams the answer back as it
    comes. ``requests`` keeps every (path, body) sent on, ``responses`` every answer's raw text."""

    def __init__(self, upstream: str, rewrite: Callable[[str, dict], dict]) -> None:
        self.upstream = upstream
        self.requests: list[tuple[str, dict]] = []
        self.responses: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                r = httpx.head(proxy.upstream + self.path)
                self.send_response(r.status_code)
                self.end_headers()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                body = rewrite(self.path, body)
                proxy.requests.append((self.path, body))
                keep = ("authorization", "x-api-key", "anthropic-version", "anthropic-beta")
                headers = {k: v for k, v in self.headers.items() if k.lower() in keep}
                with httpx.stream("POST", proxy.upstream + self.path, json=body, headers=headers, timeout=900) as up:
                    self.send_response(up.status_code)
                    self.send_header("content-type", up.headers.get("content-type", "application/json"))
                    self.send_header("connection", "close")
                    self.end_headers()
                    seen = []
                    for chunk in up.iter_raw():
                        seen.append(chunk)
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    proxy.responses.append(b"".join(seen).decode("utf-8", "replace"))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def sse_events(raw: str) -> list[tuple[str, dict]]:
    """A server-sent-events body → [(event name, data object)] (events without data are left out)."""
    out, name = [], ""
    for line in raw.splitlines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            out.append((name, json.loads(line[5:])))
    return out
