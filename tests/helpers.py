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
    child.sendline("What is the capital of Japan?")
    child.expect("Tokyo")
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

    # asked again after the interrupted story: that prompt's length depends on when the Ctrl-C landed, so no
    # margin can be checked for it and the answer's text is the CPU's; the turn is judged by the session
    child.sendline("What is the capital of Japan?")
    if expect_cached:
        child.expect(r"cached\)")  # the conversation's prefix came from the prompt cache
    child.expect(r"tok/s")  # the answer ended with its stats line
    child.expect(">>>")
    child.sendline("/stats")
    child.expect("messages in history 6")  # and was kept, after the stopped one
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


# ---------------------------------------------------------------------------- CPU-independent text asserts
# llama.cpp's kernels round differently on AVX2 and AVX-512 CPUs (and for different batch sizes), so where
# two candidate tokens are nearly tied the greedy choice flips with the machine: SmolLM2 led "La" 24.07
# against "The" 23.93 for a question the suite used to ask. A test may assert exact text only along a
# greedy path whose every token wins by a wide margin; the margin is checked in the test, so a future
# near-tie fails as "fragile prompt", not as a wrong answer.
ROBUST_MARGIN = 1.0  # logits (= log-probability difference); rounding moves logits by ~0.01-0.2 here


def greedy_trace(engine, prompt, *, max_tokens: int = 24, params=None):
    """Greedy generation of ``prompt`` (a list of ``Message`` → chat template, or a str → raw) with the
    margin of every step: → list of (token text, margin), margin = chosen logit − best other logit.

    The logprobs llama.cpp reports are its raw distribution. With ``params.dry_multiplier`` (chat's
    default), the DRY penalty each candidate got is recomputed exactly (``localrun.backends.dry``, a
    port tested against llama.cpp's own sampler) over the answer so far, and subtracted;
    the runner-up is taken unpenalised, so the margin is a lower bound. Other penalties are refused."""
    from dataclasses import replace

    from localrun.backends.base import SamplingParams
    from localrun.backends.dry import breaker_ids, dry_penalties
    from localrun.backends.llamacpp.sampling import DRY_SEQUENCE_BREAKERS

    p = replace(params or SamplingParams(), temperature=0.0, max_tokens=max_tokens, logprobs=2, seed=0)
    assert p.repeat_penalty == 1.0 and not p.frequency_penalty and not p.presence_penalty, \
        "greedy_trace computes DRY margins only"
    stream = engine.generate(prompt, p) if isinstance(prompt, str) else engine.chat(prompt, p)
    history: list[int] = []  # DRY sees the answer only (llamacpp.sampling.make_sampler)
    breakers = frozenset()
    if p.dry_multiplier > 0:
        texts = ((t, engine.detokenize([t])) for t in range(engine.n_vocab))
        breakers = breaker_ids(texts, DRY_SEQUENCE_BREAKERS)
    out = []
    for chunk in stream:
        for lp in chunk.logprobs or []:
            pen = {}
            if p.dry_multiplier > 0:
                pen = dry_penalties(history, multiplier=p.dry_multiplier, base=p.dry_base,
                                    allowed_length=p.dry_allowed_length,
                                    last_n=engine.n_ctx if p.dry_penalty_last_n < 0 else p.dry_penalty_last_n,
                                    breakers=breakers)
            others = [v for t, v in zip(lp.top_ids, (v for _, v in lp.top)) if t != lp.token_id]
            runner_up = others[0] if others else float("-inf")
            out.append((lp.token, lp.logprob - pen.get(lp.token_id, 0.0) - runner_up))
            history.append(lp.token_id)
    return out


def assert_robust_greedy(engine, prompt, expected: str, *, max_tokens: int = 24, params=None,
                         min_margin: float = ROBUST_MARGIN) -> str:
    """Assert that greedy decoding of ``prompt`` writes ``expected``, and that every token up to and
    including the one that completes it wins by at least ``min_margin``; → the text generated.

    Fails with "fragile prompt" (not "wrong answer") when a step on the way is a near-tie, because then
    the text depends on the CPU the test runs on: choose another prompt."""
    import pytest

    text = ""
    for i, (tok, margin) in enumerate(greedy_trace(engine, prompt, max_tokens=max_tokens, params=params)):
        text += tok
        if margin < min_margin:
            pytest.fail(f"fragile prompt: step {i} ({tok!r}) wins by {margin:.3f} < {min_margin} over the "
                        f"runner-up, so the greedy text depends on the CPU; text so far {text!r}")
        if expected in text:
            return text
    raise AssertionError(f"{expected!r} not in the greedy answer {text!r}")


def localrun_inprocess(*args: str, env: dict[str, str] | None = None):
    """``localrun ARGS`` through the console script's ``main`` in this process: its exit status, stdout and
    stderr as a ``subprocess.CompletedProcess``. For the fast tier: a subprocess costs ~0.4 s of imports,
    and the error handling under test (``cli.main``) is the same code. Tests that check what a fresh
    process imports, signals or a terminal keep using a subprocess."""
    import contextlib
    import io
    import os
    import subprocess

    from localrun.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(["localrun", *args], code, out.getvalue(), err.getvalue())


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` in Prometheus ``text`` whose labels include ``labels`` (so a test
    reads a per-model series, or all models together, without spelling every label)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def parse_labels(labels: str) -> dict[str, str]:
    """``'{a="x",b="y"}'`` → ``{"a": "x", "b": "y"}`` (the label text the older tests spell)."""
    import re

    return dict(re.findall(r'(\w+)="([^"]*)"', labels))


def mlx_smollm_engine(smollm_path, tmp_path_factory, *, n_ctx: int = 1024, chat_template: str | None = None):
    """Generator for a fixture: SmolLM2's GGUF loaded on the MLX backend (its own LOCALRUN_HOME for the
    converted weights), closed when the fixture ends. Use as ``yield from mlx_smollm_engine(...)``."""
    import pytest

    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALRUN_HOME", str(tmp_path_factory.mktemp("mlx_home")))
        plan = simple_plan(read_gguf(smollm_path), n_ctx=n_ctx)
        plan.backend = "mlx"
        eng = load_engine(smollm_path, plan, chat_template=chat_template)
        yield eng
        eng.close()


def serve_run_kwargs(monkeypatch, tmp_path, *args: str) -> dict:
    """The keywords `localrun serve ARGS` passes to ``run_server`` (on a free port; nothing is served):
    the CLI's parsing of serve's options, checked without a model or a socket held."""
    from typer.testing import CliRunner

    import localrun.commands.serve as serve_cmd
    from localrun.cli import app

    seen: list[dict] = []
    monkeypatch.setattr(serve_cmd, "run_server", lambda *a, **kw: seen.append(kw))
    monkeypatch.setenv("LOCALRUN_HOME", str(tmp_path))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    r = CliRunner().invoke(app, ["serve", "--port", port, *args])
    assert r.exit_code == 0, r.output
    return seen.pop()
