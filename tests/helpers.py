"""Helpers shared by the server and chat tests (not fixtures: plain code)."""

from __future__ import annotations

import socket
import threading
import time


class ServerThread:
    """uvicorn running ``app`` in a thread on a free 127.0.0.1 port; ``url`` is its base URL."""

    def __init__(self, app) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def drive_chat_session(child, *, expect_cached: bool = False) -> None:
    """The person-at-a-terminal script shared by the llama.cpp and MLX chat tests: a question answered
    while streaming, a slash command, Ctrl-C in the middle of a long answer, /stats showing the
    interrupted turn kept, another question answered, /exit. ``child`` is a pexpect spawn of
    `localrun chat`. prompt_toolkit draws ">>> " with escape codes, so ">>>" is matched."""
    import pexpect

    child.expect(">>>")
    child.sendline("What is the capital of France?")
    child.expect("Paris")
    child.expect(r"tok/s")  # the stats line after the answer
    child.expect(">>>")

    child.sendline("/system You are a helpful assistant.")
    child.expect("system prompt set")
    child.expect(">>>")

    child.sendline("Write a very long story about a dragon and a knight.")
    # prompt_toolkit redraws the accepted line, then turns bracketed paste off and hands the terminal
    # back (cooked mode): only from then on is Ctrl-C a SIGINT rather than a key it reads and drops.
    child.expect_exact("\x1b[?2004l")
    child.expect(r"\w+ \w+ \w+ \w+")  # the answer is streaming words
    child.sendintr()  # Ctrl-C mid-answer
    child.expect("stopped")
    child.expect(">>>")

    child.sendline("/stats")
    child.expect("messages in history 4")  # the interrupted turn was kept
    child.expect(">>>")

    child.sendline("What is the capital of France?")
    child.expect("Paris")
    if expect_cached:
        child.expect(r"cached\)")  # the conversation's prefix came from the prompt cache
    child.expect(">>>")

    child.sendline("/exit")
    child.expect(pexpect.EOF)


def stream_and_full(client, msgs: list[dict], max_tokens: int):
    """The same greedy chat request sent plain and streamed (with usage) through the openai client; asserts
    the streamed text, finish reason and completion tokens equal the plain ones. → (plain, streamed usage)."""
    full = client.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=max_tokens)
    assert full.choices[0].message.content and full.usage.completion_tokens > 0 and full.usage.prompt_tokens > 0
    parts, usage, finish = [], None, None
    for ch in client.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=max_tokens,
                                             stream=True, stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(parts) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens
    return full, usage
