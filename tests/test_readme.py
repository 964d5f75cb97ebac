"""Every `$ ` example in README.md and docs/*.md runs as written after the two set-up commands, and says what
the page shows where that does not depend on the CPU (exact answers are margin-checked elsewhere: test_cli,
test_engine). A new example the test does not know is still run: it must exit 0, or fail with the
`error:` line it shows. Every relative link between these pages, and its `#anchor`, resolves."""

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

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the front door, then the reference
DOCS = ("chat", "serve", "fit", "models", "benchmarks", "architecture")  # docs/NAME.md the README links to


@dataclass
class Example:
    cmd: str
    shown: list[str] = field(default_factory=list)  # the lines the page shows after it


def examples(page: Path = README) -> list[Example]:
    """The `$ ` commands of a page's code blocks (a trailing backslash continues one), with their output."""
    out: list[Example] = []
    in_block, cont, current = False, False, False  # current: a command of this block is open
    for line in page.read_text().splitlines():
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


def _interactive(ex: Example) -> bool:
    return any(s.startswith(">>> ") for s in ex.shown)


def _is_server(ex: Example) -> bool:
    return ex.cmd.startswith(("localrun serve", "curl"))


def _pages_with(pred) -> list:
    """The pages with an example ``pred`` accepts, as pytest params named by file."""
    return [pytest.param(p, id=p.relative_to(ROOT).as_posix()) for p in PAGES if any(map(pred, examples(p)))]


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
    cmd = re.sub(r"\s+#.*$", "", cmd)  # a page's comment after the command
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
    assert any(c.startswith("localrun fit") for c in cmds)
    assert sum(len(examples(p)) for p in PAGES) >= 12, "the parser found too few examples"
    for p in PAGES:
        assert all("model_part_0000" not in e.cmd for e in examples(p)), (p, "a file a newcomer does not have")
    for name in DOCS:
        assert (ROOT / "docs" / f"{name}.md").is_file(), name


def test_every_page_with_curl_starts_its_server():
    """A page's curl examples run against the `localrun serve` example of the same page."""
    for p in PAGES:
        exs = examples(p)
        if any(e.cmd.startswith("curl") for e in exs):
            assert any(e.cmd.startswith("localrun serve") for e in exs), p


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces → `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The `#anchors` of a page's headings (a repeated heading gets -1, -2, … as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    in_block = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_block = not in_block
        m = re.match(r"(#{1,6}) +(.*?) *#* *$", line)
        if m and not in_block:
            s = _slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(page: Path) -> list[str]:
    """The relative targets of a page's Markdown links (``[text](target)``), outside code."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`]+`", "", text)  # code spans may run over a line break
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_and_anchors_resolve(page):
    """Every relative link (README → docs/, docs/ → docs/ and back) names a file that exists and, with a
    `#anchor`, a heading of that file."""
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, broken


def test_readme_links_every_doc():
    """The front door links each reference page."""
    targets = {t.partition("#")[0] for t in links(README)}
    assert {f"docs/{name}.md" for name in DOCS} <= targets


def test_slug_is_githubs():
    assert _slug("`localrun chat`") == "localrun-chat"
    assert _slug("1. Engine contract") == "1-engine-contract"
    assert _slug("Anthropic's Messages API") == "anthropics-messages-api"
    assert _slug("Other machines: `localrun worker`") == "other-machines-localrun-worker"


@pytest.mark.model  # the pages' commands run a real model in subprocesses
@pytest.mark.parametrize("page", _pages_with(_interactive))
def test_interactive_chat_transcript(isolated_home, page):
    """A page's terminal session, typed line by line into a real pseudo-terminal."""
    pexpect = pytest.importorskip("pexpect")
    ex = next(e for e in examples(page) if e.cmd.startswith("localrun chat") and _interactive(e))
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
            if any("^C" in a for a in answer):  # the page interrupts this one
                child.expect_exact("\x1b[?2004l")  # prompt_toolkit handed the terminal back
                child.expect(r"\w+ \w+ \w+ \w+")
                child.sendintr()
                child.expect("stopped")
            elif "Japan" in typed:
                child.expect("Tokyo")  # margin-checked in test_cli / test_engine: the same on every CPU
                child.expect("tok/s")
            elif typed.startswith("/stats"):
                child.expect("messages in history")
            elif any("tok/s" in a for a in answer):
                # the answer's own end (its stats line), not the ">>> typed" prompt_toolkit redraws on Enter: a
                # Ctrl-D sent while the answer still streams reaches a terminal in cooked mode, where the line
                # discipline takes it as end-of-file and no key is ever read (the chat then waits at its prompt)
                child.expect("tok/s")
            child.expect(">>>")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.model  # the pages' commands run a real model in subprocesses
@pytest.mark.parametrize("page", _pages_with(lambda e: not (_is_server(e) or _interactive(e))))
def test_one_shot_and_planner_examples(isolated_home, page):
    """Every example of a page but the interactive session and the server: exit status, the error it shows,
    and the output where it is the same on every machine (the planner's with a --preset, inspect, a
    margin-checked answer)."""
    done = 0
    for ex in examples(page):
        if _is_server(ex) or _interactive(ex):
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
    assert done >= 1


@pytest.mark.model  # the pages' commands run a real model in subprocesses
@pytest.mark.parametrize("page", _pages_with(lambda e: e.cmd.startswith("curl")))
def test_serve_and_curl_examples(isolated_home, page):
    """`localrun serve` as a page starts it, then the page's curl commands against it (the port moved to a
    free one: the pages' 11500 may be taken on a test machine)."""
    port = _free_port()
    exs = examples(page)
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
                time.sleep(0.1)
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


def client_table() -> dict[str, dict[str, str]]:
    """The README's "Use it with…" table (after ``<!-- clients -->``): client → {command, tested, version}."""
    text = README.read_text(encoding="utf-8").split("<!-- clients -->", 1)[1]
    rows = {}
    for line in text.strip().splitlines()[2:]:
        if not line.startswith("|"):
            break
        client, command, tested, version = [c.strip() for c in line.strip("|").split("|")]
        rows[client] = {"command": command.strip("`"), "tested": tested, "version": version}
    return rows


def test_the_clients_table_names_the_versions_the_tests_install():
    """Each pinned version in the table is the one tests/clients installs (npm) or pyproject pins (PyPI)."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "clients"))
    from install import CLAUDE_CODE, CLAUDE_CODE_OLD, CODEX, CODEX_OLD, QWEN_CODE

    rows = client_table()
    assert rows["Claude Code"]["version"].split(", ") == [CLAUDE_CODE[1], CLAUDE_CODE_OLD[1]]
    assert rows["Codex CLI"]["version"].split(", ") == [CODEX[1], CODEX_OLD[1]]
    assert rows["Qwen Code"]["version"] == QWEN_CODE[1]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"ollama=={rows["Ollama Python client"]["version"]}"' in pyproject
    assert f'"openai-agents=={rows["OpenAI Agents SDK"]["version"]}"' in pyproject
    for test in ("test_claude_code.py", "test_codex.py", "test_ollama_client.py", "test_claude_code_as_installed.py",
                 "test_codex_as_installed.py", "test_qwen_code_as_installed.py"):
        assert (ROOT / "tests" / "clients" / test).is_file()


@pytest.mark.parametrize("client", ["claude", "codex", "opencode", "qwen"])
def test_each_launch_command_in_the_table_runs(isolated_home, client):
    """The table's `localrun launch CLIENT` commands, as a dry run (what would start, and how the client is
    pointed at the server); tests/test_launch.py runs Claude Code through it for real."""
    commands = [r["command"] for r in client_table().values() if r["command"].startswith("localrun launch")]
    assert f"localrun launch {client}" in commands
    r = _run(f"localrun launch {client} --dry-run", isolated_home, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "localrun serve" in r.stdout.replace("-m localrun serve", "localrun serve") and "client:" in r.stdout
