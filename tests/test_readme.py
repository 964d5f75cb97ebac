"""Every `$ ` example in README.md runs as written after the two set-up commands, and says what the README
shows where that does not depend on the CPU (exact answers are margin-checked elsewhere: test_cli,
test_engine). A new example the test does not know is still run: it must exit 0, or fail with the
`error:` line it shows."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@dataclass
class Example:
    cmd: str
    shown: list[str] = field(default_factory=list)  # the lines the README shows after it


def examples() -> list[Example]:
    """The `$ ` commands of README's code blocks (a trailing backslash continues one), with their output."""
    out: list[Example] = []
    in_block, cont, current = False, False, False  # current: a command of this block is open
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            in_block, cont, current = not in_block, False, False
            continue
        if not in_block:
            continue
        if cont:
            out[-1].cmd += " " + line.strip().rstrip("\\").strip()
            cont = line.rstrip().endswith("\\") or _open_quote(out[-1].cmd)
        elif line.startswith("$ "):
            out.append(Example(line[2:].rstrip().rstrip("\\").strip()))
            cont, current = line.rstrip().endswith("\\") or _open_quote(out[-1].cmd), True
        elif current and line.strip():  # output belongs to the command above it in the same block
            out[-1].shown.append(line)
    return out


def _open_quote(cmd: str) -> bool:
    """True while a quoted string is still open: the command goes on on the next line (as in bash)."""
    try:
        shlex.split(cmd)
    except ValueError:
        return True
    return False


def _norm(s: str) -> str:
    return " ".join(s.split())


def _env(home: Path, **extra) -> dict:
    env = dict(os.environ, LOCALRUN_HOME=str(home), COLUMNS="200", **extra)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `localrun` of this venv
    env.pop("LOCALRUN_DEBUG", None)
    return env


def _run(cmd: str, home: Path, timeout: int = 600, **env) -> subprocess.CompletedProcess:
    cmd = re.sub(r"\s+#.*$", "", cmd)  # a README comment after the command
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=_env(home, **env),
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readme_has_the_examples_this_test_checks():
    cmds = [e.cmd for e in examples()]
    assert any(c.startswith("localrun chat --temp 0") for c in cmds)
    assert any(c.startswith("localrun serve") for c in cmds) and any(c.startswith("curl") for c in cmds)
    assert all("model_part_0000" not in c for c in cmds), "a file a newcomer does not have"


@pytest.mark.model  # the README's commands run a real model in subprocesses
def test_interactive_chat_transcript(isolated_home):
    """The README's terminal session, typed line by line into a real pseudo-terminal."""
    pexpect = pytest.importorskip("pexpect")
    ex = next(e for e in examples() if e.cmd.startswith("localrun chat --temp 0") and
              any(s.startswith(">>> ") for s in e.shown))
    argv = shlex.split(ex.cmd)
    env = _env(isolated_home, TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")  # pexpect never answers a CPR request
    child = pexpect.spawn(sys.executable, ["-m", "localrun", *argv[1:]], env=env, encoding="utf-8", timeout=300,
                          dimensions=(40, 120))
    try:
        child.expect(">>>")
        turns = [(i, s[4:]) for i, s in enumerate(ex.shown) if s.startswith(">>> ") and s[4:].strip()]
        for k, (i, typed) in enumerate(turns):
            answer = ex.shown[i + 1:turns[k + 1][0] if k + 1 < len(turns) else len(ex.shown)]
            child.sendline(typed)
            if any("^C" in a for a in answer):  # the README interrupts this one
                child.expect_exact("\x1b[?2004l")  # prompt_toolkit handed the terminal back
                child.expect(r"\w+ \w+ \w+ \w+")
                child.sendintr()
                child.expect("stopped")
            elif "Japan" in typed:
                child.expect("Tokyo")  # margin-checked in test_cli / test_engine: the same on every CPU
                child.expect("tok/s")
            elif typed.startswith("/stats"):
                child.expect("messages in history")
            child.expect(">>>")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.model  # the README's commands run a real model in subprocesses
def test_one_shot_and_planner_examples(isolated_home):
    """Every example but the interactive session and the server: exit status, the error it shows, and the
    output where it is the same on every machine (the planner's with a --preset, inspect, a margin-checked
    answer)."""
    done = 0
    for ex in examples():
        if ex.cmd.startswith(("localrun serve", "curl")) or any(s.startswith(">>> ") for s in ex.shown):
            continue
        r = _run(ex.cmd, isolated_home)
        errors = [s for s in ex.shown if s.startswith("error:")]
        if errors:
            assert r.returncode != 0, (ex.cmd, r.stdout)
            assert all(_norm(e) in _norm(r.stderr) for e in errors), (ex.cmd, r.stderr)
            assert "Traceback" not in r.stderr
        else:
            assert r.returncode == 0, (ex.cmd, r.stderr)
        if "| localrun chat" in ex.cmd or ex.cmd.startswith(("localrun fit", "localrun inspect")):
            got = _norm(r.stdout)
            missing = [s for s in ex.shown if _norm(s).strip("│ ") and _norm(s) not in got
                       and not set(s.strip()) <= set("┏┓┗┛┡┩━┳┻╇┃│└┘┌┐─┬┴┼")]
            assert not missing, (ex.cmd, missing, r.stdout)
        done += 1
    assert done >= 5


@pytest.mark.model  # the README's commands run a real model in subprocesses
def test_serve_and_curl_examples(isolated_home):
    """`localrun serve` as the README starts it, then its curl commands against it (the port moved to a
    free one: the README's 11500 may be taken on a test machine)."""
    port = _free_port()
    exs = examples()
    serve = next(e for e in exs if e.cmd.startswith("localrun serve"))
    curls = [e for e in exs if e.cmd.startswith("curl")]
    proc = subprocess.Popen(["bash", "-c", "exec " + serve.cmd], env=_env(isolated_home, LOCALRUN_PORT=str(port)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "localrun serve did not start"
                time.sleep(0.5)
        for ex in curls:
            r = _run(ex.cmd.replace("11500", str(port)), isolated_home, timeout=600)
            assert r.returncode == 0, (ex.cmd, r.stderr)
            body = json.loads(r.stdout)
            if "/v1/messages" in ex.cmd:  # Anthropic's Messages API (the text: test_anthropic.py)
                assert body["type"] == "message" and body["content"][0]["text"]
                assert body["stop_reason"] == "end_turn" and body["usage"]["output_tokens"] > 0
            elif "chat/completions" in ex.cmd:
                shown = re.search(r'"content":"([^"]*)"\}', " ".join(ex.shown)).group(1)
                assert body["choices"][0]["message"]["content"] == shown  # margin-checked (test_engine)
                assert body["choices"][0]["finish_reason"] == "stop"
            else:
                assert body["done"] is True and body["done_reason"] == "length" and body["response"]
    finally:
        proc.send_signal(2)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0
