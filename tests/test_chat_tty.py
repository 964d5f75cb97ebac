"""`localrun chat` driven in a real pseudo-terminal, as a person would: streaming, a slash command,
Ctrl-C in the middle of an answer, another question that is answered, /exit."""

import os
import sys

import pytest
from helpers import drive_chat_session

pexpect = pytest.importorskip("pexpect")
pytestmark = pytest.mark.model  # `localrun chat` on the embedded SmolLM2, in a subprocess


def test_interactive_session(isolated_home):
    env = dict(os.environ, LOCALRUN_HOME=str(isolated_home), TERM="xterm", COLUMNS="120", LINES="40")
    child = pexpect.spawn(sys.executable, ["-m", "localrun", "chat", "--temperature", "0"], env=env,
                          encoding="utf-8", timeout=180, dimensions=(40, 120))
    try:
        drive_chat_session(child)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
