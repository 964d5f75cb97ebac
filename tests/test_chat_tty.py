"""`localrun chat` driven in a real pseudo-terminal, as a person would: streaming, a slash command,
Ctrl-C in the middle of an answer, another question that is answered, /exit."""

import os
import sys

import pytest
from helpers import drive_chat_session

pexpect = pytest.importorskip("pexpect")
pytestmark = pytest.mark.model  # `localrun chat` on the embedded SmolLM2, in a subprocess


def test_interactive_session(isolated_home):
    env = dict(os.environ, LOCALRUN_HOME=str(isolated_home), TERM="xterm", COLUMNS="120", LINES="40",
               PROMPT_TOOLKIT_NO_CPR="1")  # pexpect never answers a cursor-position request
    child = pexpect.spawn(sys.executable, ["-m", "localrun", "chat", "--temperature", "0"], env=env,
                          encoding="utf-8", timeout=180, dimensions=(40, 120))
    try:
        drive_chat_session(child)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_esc_enter_inserts_a_newline(isolated_home, tmp_path):
    """Esc then Enter (what /help and the README promise) adds a line to the message; Enter sends it."""
    import json

    env = dict(os.environ, LOCALRUN_HOME=str(isolated_home), TERM="xterm", COLUMNS="120", LINES="40",
               PROMPT_TOOLKIT_NO_CPR="1")  # pexpect never answers a cursor-position request
    child = pexpect.spawn(sys.executable, ["-m", "localrun", "chat", "--temp", "0", "-n", "4"], env=env,
                          encoding="utf-8", timeout=180, dimensions=(40, 120))
    saved = tmp_path / "chat.json"
    try:
        child.expect(">>>")
        child.send("line one")
        child.send("\x1b\r")  # Esc, Enter
        child.send("line two\r")
        child.expect("tok/s")  # answered: the message was sent once, with both lines
        child.expect(">>>")
        child.sendline(f"/save {saved}")
        child.expect("saved")
        child.expect(">>>")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    msgs = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    assert msgs[0]["content"] == "line one\nline two"
