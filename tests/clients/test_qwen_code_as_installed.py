"""Qwen Code (an OpenAI-compatible coding CLI: chat completions) as users install it, against
``localrun serve`` with nothing in between.

``qwen`` one-shot with its own system prompt and tools (one of which has a ``oneOf`` of two string branches,
which a strict constraint engine refuses) and its streaming: the first request is answered 200 (every later
one too), and it ends its session by itself: exit 0 with the answer, or its own session-turn limit
(``--max-session-turns 1``, a flag of the client) when the tiny model chose to call a tool. Gemma-3-270M at
32k with ``--chat-template gemma`` and ``--n-predict`` (the server-side
cap that keeps the tiny model's answer short; the request is never rewritten).

Its stream guard (``QWEN_STREAM_IDLE_TIMEOUT_MS``, its own setting; 240 s by default) is 15 s here, far
shorter than the prefill of its prompt: the stream stays open because the server sends an empty delta chunk
while it prefills (server/heartbeat.py).
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from harness import AGENT_SERVE_ARGS, Serve
from install import QWEN_CODE, qwen_binary

pytestmark = pytest.mark.model  # spawns `localrun serve` on a real model


@pytest.fixture(scope="module")
def server(gemma_path, tmp_path_factory):
    srv = Serve(gemma_path, tmp_path_factory.mktemp("qwen_as_installed"), *AGENT_SERVE_ARGS)
    yield srv
    srv.close()


@pytest.mark.parametrize("version", [QWEN_CODE[1]])
def test_qwen_print_as_installed_answers_and_exits_0(server, version, tmp_path):
    qwen = qwen_binary(version)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "QWEN_", "DASHSCOPE_"))}
    env.update(HOME=str(home), OPENAI_API_KEY="local", OPENAI_BASE_URL=server.url + "/v1", OPENAI_MODEL="gemma",
               NO_COLOR="1", QWEN_STREAM_IDLE_TIMEOUT_MS="15000")
    before = len(server.log_text())
    try:
        r = subprocess.run([str(qwen), "--auth-type", "openai", "--max-session-turns", "1",
                            "What is the capital of France?"], cwd=work, env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:  # say what the session was doing, not only that it ran long
        pytest.fail(f"qwen {version} still running after 900 s; server log:\n{server.log_text()[before:][-4000:]}\n"
                    f"its output:\n{(e.stdout or b'')[-1500:]!r}\n{(e.stderr or b'')[-1500:]!r}")
    log = server.log_text()[before:]
    statuses = [int(s) for s in re.findall(r"POST /v1/chat/completions (\d{3})", log)]
    assert statuses and set(statuses) == {200}, log[-3000:]
    out = f"qwen {version} exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-2500:]}"
    assert "No stream activity" not in out, out
    if "finish=tool_calls" in log and "turn" in (r.stdout + r.stderr).lower() and r.returncode != 0:
        return  # the model called a tool: Qwen Code parsed it and ended on its own session-turn limit
    assert r.returncode == 0 and r.stdout.strip(), out
