"""llama.cpp's RPC backend on loopback: two `localrun worker` processes on 127.0.0.1 and the local CPU.

- the same greedy text from a 3-way split (two workers + this process's CPU) as from one process, for
  SmolLM2 and Gemma-3 (two paths compared; the text itself is not asserted);
- `fit --rpc` gives each device the weights, KV and compute-buffer bytes llama.cpp reports allocating
  there (its load log), within 2%. Weights and KV are the planner's arithmetic; the compute buffer comes
  from llama.cpp's own dry run (``backends.llamacpp.dryrun``, ``no_alloc``), since ggml-alloc's graph
  allocation (12–116 MiB for SmolLM2 on a worker, by flash attention, context and the graph's inputs) has
  no closed form. One exception, measured: on SmolLM2 the dry run's first prefill graph puts the first
  RMS norm of the output device's layers on the device before it, so the output device gets one more
  input copy per pipeline copy (4 × n_embd × n_ubatch × 4 B = 4.5 MiB, 4% of its compute buffer) than
  the real allocation; that device's figure may be over by up to 5%, never under. Gemma-3 matches exactly;
- `serve --rpc`: killing a worker mid-stream ends that stream with an error event within 10 s (the read
  timeout), /health says unhealthy, the server process lives, and it serves again once the worker is back;
  a non-streaming request cut the same way gets a 503 (``rpc_worker_lost``);
- the supervisor alone (a stand-in runner process, no llama.cpp): a worker that closes its connection gets
  the runner SIGKILLed at once; only the front's own stop ends it gracefully.

Everything that runs RPC needs a llama-cpp-python built with -DGGML_RPC=on and skips without it. Both
paths run llama.cpp's CPU kernels on plain weights (two sequences: localrun then turns off the repacked
CPU buffers, which a worker's CPU backend does not use either) with the same context settings and flash
attention off, so they compute the same sums. A worker serves one client at a time: every engine here is
closed before the next process connects.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from localrun.machine.rpc import RPC_REINSTALL, probe_rpc

RPC = probe_rpc()
needs_rpc = pytest.mark.skipif(not RPC.available, reason=f"llama-cpp-python without RPC ({RPC.detail}); "
                               f"`localrun hw` says so; to add it: {RPC_REINSTALL}")
PROMPT = "The three most useful things to pack for a week of hiking are"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"process exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port}")


def start_worker(port: int | None = None) -> tuple[subprocess.Popen, str]:
    port = port or _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "localrun", "worker", "--port", str(port), "--threads", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    _wait_port(port, proc)
    return proc, f"127.0.0.1:{port}"


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.fixture(scope="module")
def workers():
    if not RPC.available:
        pytest.skip(needs_rpc.kwargs["reason"])
    started = [start_worker(), start_worker()]
    yield [ep for _, ep in started]
    for p, _ in started:
        stop(p)


def _greedy(path, *, hardware=None, n_gpu_layers=None, raw: bool) -> tuple[str, object]:
    from localrun.backends.base import Message, SamplingParams
    from localrun.loading import load_model

    loaded = load_model(str(path), n_ctx=512, n_parallel=2, n_gpu_layers=n_gpu_layers, flash_attn=False,
                        hardware=hardware, force=True)
    engine = loaded.engine
    try:
        p = SamplingParams(temperature=0.0, max_tokens=16, seed=0)
        stream = engine.generate(PROMPT, p) if raw else engine.chat([Message("user", PROMPT)], p)
        return "".join(c.text for c in stream), loaded.plan
    finally:
        engine.close()


@needs_rpc
@pytest.mark.model
@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_three_way_split_gives_the_same_greedy_text(which, workers, request):
    from localrun.backends.llamacpp.rpc import hardware_for

    path = request.getfixturevalue(f"{which}_path")
    raw = which == "gemma"  # a base model: no chat template
    alone, plan1 = _greedy(path, n_gpu_layers=0, raw=raw)
    from localrun.model.gguf_info import read_gguf

    n_layer = read_gguf(path).n_layer
    # the last 2/3 of the layers on the two workers, the first third on this process's CPU
    split, plan3 = _greedy(path, hardware=hardware_for(",".join(workers)), n_gpu_layers=(2 * n_layer) // 3,
                           raw=raw)
    used = [d for d in plan3.devices if d["n_layers"] or d["output"]]
    assert [d["endpoint"] for d in used] == workers, plan3.devices  # both workers hold layers (or the output) …
    assert sum(d["n_layers"] for d in used) < n_layer  # … and the CPU the rest
    assert plan1.devices in ([], None) or all(not d.get("endpoint") for d in plan1.devices)
    same = ("n_ctx", "n_parallel", "n_batch", "n_ubatch", "kv_type", "flash_attn", "kv_unified")
    assert {k: getattr(plan3, k) for k in same} == {k: getattr(plan1, k) for k in same}
    assert len(alone) > 20
    assert split == alone


_BUF = re.compile(r"(\S+)\s+(model|KV|compute) buffer size\s*=\s*([\d.]+) MiB")


def allocated_by_device(lines: list[str], endpoints: list[str]) -> dict[str, dict[str, int]]:
    """llama.cpp's load log → {endpoint: {"model"/"KV"/"compute": bytes}} for the RPC buffers
    (``RPC<dev>[host:port]``)."""
    out: dict[str, dict[str, int]] = {ep: {} for ep in endpoints}
    for ln in lines:
        m = _BUF.search(ln)
        if m and m.group(1).startswith("RPC"):
            ep = next(e for e in endpoints if f"[{e}]" in m.group(1))
            out[ep][m.group(2)] = out[ep].get(m.group(2), 0) + int(float(m.group(3)) * 1024 * 1024)
    return out


@needs_rpc
@pytest.mark.model  # loads the model onto the workers (its fixture is looked up by name, so not marked by conftest)
@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_fit_rpc_bytes_match_what_llama_cpp_allocates_per_device(workers, which, request):
    from helpers import localrun_inprocess

    from localrun.backends.llamacpp.rpc import hardware_for
    from localrun.loading import load_model

    smollm_path = request.getfixturevalue(f"{which}_path")
    r = localrun_inprocess("fit", str(smollm_path), "--rpc", ",".join(workers), "--ctx", "2048", "--json")
    assert r.returncode == 0, r.stderr
    fit = json.loads(r.stdout)
    planned = [d for d in fit["devices"] if d["n_layers"] or d["output"]]
    assert [d["endpoint"] for d in planned] == workers and all(d["fits"] for d in planned)
    assert all(d["backend"] == "rpc" for d in fit["devices"])
    loaded = load_model(str(smollm_path), n_ctx=fit["n_ctx"], n_gpu_layers=fit["n_gpu_layers"],
                        kv_type=fit["kv_type"], hardware=hardware_for(",".join(workers)))
    try:
        assert [d["n_layers"] for d in loaded.plan.devices] == [d["n_layers"] for d in fit["devices"]]
        got = allocated_by_device(loaded.engine.load_log, workers)
    finally:
        loaded.engine.close()
    for d in planned:
        real = got[d["endpoint"]]
        assert real.get("model") and (real.get("KV") or not d["n_layers"]), (d["endpoint"], real)
        assert d["compute_source"] == "llama.cpp dry run" and real.get("compute"), (d, real)
        for planned_b, real_b, what in ((d["weights_bytes"], real["model"], "weights"),
                                        (d["kv_bytes"], real.get("KV", 0), "KV cache"),
                                        (d["compute_bytes"], real["compute"], "compute buffer")):
            if what == "compute buffer" and d["output"]:  # the dry run's extra input copy (module doc)
                assert real_b <= planned_b <= 1.05 * real_b, (d["endpoint"], what, planned_b, real_b, real)
                continue
            assert abs(planned_b - real_b) <= 0.02 * real_b, (d["endpoint"], what, planned_b, real_b, real)


# -------------------------------------------------------------------------------------------------------
# serve --rpc: a worker that dies
# -------------------------------------------------------------------------------------------------------

def _health(base: str) -> tuple[int, dict]:
    import httpx

    r = httpx.get(f"{base}/health", timeout=5)
    return r.status_code, r.json()


def _wait_health(base: str, server: subprocess.Popen, want: int, timeout_s: float = 180.0) -> dict:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        assert server.poll() is None, "serve --rpc exited"
        try:
            code, body = _health(base)
            if code == want:
                return body
            last = (code, body)
        except Exception as e:  # noqa: BLE001 - not up yet
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"/health never answered {want}: {last}")


@needs_rpc
def test_serve_rpc_survives_a_worker_killed_mid_stream(smollm_path, tmp_path):
    import httpx

    w1, ep1 = start_worker()
    w2, ep2 = start_worker()
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "localrun", "serve", str(smollm_path), "--port", str(port),
                               "--rpc", f"{ep1},{ep2}", "--ctx", "1024", "--parallel", "1"],
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "serve.log", "wb"),
                              env={**os.environ})
    body = {"prompt": PROMPT, "max_tokens": 100000, "ignore_eos": True, "temperature": 0}
    try:
        _wait_health(base, server, 200)
        events = _stream_until_cut(base, body, lambda: w1.send_signal(signal.SIGKILL))
        assert len(events) > 5 and "error" in events[-1], events[-3:]
        assert "unavailable" in events[-1]["error"]["message"]
        assert all("error" not in e for e in events[:-1])
        assert server.poll() is None
        code, health = _health(base)
        assert code == 503 and health["status"] == "unhealthy", health
        for _ in range(20):  # the supervisor's next look names the worker it waits for
            if ep1 in health["reason"]:
                break
            time.sleep(0.1)
            code, health = _health(base)
        assert code == 503 and ep1 in health["reason"], health
        r = httpx.post(f"{base}/v1/completions", json={**body, "max_tokens": 4}, timeout=10)
        assert r.status_code == 503 and r.headers.get("retry-after")

        w1.wait(10)
        w1, _ = start_worker(int(ep1.rsplit(":", 1)[1]))  # the worker comes back: the runner restarts
        health = _wait_health(base, server, 200)
        assert health["status"] == "ok"
        r = httpx.post(f"{base}/v1/completions", json={**body, "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"]

        # a plain (non-streaming) request cut the same way: a 503 in OpenAI's error shape
        import threading

        out = {}
        t = threading.Thread(target=lambda: out.update(r=httpx.post(f"{base}/v1/completions", json=body,
                                                                    timeout=120)))
        t.start()
        while httpx.get(f"{base}/health", timeout=10).json()["active_sequences"] < 1:  # admitted: generating
            assert t.is_alive(), f"the request ended before the worker was killed: {out}"
            time.sleep(0.05)
        w2.send_signal(signal.SIGKILL)
        t.join(300)  # liveness only: the cut request must end (with a 503), not hang until its own timeout
        assert not t.is_alive(), "the cut request did not end"
        assert out["r"].status_code == 503 and out["r"].json()["error"]["code"] == "rpc_worker_lost"
        assert server.poll() is None
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        for w in (w1, w2):
            stop(w)


def _stream_until_cut(base: str, body: dict, kill) -> list[dict]:
    """Stream /v1/completions, call ``kill()`` after the 5th event, return every event (10 s read timeout:
    the cut stream must end within it)."""
    import httpx

    events = []
    with httpx.Client(timeout=httpx.Timeout(10.0)) as c:
        with c.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
                    if len(events) == 5:
                        kill()
    return events


@pytest.mark.model
def test_front_turns_its_runner_dying_into_errors_and_restarts_it(smollm_path):
    """No RPC needed: the runner is a plain `localrun serve`, SIGKILLed as llama.cpp's abort ends it, and the
    "worker" a listening socket this test closes and opens again."""
    import httpx
    from helpers import ServerThread

    from localrun.server.runner import Supervisor, create_front, wait_first_ready

    def listener(port: int = 0) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(8)
        return s

    fake = listener()
    ep = f"127.0.0.1:{fake.getsockname()[1]}"
    sup = Supervisor(lambda port: [sys.executable, "-m", "localrun", "serve", str(smollm_path), "--port", str(port),
                                   "--ctx", "1024", "--parallel", "1"], [ep])
    sup.spawn()
    srv = None
    try:
        assert wait_first_ready(sup)
        srv = ServerThread(create_front(sup))
        body = {"prompt": PROMPT, "max_tokens": 100000, "ignore_eos": True, "temperature": 0}
        r = httpx.post(f"{srv.url}/v1/completions", json={**body, "max_tokens": 3}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"]  # relayed as it is
        first = sup.proc

        def kill():
            fake.close()  # the worker is gone too: no restart until it answers
            first.kill()

        events = _stream_until_cut(srv.url, body, kill)
        assert "error" in events[-1] and all("error" not in e for e in events[:-1]), events[-2:]
        code, health = _health(srv.url)
        assert code == 503 and health["status"] == "unhealthy", health
        r = httpx.post(f"{srv.url}/api/generate", json={"prompt": "hi", "stream": False}, timeout=120)
        assert r.status_code == 503 and "unavailable" in r.json()["error"]  # in Ollama's shape
        for _ in range(20):
            if ep in _health(srv.url)[1]["reason"]:
                break
            time.sleep(0.1)
        assert ep in _health(srv.url)[1]["reason"]
        fake = listener(int(ep.rsplit(":", 1)[1]))  # back: the runner starts again
        deadline = time.monotonic() + 120
        while _health(srv.url)[0] != 200:
            assert time.monotonic() < deadline, _health(srv.url)
            time.sleep(0.1)
        assert sup.restarts == 1 and sup.proc is not first
        r = httpx.post(f"{srv.url}/v1/completions", json={**body, "max_tokens": 3}, timeout=60)
        assert r.status_code == 200
    finally:
        if srv is not None:
            srv.stop()
        sup.stop()
        fake.close()


# -------------------------------------------------------------------------------------------------------
# pure pieces (fast tier)
# -------------------------------------------------------------------------------------------------------

def test_endpoints_parse_and_refuse():
    from localrun.backends.llamacpp.rpc import parse_endpoints
    from localrun.errors import ConfigError

    assert parse_endpoints("127.0.0.1:50052, 10.0.0.2:1,127.0.0.1:50052") == ["127.0.0.1:50052", "10.0.0.2:1"]
    assert parse_endpoints("[::1]:7") == ["::1:7"]
    for bad in ("host", "host:0", "host:x", ":5", ","):
        with pytest.raises(ConfigError):
            parse_endpoints(bad)


def test_runner_gets_the_same_serve_flags_but_its_own_address():
    import typer

    from localrun.cli import app
    from localrun.commands.serve_rpc import runner_args

    cmd = typer.main.get_command(app).commands["serve"]
    args = ["m.gguf", "--port", "9", "--host", "0.0.0.0", "--api-key", "k", "--rpc", "a:1,b:2", "-c", "4096",
            "--no-flash-attn", "--keep-alive", "1m", "--keep-alive", "x=2m", "--cors-origin", "http://x"]
    with cmd.make_context("serve", list(args)) as ctx:
        got = runner_args(ctx)
    assert got[0] == "m.gguf" and "--port" not in got and "--host" not in got and "k" not in got
    with cmd.make_context("serve", got) as ctx2:
        again = {k: v for k, v in ctx2.params.items()}
    with cmd.make_context("serve", list(args)) as ctx:
        want = {k: v for k, v in ctx.params.items() if k not in ("host", "port", "api_key")}
    assert {k: again[k] for k in want} == want


def test_stream_error_speaks_each_format():
    from localrun.server.runner import stream_error

    assert json.loads(stream_error("/api/chat", "application/x-ndjson", "gone")) == {"error": "gone"}
    sse = stream_error("/v1/chat/completions", "text/event-stream", "gone").decode()
    assert sse.startswith("data: ") and json.loads(sse[6:])["error"]["message"] == "gone"
    ant = stream_error("/v1/messages", "text/event-stream", "gone").decode()
    assert ant.startswith("event: error\n") and json.loads(ant.split("data: ", 1)[1])["type"] == "error"


_STAND_IN_RUNNER = r"""
import signal, socket, sys, http.server
port, worker_port, flag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
link = socket.create_connection(("127.0.0.1", worker_port))  # never read: a close by the worker is CLOSE_WAIT

def graceful(*_):
    open(flag, "w").write("graceful")  # where a real runner would answer its requests "shutting_down"
    sys.exit(0)

signal.signal(signal.SIGTERM, graceful)

class Health(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_lost_worker_kills_the_runner_at_once_and_only_a_stop_is_graceful(tmp_path):
    """The supervisor's part of the cut above, without llama.cpp: the runner stands in as a process that
    holds a TCP connection to a "worker" socket and records a SIGTERM. A worker that closes its side is
    seen (CLOSE_WAIT) and the runner gets SIGKILL, so it cannot answer its in-flight requests "the server is
    shutting down" (503 ``shutting_down``, relayed by the front as is: seen once in CI instead of
    ``rpc_worker_lost``); the front's own stop is the one graceful end."""
    from localrun.server.runner import Supervisor

    script = tmp_path / "runner.py"
    script.write_text(_STAND_IN_RUNNER)
    for how in ("worker lost", "stop"):
        worker = socket.create_server(("127.0.0.1", 0))
        ep = f"127.0.0.1:{worker.getsockname()[1]}"
        flag = tmp_path / f"{how}.flag"
        sup = Supervisor(lambda port: [sys.executable, str(script), str(port), ep.rsplit(":", 1)[1], str(flag)],
                         [ep])
        try:
            sup.spawn()
            conn, _ = worker.accept()
            for _ in range(100):
                sup.step()
                if sup.state == "up":
                    break
                time.sleep(0.1)
            assert sup.state == "up", sup.reason
            proc = sup.proc
            if how == "stop":
                sup.stop()
                assert proc.returncode == 0 and flag.read_text() == "graceful"
                continue
            conn.close()
            for _ in range(100):
                sup.step()
                if sup.state != "up":
                    break
                time.sleep(0.1)
            assert sup.state == "down" and ep in sup.reason, (sup.state, sup.reason)
            assert proc.returncode == -signal.SIGKILL and not flag.exists()
        finally:
            sup.stop()
            worker.close()
