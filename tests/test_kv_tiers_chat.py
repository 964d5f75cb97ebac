"""`localrun chat` /save → a new process → /load (issue 17): the conversation's KV comes back from the
FILE.kv next to the messages, and the next turn evaluates only its own tokens."""

import os
import sys

import pytest

pexpect = pytest.importorskip("pexpect")
pytestmark = pytest.mark.model  # `localrun chat` on the embedded SmolLM2, in subprocesses

LIST = " ".join(f"Item {i} is a {['red', 'blue', 'green'][i % 3]} box." for i in range(8))  # ≈ 65 tokens


def _spawn(home):
    env = dict(os.environ, LOCALRUN_HOME=str(home), TERM="xterm", COLUMNS="200", LINES="40",
               PROMPT_TOOLKIT_NO_CPR="1")
    return pexpect.spawn(sys.executable, ["-m", "localrun", "chat", "--temp", "0", "-n", "6"], env=env,
                         encoding="utf-8", timeout=300, dimensions=(40, 200))


def test_save_then_load_in_a_new_process_prefills_only_the_new_turn(isolated_home, tmp_path):
    saved = tmp_path / "chat.json"
    child = _spawn(isolated_home)
    try:
        child.expect(">>>")
        child.sendline(f"Remember this list. {LIST} Which items are red?")
        child.expect(r"prompt (\d+) tok · ")
        first_prompt = int(child.match.group(1))
        child.expect(">>>")
        child.sendline(f"/save {saved}")
        child.expect("saved 2 messages")
        child.expect(">>>")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert saved.with_name("chat.json.kv").is_file()
    child = _spawn(isolated_home)
    try:
        child.expect(">>>")
        child.sendline(f"/load {saved}")
        child.expect(r"loaded 2 messages and (\d+) tokens of KV cache")
        restored = int(child.match.group(1))
        child.expect(">>>")
        child.sendline("And blue?")
        child.expect(r"prompt (\d+) tok \((\d+) cached\)")
        n_prompt, n_cached = int(child.match.group(1)), int(child.match.group(2))
        child.expect(">>>")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert restored > first_prompt and n_cached == restored
    assert 0 < n_prompt - n_cached <= 16  # the new user turn and the assistant header, nothing older


def test_resume_continues_a_saved_conversation_without_prefill(isolated_home, tmp_path):
    """`localrun chat --resume FILE -p ...` twice: the first starts FILE, the second continues it from
    FILE.kv (stats: only the new turn is evaluated) and saves it back (4 messages)."""
    import json
    import re
    import subprocess

    env = dict(os.environ, LOCALRUN_HOME=str(isolated_home))
    saved = tmp_path / "talk.json"

    def ask(text):
        r = subprocess.run([sys.executable, "-m", "localrun", "chat", "--temp", "0", "-n", "6", "-v",
                            "--resume", str(saved), "-p", text], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stderr

    ask(f"Remember this list. {LIST} Which items are red?")
    assert len(json.loads(saved.read_text())["messages"]) == 2 and saved.with_name("talk.json.kv").is_file()
    err = ask("And blue?")
    restored = int(re.search(r"resumed 2 messages and (\d+) tokens of KV cache", err).group(1))
    n_prompt, n_cached = map(int, re.search(r"prompt (\d+) tok \((\d+) cached\)", err).groups())
    assert n_cached == restored and 0 < n_prompt - n_cached <= 16
    assert len(json.loads(saved.read_text())["messages"]) == 4
