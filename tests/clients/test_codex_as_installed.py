"""Codex as users install it, against ``localrun serve`` with nothing in between.

``codex exec`` at the pinned version and at an older one users still run (install.py), configured as
Codex's docs say for a custom provider (a ``[model_providers.NAME]`` entry with ``wire_api = "responses"``)
and nothing else: its default tools, the hosted ``web_search`` among them (left out by the server, never a
400), its own instructions, its streaming. Every request is answered 200 and ``codex exec`` ends by itself:
exit 0 with the answer (a tool the tiny model calls runs in Codex's default read-only sandbox, and the session
goes on until the model answers), or, when the server's cap cut the answer, Codex's own "Incomplete response
returned, reason: max_output_tokens" (a 270M base model writing the generic format's JSON at Codex's sampling
does not always close it within the cap; the request is never rewritten to make it), or Codex's own "ran
out of room in the model's context window" when the tiny model called tools turn after turn until the
window was full (each earlier request 200, the last the server's OpenAI ``context_length_exceeded``). The server runs
Gemma-3-270M at 32k with ``--chat-template gemma`` and ``--n-predict`` (the server-side cap that keeps the
tiny model's answer short).

The provider's ``stream_idle_timeout_ms`` (Codex's own setting) is 15 s, far shorter than the prefill of
Codex's ~9k-token prompt here: the stream stays open because the server repeats ``response.in_progress``
while it prefills (server/heartbeat.py).
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from harness import AGENT_SERVE_ARGS, Serve
from install import CODEX, CODEX_OLD, codex_binary

pytestmark = pytest.mark.model  # spawns `localrun serve` on a real model


@pytest.fixture(scope="module")
def server(gemma_path, tmp_path_factory):
    srv = Serve(gemma_path, tmp_path_factory.mktemp("codex_as_installed"), *AGENT_SERVE_ARGS)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """One HOME and working folder for both versions (Codex writes both paths into its prompt)."""
    return tmp_path_factory.mktemp("codex_home")


@pytest.mark.parametrize("version", [CODEX[1], CODEX_OLD[1]])
def test_codex_exec_as_installed_answers_and_exits_0(server, scratch, version):
    codex = codex_binary(version)
    home, work = scratch / "home", scratch / "work"
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    (home / ".codex" / "config.toml").write_text(f'''model = "gemma"
model_provider = "localrun"

[model_providers.localrun]
name = "localrun"
base_url = "{server.url}/v1"
wire_api = "responses"
stream_idle_timeout_ms = 15000
stream_max_retries = 0
''')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), CODEX_HOME=str(home / ".codex"), NO_COLOR="1")
    before = len(server.log_text())
    try:
        r = subprocess.run([str(codex), "exec", "--skip-git-repo-check", "What is the capital of France?"], cwd=work,
                           env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:  # say what the session was doing, not only that it ran long
        pytest.fail(f"codex {version} still running after 900 s; server log:\n{server.log_text()[before:][-4000:]}\n"
                    f"its output:\n{(e.stdout or b'')[-1500:]!r}\n{(e.stderr or b'')[-1500:]!r}")
    log = server.log_text()[before:]
    lines = re.findall(r"POST /v1/responses (\d{3}) (.*)", log)
    statuses = [int(st) for st, _ in lines]
    out = f"codex {version} exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-2500:]}"
    if statuses[-1:] == [400] and "error=context_length_exceeded" in lines[-1][1]:
        # the tiny model called tools turn after turn until the window was full: the server's OpenAI
        # context_length_exceeded is what Codex reads as "out of room" (its own words), never a bare 400
        assert set(statuses[:-1]) == {200} and len(statuses) > 5, log[-3000:]
        assert "ran out of room in the model's context window" in out, out
        return
    assert statuses and set(statuses) == {200}, log[-3000:]
    if "finish=length" in log and "Incomplete response returned, reason: max_output_tokens" in out:
        return  # the server's --n-predict cut the tiny model's answer: Codex read status incomplete and said so
    assert r.returncode == 0, out
