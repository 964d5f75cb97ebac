"""Agent mode of `localrun chat` in a real pseudo-terminal, on SmolLM2 (ChatML: no tool syntax, so the generic
format), a call forced with --tool-choice (constrained decoding): the diff shown before a write, the approval
question, a denied call (its reason back to the model, nothing written), an approved one, --max-steps, the
/approvals ledger, and an MCP config that is not JSON said in one line while the session goes on. Then
--auto-approve in a one-shot run. What the tiny model writes is its own: only the shape is asserted."""

import os
import sys

import pytest

pexpect = pytest.importorskip("pexpect")
pytestmark = pytest.mark.model  # `localrun chat` on the embedded SmolLM2, in a subprocess

# one thread: on a loaded 2-core host the default threads make a prefill many times slower
CHAT = ["-m", "localrun", "chat", "-t", "1", "--temp", "0", "-n", "48", "--tools", "write", "--tool-choice",
        "write_file", "--max-steps", "1"]


def _env(home):
    return dict(os.environ, LOCALRUN_HOME=str(home), TERM="xterm", COLUMNS="120", LINES="40",
                PROMPT_TOOLKIT_NO_CPR="1")  # pexpect never answers a cursor-position request


def test_approval_denial_diff_and_max_steps(isolated_home, tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    child = pexpect.spawn(sys.executable, CHAT + ["--mcp", "bad.json"], env=_env(isolated_home), cwd=str(tmp_path),
                          encoding="utf-8", timeout=180, dimensions=(40, 120))
    try:
        child.expect("the MCP config bad.json is not JSON")  # one line; the chat starts all the same
        child.expect(">>>")
        child.sendline("Write hello to hello.txt")
        child.expect("→ write_file ")
        child.expect(r"\+\+\+ b/")  # the unified diff comes before the question
        child.expect(r"allow write_file\?")
        child.sendline("n not now")
        child.expect("declined: not now")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]  # nothing written
        child.expect("reached --max-steps 1")
        child.expect("tok/s")
        child.expect(">>>")
        child.sendline("Write hello to hello.txt")
        child.expect(r"allow write_file\?")
        child.sendline("y")
        child.expect("← wrote ")
        child.expect("reached --max-steps 1")
        child.expect(">>>")
        child.sendline("/approvals")
        child.expect(r"no\s+write_file\(.*\(not now\)")
        child.expect(r"yes\s+write_file\(")
        child.expect(">>>")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    written = [p for p in tmp_path.iterdir() if p.name != "bad.json"]
    assert len(written) == 1 and written[0].is_file()


def test_auto_approve_writes_without_asking(isolated_home, tmp_path):
    child = pexpect.spawn(sys.executable, CHAT + ["--auto-approve", "-p", "Write hello to hello.txt"],
                          env=_env(isolated_home), cwd=str(tmp_path), encoding="utf-8", timeout=180)
    try:
        child.expect("→ write_file ")
        child.expect("← wrote ")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert "allow write_file?" not in child.before
    assert child.exitstatus == 0
    assert len(list(tmp_path.iterdir())) == 1
