"""`localrun launch CLIENT`: finds or starts a server with the context the client needs, points the client at
it without touching the user's files, runs it, and stops the server it started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localrun.commands.launch import CLIENTS, client_setup, opencode_config


def _launch(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localrun", "launch", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, stdin=subprocess.DEVNULL)


def test_an_unknown_client_names_the_known_ones():
    r = _launch("vim")
    assert r.returncode != 0 and "unknown client 'vim'" in r.stderr and "claude, codex, opencode, qwen" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_missing_client_names_its_install_command(client, tmp_path):
    r = _launch(client, env={"PATH": str(tmp_path)})  # nothing on PATH
    assert r.returncode == 127, r.stderr
    assert CLIENTS[client].install in r.stderr and "Traceback" not in r.stderr


def test_dry_run_shows_the_server_the_environment_and_the_client(isolated_home):
    r = _launch("codex", "--dry-run", "--port", "11999", "--", "exec", "hi")
    assert r.returncode == 0, r.stderr
    assert "--ctx 32768" in r.stdout and "--port 11999" in r.stdout
    assert 'base_url="http://127.0.0.1:11999/v1"' in r.stdout and 'wire_api="responses"' in r.stdout
    assert r.stdout.rstrip().endswith("exec hi")
    assert 'web_search="disabled"' in r.stdout  # a hosted tool the local server cannot run is turned off
    assert "model_context_window=32768" in r.stdout  # Codex has no metadata for a local model: told the window


def test_dry_run_sees_a_server_already_on_the_port(isolated_home):
    """A server answering on the port is the one the client would use (the dry run says so, runs nothing)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Models(BaseHTTPRequestHandler):  # what `localrun serve` answers on /v1/models, nothing more
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = json.dumps({"data": [{"id": "gemma", "meta": {"n_ctx": 32768}}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = _launch("claude", "--dry-run", "--port", str(srv.server_address[1]))
    finally:
        srv.shutdown()
    assert r.returncode == 0, r.stderr
    assert f"server: running at http://127.0.0.1:{srv.server_address[1]}" in r.stdout
    assert "ANTHROPIC_MODEL=gemma" in r.stdout


def test_each_client_is_pointed_at_the_server_without_touching_its_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    base = "http://127.0.0.1:11500"
    env, args = client_setup("claude", base, "k", "smollm", tmp_path)
    assert env["ANTHROPIC_BASE_URL"] == base and env["ANTHROPIC_MODEL"] == "smollm" and args == []
    env, _ = client_setup("claude", base, "k", "smollm", tmp_path, n_ctx=32768)
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "32768"  # Claude compacts before the server's window fills
    env, args = client_setup("codex", base, "k", "smollm", tmp_path)
    assert args[:2] == ["-c", "model_provider=localrun"] and args[-2:] == ["-m", "smollm"]
    env, args = client_setup("qwen", base, "k", "smollm", tmp_path)
    assert env["OPENAI_BASE_URL"] == f"{base}/v1" and args == ["--auth-type", "openai"]
    env, _ = client_setup("opencode", base, "k", "smollm", tmp_path)
    assert Path(env["OPENCODE_CONFIG"]).read_text().count(f"{base}/v1") == 1
    assert not (tmp_path / "home").exists()  # nothing written under HOME without --config


def test_config_writes_the_clients_own_file_once(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("CODEX_HOME", raising=False)
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text('model = "gpt-5"\n')
    for _ in range(2):
        client_setup("codex", "http://127.0.0.1:11500", "k", "m", tmp_path, write=True)
    text = (home / ".codex" / "config.toml").read_text()
    assert text.startswith('model = "gpt-5"\n') and text.count("[model_providers.localrun]") == 1
    client_setup("claude", "http://127.0.0.1:11500", "k", "m", tmp_path, write=True)
    assert '"ANTHROPIC_BASE_URL": "http://127.0.0.1:11500"' in (home / ".claude" / "settings.json").read_text()
    assert opencode_config("http://x", "k", "m")["model"] == "localrun/m"


@pytest.mark.model
def test_launch_claude_starts_a_server_runs_claude_code_and_stops_the_server(smollm_path, isolated_home, tmp_path):
    """The real Claude Code (tests/clients/install.py) on PATH: launch starts `localrun serve` with the
    context asked for, Claude Code's request reaches it and is served (200), and the server is gone after."""
    sys.path.insert(0, str(Path(__file__).parent / "clients"))
    from harness import free_port
    from install import claude_binary

    claude_dir = claude_binary().parent
    port = free_port()
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": f"{claude_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "32"}
    r = subprocess.run([sys.executable, "-m", "localrun", "launch", "claude", "--model", str(smollm_path), "--port",
                        str(port), "--ctx", "2048", "--", "-p", "Say OK.", "--tools", "", "--max-turns", "1",
                        "--system-prompt", "Answer in one word."],
                       cwd=work, capture_output=True, text=True, env={**os.environ, **env}, timeout=1200,
                       stdin=subprocess.DEVNULL)
    log = (isolated_home / "logs" / "launch-serve.log").read_text()
    assert "Traceback" not in r.stderr, r.stderr
    assert "--ctx 2048" in r.stderr and "1 parallel × 2048 tokens" in log
    assert "POST /v1/messages?beta=true 200" in log or "POST /v1/messages 200" in log, log[-2000:]
    import httpx

    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
