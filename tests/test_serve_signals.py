"""`localrun serve` as a real process: Ctrl-C (SIGINT) or SIGTERM during a generation, or during a long
prompt's prefill, ends it and the process exits without finishing that work (the generation is cut, the
prefill stops between chunks), releasing the port; `--max-body` bounds the request body. The seconds from
the signal to the exit are printed, not asserted (a busy machine stretches them): what is asserted is the
order of events, and liveness (an exit within 60 s)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.model  # every test here loads a real model

pytest.importorskip("uvicorn")

LOCALRUN = Path(sys.executable).with_name("localrun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_is_free(port: int) -> bool:
    """A new server can listen on ``port``: SO_REUSEADDR (as uvicorn and `localrun serve` bind) passes the
    closed connections' TIME_WAIT, but on Linux not a listening socket still open."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def _start_server(tmp_path, smollm_path, *extra: str) -> tuple[subprocess.Popen, str, int]:
    port = _free_port()
    env = dict(os.environ, LOCALRUN_HOME=str(tmp_path))
    env.pop("LOCALRUN_API_KEY", None)
    cmd = [str(LOCALRUN) if LOCALRUN.exists() else sys.executable, *([] if LOCALRUN.exists() else ["-m", "localrun"]),
           "serve", str(smollm_path), "--port", str(port), "--threads", "1", *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail("localrun serve exited at start:\n" + proc.stdout.read())
        assert time.monotonic() < deadline, "localrun serve did not come up"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, port
        except httpx.HTTPError:
            time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.kill()
    return proc.communicate(timeout=30)[0]


def _metric(url: str, name: str) -> float:
    from helpers import metric_value

    return metric_value(httpx.get(url + "/metrics", timeout=10).text, name)


def _signal_and_time_exit(proc: subprocess.Popen, sig: int) -> float:
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"localrun serve was still running 60 s after signal {sig}")
    return time.monotonic() - t0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_a_stream_ends_it_and_exits(tmp_path, smollm_path, sig):
    proc, url, port = _start_server(tmp_path, smollm_path, "--ctx", "4096", "--parallel", "2",
                                    "--max-body", "64KiB")
    try:
        # --max-body: a 100 KiB body is refused before the signal part
        big = httpx.post(url + "/v1/completions", timeout=30,
                         json={"prompt": "x" * (100 * 1024), "max_tokens": 1})
        assert big.status_code == 413 and "65,536 bytes" in big.json()["error"]["message"]

        seen: list[str] = []
        first = threading.Event()

        def stream():
            body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
            try:
                with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            seen.append(line)
                            first.set()
            except httpx.HTTPError:
                pass
            first.set()

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        assert first.wait(120) and seen, "the stream never started"
        while len(seen) < 4:  # a few tokens into a 2,000-token generation
            assert t.is_alive(), "the stream ended on its own"
            time.sleep(0.05)
        assert httpx.get(url + "/health", timeout=10).json()["active_sequences"] == 1
        dt_s = _signal_and_time_exit(proc, sig)
        t.join(10)
        assert not t.is_alive(), "the client's stream did not end"
    finally:
        out = _stop(proc)
    print(f"exit {dt_s:.2f} s after signal {sig}")
    assert _port_is_free(port)
    assert "Traceback" not in out, out
    assert len(seen) < 2000  # cancelled, not run to its end
    # the stream was ended, not cut: the client got an error event that says why (or at least [DONE])
    assert seen[-1] == "data: [DONE]" and any("shutting down" in s for s in seen), seen[-3:]
    # Ctrl-C ends the server normally (as uvicorn and `ollama serve` do); SIGTERM ends it by that signal
    assert proc.returncode == (0 if sig == signal.SIGINT else -signal.SIGTERM)


def test_sigterm_during_a_long_prefill_exits_before_it_ends(tmp_path, smollm_path):
    proc, url, port = _start_server(tmp_path, smollm_path, "--ctx", "8192", "--parallel", "1")
    try:
        result: dict = {}
        words = "hello " * 6000  # 6,000 tokens: seconds of prefill on a CPU, in chunks of 512

        def ask():
            try:
                r = httpx.post(url + "/v1/completions", timeout=120,
                               json={"prompt": words, "max_tokens": 5})
                result["status"] = r.status_code
            except httpx.HTTPError as e:
                result["error"] = repr(e)

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        deadline = time.monotonic() + 60
        while httpx.get(url + "/health", timeout=10).json()["active_sequences"] < 1:
            assert t.is_alive() and time.monotonic() < deadline, f"the request was never admitted: {result}"
            time.sleep(0.05)
        assert _metric(url, "localrun_generated_tokens_total") == 0, "the prefill ended before the signal"
        dt_s = _signal_and_time_exit(proc, signal.SIGTERM)
        t.join(10)
    finally:
        out = _stop(proc)
    print(f"exit {dt_s:.2f} s after SIGTERM mid-prefill")
    assert _port_is_free(port)
    assert "Traceback" not in out, out
    assert result.get("status") == 503 or "error" in result, result  # told it was cut off, never a 200
