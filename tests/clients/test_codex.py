"""Codex CLI (npm ``@openai/codex``, pinned in install.py) against a live ``localrun serve`` (issue 28).

Codex speaks only OpenAI's Responses API (``wire_api = "responses"``) and streams. The test runs
``codex exec`` with a scratch ``HOME``/``CODEX_HOME`` whose config.toml names localrun as its model provider
(the configuration docs/serve.md gives), on SmolLM2 served with Qwen3's chat template (it renders tools).

1. A question: the request is accepted, the streamed answer is printed, ``codex exec`` exits 0. It goes through
   the same proxy as test 2 with only ``exec_command``'s ``cmd`` narrowed (no sampling or tool choice
   changed), and both runs share HOME and cwd, so test 2 reuses this prompt from the KV cache.
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
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from harness import RewritingProxy, Serve, sse_events

pytestmark = pytest.mark.model  # spawns `localrun serve` on a real model

TEMPLATE = Path(__file__).resolve().parent.parent / "data" / "templates" / "Qwen-Qwen3-0.6B.jinja"
API_KEY = "codex-test-key"
MODEL = "smollm"


@pytest.fixture(scope="module")
def codex() -> Path:
    if not shutil.which("node"):
        pytest.skip("node is missing: the Codex CLI test needs node and npm (apt-get install nodejs npm)")
    from install import codex_binary

    return codex_binary()


@pytest.fixture(scope="module")
def server(smollm_path, tmp_path_factory):
    """``localrun serve`` in a subprocess (its own LOCALRUN_HOME), with an API key and --responses-db."""
    home = tmp_path_factory.mktemp("codex_serve_home")
    srv = Serve(smollm_path, home, "--alias", MODEL, "--ctx", "8192", "--parallel", "1",
                "--chat-template", str(TEMPLATE), "--api-key", API_KEY, "--stop-loops",
                "--responses-db", str(home / "stored" / "r.db"))
    yield srv
    srv.close()
    assert (home / "stored" / "r.db").is_file()  # a stored response went to --responses-db


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """One scratch folder for the module's Codex runs (their HOME and working directory): Codex writes both
    paths into its prompt after its tools and instructions (the skills' root, the cwd), so the same folders
    let the second run reuse the first one's prompt from the KV cache up to the question."""
    return tmp_path_factory.mktemp("codex")


def codex_home(tmp_path: Path, base_url: str) -> Path:
    """A scratch HOME with ``.codex/config.toml`` naming localrun as the provider (docs/serve.md).
    The short instructions file and the features turned off keep the prompt small for a CPU test."""
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True, exist_ok=True)
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


def narrow_exec_command(path: str, body: dict) -> dict:
    """``exec_command``'s ``cmd`` fixed to ``pwd`` (nothing else changed): test 2's proxy narrows it the same
    way, so the module's two Codex runs share their prompt up to the working directory and the second one
    reuses the first one's KV cache instead of prefilling Codex's tools again."""
    body = dict(body)
    for t in body.get("tools", []):
        if t.get("name") == "exec_command":
            t["parameters"] = {"type": "object", "properties": {"cmd": {"type": "string", "enum": ["pwd"]}},
                               "required": ["cmd"], "additionalProperties": False}
    return body


def test_codex_exec_prints_the_streamed_answer(codex, server, scratch):
    url = server.url
    # Codex sends store: false; a plain request stores its response in the --responses-db file (asked first:
    # the one slot then holds Codex's prompt, which test 2 reuses)
    h = {"Authorization": f"Bearer {API_KEY}"}
    made = httpx.post(url + "/v1/responses", headers=h, timeout=300,
                      json={"model": MODEL, "input": "Hi", "max_output_tokens": 2})
    assert made.status_code == 200, made.text
    assert httpx.get(url + f"/v1/responses/{made.json()['id']}", headers=h).json()["id"] == made.json()["id"]
    proxy = RewritingProxy(url, narrow_exec_command)
    try:
        r = run_codex(codex, codex_home(scratch, proxy.url), scratch / "work", "What is the capital of Japan?")
    finally:
        proxy.close()
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:], server.log_text()[-2000:])
    assert r.stdout.strip(), r.stderr[-3000:]  # the answer, printed
    assert "POST /v1/responses 200" in server.log_text()


def force_exec_command(path: str, body: dict) -> dict:
    """A first turn (no tool output in it yet) gets a forced, greedy call of ``exec_command``; later ones are
    greedy (and end by themselves: the server runs with ``--stop-loops``). Every turn alike has
    ``exec_command``'s ``cmd`` fixed to ``pwd``: the tools' text is part of the prompt prefix the turn after
    the call reuses from the KV cache."""
    body = dict(narrow_exec_command(path, body), temperature=0)
    if not any(i.get("type") == "function_call_output" for i in body.get("input", [])):
        body["max_output_tokens"] = 48
        body["tool_choice"] = {"type": "function", "name": "exec_command"}
    return body


def test_a_forced_tool_call_reaches_codex_and_its_output_comes_back(codex, server, scratch):
    proxy = RewritingProxy(server.url, force_exec_command)
    try:
        r = run_codex(codex, codex_home(scratch, proxy.url), scratch / "work", "Which folder am I in?")
    finally:
        proxy.close()
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:], server.log_text()[-2000:])
    assert len(proxy.requests) >= 2, proxy.responses
    first = [ev for _, ev in sse_events(proxy.responses[0])]
    done = [ev for ev in first if ev["type"] == "response.function_call_arguments.done"]
    assert done and done[0]["name"] == "exec_command" and first[-1]["type"] == "response.completed"
    # Codex ran the call and sent it back with its output (stateless: store false, the whole conversation)
    second = proxy.requests[1][1]
    calls = [i for i in second["input"] if i.get("type") == "function_call"]
    outputs = [i for i in second["input"] if i.get("type") == "function_call_output"]
    assert calls and outputs and calls[0]["call_id"] == outputs[0]["call_id"], second["input"][-3:]
    assert json.loads(calls[0]["arguments"]) == {"cmd": "pwd"}
    assert sse_events(proxy.responses[1])[-1][1]["type"] in ("response.completed", "response.incomplete")
    log = server.log_text()
    assert " 400 " not in log
    # the turn after the call (the whole conversation again: store false) reused the first turn's prompt
    last = re.findall(r"POST /v1/responses 200 \S+ prompt_tokens=(\d+) cached_tokens=(\d+)", log)[-1]
    assert int(last[1]) >= 0.8 * int(last[0]), last
