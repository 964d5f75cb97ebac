"""`localrun chat` driven in a real pseudo-terminal, as a person would: streaming, a slash command,
Ctrl-C in the middle of an answer, another question that is answered, /exit."""

import os
import sys

import pytest

pexpect = pytest.importorskip("pexpect")


def test_interactive_session(isolated_home):
    env = dict(os.environ, LOCALRUN_HOME=str(isolated_home), TERM="xterm", COLUMNS="120", LINES="40")
    child = pexpect.spawn(sys.executable, ["-m", "localrun", "chat", "--temperature", "0"], env=env,
                          encoding="utf-8", timeout=180, dimensions=(40, 120))
    try:
        child.expect(">>>")
        child.sendline("What is the capital of France?")
        child.expect("Paris")
        child.expect(r"tok/s")  # the stats line after the answer
        child.expect(">>>")

        child.sendline("/system You are a helpful assistant.")
        child.expect("system prompt set")
        child.expect(">>>")

        child.sendline("Write a very long story about a dragon and a knight.")
        child.expect_exact("\x1b[?2004l")  # prompt_toolkit has handed the terminal back (cooked mode)
        child.expect(r"\w+ \w+ \w+ \w+")  # the answer is streaming words
        child.sendintr()  # Ctrl-C mid-answer
        child.expect("stopped")
        child.expect(">>>")

        child.sendline("/stats")
        child.expect("messages in history 4")  # the interrupted turn was kept
        child.expect(">>>")

        child.sendline("What is the capital of France?")
        child.expect("Paris")
        child.expect(">>>")

        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
