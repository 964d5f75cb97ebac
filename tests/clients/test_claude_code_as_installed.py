"""Claude Code as users install it, against ``localrun serve`` with nothing in between.

``claude -p`` at the pinned version and at an older one users still run (install.py: 2.1.197 sends
``propertyNames`` in ``TaskCreate``'s schema, which ended every session at its first request), with its own
system prompt, all its tools, its streaming and its sampling: the first request reaches the server exactly
as Claude Code sent it and is answered 200 (every later request too), and Claude Code ends its session by
itself: exit 0 with the answer, or, when the model chose to call a tool, its own "Reached max turns (1)"
(``--max-turns 1``, a flag of the client that bounds the session; the request is the same). A 270M base
model at Claude Code's temperature 1 picks a tool call or an answer by chance; either is the protocol
working, and an API error or a refused request is neither. The server runs Gemma-3-270M at 32k with
``--chat-template gemma`` (no tool syntax: the generic tool format) and ``--n-predict`` (llama-server's
server-side cap) so the tiny model's answer stays short; the request is never rewritten.

Claude Code's own settings bound the session, never the request's content: ``--disallowedTools Agent Workflow``
(the two tools that start sub-agents: a sub-agent runs with no turn limit of its own, and a 270M base model at
temperature 1 keeps calling tools in it; measured 2026-12-05, 2.1.197: one run of three called ``Agent`` and its
haiku sub-agent went on past 20 requests, each switch between the two conversations a whole prefill on Gemma's
sliding window: the CI run that hit the 1800 s limit), and ``CLAUDE_CODE_PRINT_BG_WAIT_CEILING_MS`` (how long
print mode waits for background work at the end; 600 s by default). Every other tool stays in the request,
``TaskCreate``'s ``propertyNames`` included; the corpus test (tests/test_client_request_corpus.py) holds the
default first request with all of them. Claude Code's own endings are all the protocol working: exit 0 with the
answer; "Reached max turns (1)" after a tool call; or, when the server's ``--n-predict`` cut every reply
(``stop_reason: max_tokens``), its own retries and then "API Error: Claude's response exceeded the … output token
maximum" (measured: 4 requests, all 200).

The prefill of Claude Code's ~12k-token prompt takes longer than the stream watchdog Claude Code is given
here (``CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS``, 15 s: its own setting): the stream stays open to the end
because the server sends heartbeats while it prefills (server/heartbeat.py).
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from harness import AGENT_SERVE_ARGS, Serve
from install import CLAUDE_CODE, CLAUDE_CODE_OLD, claude_binary

pytestmark = pytest.mark.model  # spawns `localrun serve` on a real model


@pytest.fixture(scope="module")
def server(gemma_path, tmp_path_factory):
    srv = Serve(gemma_path, tmp_path_factory.mktemp("claude_as_installed"), *AGENT_SERVE_ARGS)
    yield srv
    srv.close()


@pytest.mark.parametrize("version", [CLAUDE_CODE[1], CLAUDE_CODE_OLD[1]])
def test_claude_print_as_installed_answers_and_exits_0(server, version, tmp_path):
    claude = claude_binary(version)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(HOME=str(home), ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="local", NO_COLOR="1",
               DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
               CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS="15000", CLAUDE_CODE_PRINT_BG_WAIT_CEILING_MS="5000")
    before = len(server.log_text())
    try:
        r = subprocess.run([str(claude), "-p", "What is the capital of France?", "--max-turns", "1",
                            "--disallowedTools", "Agent Workflow"], cwd=work, env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:  # say what the session was doing, not only that it ran long
        pytest.fail(f"claude {version} still running after 900 s; server log:\n{server.log_text()[before:][-4000:]}\n"
                    f"claude's output:\n{(e.stdout or b'')[-1500:]!r}\n{(e.stderr or b'')[-1500:]!r}")
    log = server.log_text()[before:]
    statuses = [int(s) for s in re.findall(r"POST /v1/messages(?:\?\S*)? (\d{3})", log)]
    assert statuses and set(statuses) == {200}, log[-3000:]
    assert "cannot be enforced" not in log
    out = f"claude {version} exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
    said = r.stdout + r.stderr
    if "finish=tool_calls" in log and "Reached max turns" in said:
        return  # the model called a tool: Claude Code parsed it and ended on its own turn limit
    if "finish=length" in log and re.search(r"response exceeded the \d+ output token maximum", said):
        # every reply was cut by the server's --n-predict (stop_reason max_tokens): Claude Code retried, then
        # ended the session with its own message
        assert all(f == "length" for f in re.findall(r"finish=(\w+)", log)), log[-3000:]
        return
    assert r.returncode == 0 and r.stdout.strip(), out
