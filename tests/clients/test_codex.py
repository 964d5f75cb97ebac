"""Codex CLI (npm ``@openai/codex``, pinned in install.py) against a live ``localrun serve`` (issue 28).

Codex speaks only OpenAI's Responses API (``wire_api = "responses"``) and streams. The test runs
``codex exec`` with a scratch ``HOME``/``CODEX_HOME`` whose config.toml names localrun as its model provider
(the configuration docs/serve.md gives), on SmolLM2 served with Qwen3's chat template (it renders tools).

1. A question: the request is accepted, the streamed answer is printed, ``codex exec`` exits 0.
2. A tool round trip. Codex always sends ``tool_choice: "auto"`` and no temperature, and a 135M model will
   not call a tool by itself; so a small forwarding proxy between Codex and the server forces the call
   (``tool_choice`` naming ``exec_command``, its ``cmd`` narrowed to ``pwd``, greedy): the constrained
   ``function_call`` streams to Codex, Codex runs it, and its next request carries the call and the
   ``function_call_output`` with the same ``call_id``, which the server accepts and answers.

The model is tiny: the test judges statuses, the protocol and exit codes, not the answer.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.model  # spawns `localrun serve` on a real model

TEMPLATE = Path(__file__).resolve().parent.parent / "data" / "templates" / "Qwen-Qwen3-0.6B.jinja"
API_KEY = "codex-test-key"
MODEL = "smollm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def codex() -> Path:
    if not shutil.which("node"):
        pytest.skip("node is missing: the Codex CLI test needs node and npm (apt-get install nodejs npm)")
    from install import codex_binary

    return codex_binary()


@pytest.fixture(scope="module")
def server(smollm_path, tmp_path_factory):
    """``localrun serve`` in a subprocess (its own LOCALRUN_HOME), with an API key."""
    home = tmp_path_factory.mktemp("codex_serve_home")
    port = free_port()
    env = dict(os.environ, LOCALRUN_HOME=str(home))
    log = open(home / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "localrun", "serve", str(smollm_path), "--alias", MODEL,
                             "--port", str(port), "--ctx", "8192", "--parallel", "1", "--threads", "2",
                             "--chat-template", str(TEMPLATE), "--api-key", API_KEY, "--stop-loops",
                             "--responses-db", str(home / "stored" / "r.db")],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, (home / "serve.log").read_text()[-3000:]
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "localrun serve did not start"
        time.sleep(0.3)
    yield url, home / "serve.log"
    assert (home / "stored" / "r.db").is_file()  # a stored response went to --responses-db
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def codex_home(tmp_path: Path, base_url: str) -> Path:
    """A scratch HOME with ``.codex/config.toml`` naming localrun as the provider (docs/serve.md).
    The short instructions file and the features turned off keep the prompt small for a CPU test."""
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / "instructions.md").write_text("You are a terse assistant.\n")
    (home / ".codex" / "config.toml").write_text(f'''model = "{MODEL}"
model_provider = "localrun"
web_search = "disabled"
model_instructions_file = "{home / 'instructions.md'}"

[features]
multi_agent = false
goals = false

[model_providers.localrun]
name = "localrun"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "LOCALRUN_API_KEY"
request_max_retries = 0
stream_max_retries = 0
''')
    return home


def run_codex(codex: Path, home: Path, workdir: Path, prompt: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), CODEX_HOME=str(home / ".codex"), LOCALRUN_API_KEY=API_KEY, NO_COLOR="1")
    workdir.mkdir(exist_ok=True)
    return subprocess.run([str(codex), "exec", "--strict-config", "--skip-git-repo-check", "-s", "read-only", prompt],
                          cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=900)


def test_codex_exec_prints_the_streamed_answer(codex, server, tmp_path):
    url, log = server
    r = run_codex(codex, codex_home(tmp_path, url), tmp_path / "work", "What is the capital of Japan?")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:], log.read_text()[-2000:])
    assert r.stdout.strip(), r.stderr[-3000:]  # the answer, printed
    assert "POST /v1/responses 200" in log.read_text()
    # Codex sends store: false; a plain request stores its response in the --responses-db file
    h = {"Authorization": f"Bearer {API_KEY}"}
    made = httpx.post(url + "/v1/responses", headers=h, timeout=300,
                      json={"model": MODEL, "input": "Hi", "max_output_tokens": 2})
    assert made.status_code == 200, made.text
    assert httpx.get(url + f"/v1/responses/{made.json()['id']}", headers=h).json()["id"] == made.json()["id"]


class ForcingProxy:
    """Forwards Codex's requests to the server; a first turn (no tool output in it yet) gets a forced,
    greedy call of ``exec_command`` with ``cmd`` fixed to ``pwd``; later ones are greedy (and end by
    themselves: the server runs with ``--stop-loops``).
    ``requests`` keeps every body sent, ``streams`` every answer's text."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests: list[dict] = []
        self.streams: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                body = proxy.rewrite(body)
                proxy.requests.append(body)
                headers = {"authorization": self.headers.get("authorization", ""),
                           "content-type": "application/json"}
                with httpx.stream("POST", proxy.upstream + self.path, json=body, headers=headers,
                                  timeout=900) as up:
                    self.send_response(up.status_code)
                    self.send_header("content-type", up.headers.get("content-type", "application/json"))
                    self.send_header("connection", "close")
                    self.end_headers()
                    seen = []
                    for chunk in up.iter_raw():
                        seen.append(chunk)
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    proxy.streams.append(b"".join(seen).decode("utf-8", "replace"))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def rewrite(self, body: dict) -> dict:
        body = dict(body, temperature=0)
        answered = any(i.get("type") == "function_call_output" for i in body.get("input", []))
        if not answered:
            body["max_output_tokens"] = 48
            body["tool_choice"] = {"type": "function", "name": "exec_command"}
            for t in body.get("tools", []):
                if t.get("name") == "exec_command":
                    t["parameters"] = {"type": "object", "properties": {"cmd": {"type": "string", "enum": ["pwd"]}},
                                       "required": ["cmd"], "additionalProperties": False}
        return body

    def close(self) -> None:
        self.server.shutdown()


def test_a_forced_tool_call_reaches_codex_and_its_output_comes_back(codex, server, tmp_path):
    url, log = server
    proxy = ForcingProxy(url)
    try:
        r = run_codex(codex, codex_home(tmp_path, proxy.url), tmp_path / "work", "Which folder am I in?")
    finally:
        proxy.close()
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:], log.read_text()[-2000:])
    assert len(proxy.requests) >= 2, proxy.streams
    first = proxy.streams[0]
    assert '"type":"response.function_call_arguments.done"' in first and '"name":"exec_command"' in first
    assert '"type":"response.completed"' in first
    # Codex ran the call and sent it back with its output (stateless: store false, the whole conversation)
    second = proxy.requests[1]
    calls = [i for i in second["input"] if i.get("type") == "function_call"]
    outputs = [i for i in second["input"] if i.get("type") == "function_call_output"]
    assert calls and outputs and calls[0]["call_id"] == outputs[0]["call_id"], second["input"][-3:]
    assert json.loads(calls[0]["arguments"]) == {"cmd": "pwd"}
    assert '"type":"response.completed"' in proxy.streams[1] or '"type":"response.incomplete"' in proxy.streams[1]
    assert " 400 " not in log.read_text()
