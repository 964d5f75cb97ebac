"""`localrun serve` pieces without a running server: bind policy, converters, error mapping, queue bound,
and the real `localrun serve` command started as a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from localrun.errors import BackendError, ConfigError, ContextOverflowError, ModelNotFoundError


def test_non_loopback_bind_without_key_is_refused(tmp_path):
    from localrun.commands.serve import check_bind, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("myhost")
    with pytest.raises(ConfigError) as ei:
        check_bind("0.0.0.0", None, False)
    assert "--api-key" in ei.value.hint and "--insecure" in ei.value.hint
    check_bind("0.0.0.0", "k", False)
    check_bind("0.0.0.0", None, True)
    check_bind("127.0.0.1", None, False)
    env = dict(os.environ, LOCALRUN_HOME=str(tmp_path))
    env.pop("LOCALRUN_API_KEY", None)
    r = subprocess.run([sys.executable, "-m", "localrun", "serve", "--host", "0.0.0.0"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == ConfigError.exit_code
    assert "refusing to listen on 0.0.0.0" in r.stderr and "Traceback" not in r.stderr


def test_port_in_use_is_a_config_error():
    from localrun.commands.serve import check_port_free

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError):
            check_port_free("127.0.0.1", s.getsockname()[1])


def test_error_status_by_type():
    from localrun.server.errors import QueueFullError, RequestError, error_info

    assert error_info(ContextOverflowError(5000, 1024))[0] == 400
    assert error_info(ContextOverflowError(5000, 1024))[1]["error"]["code"] == "context_length_exceeded"
    assert error_info(ModelNotFoundError("x"))[0] == 404
    assert error_info(QueueFullError(3))[0] == 503
    assert error_info(BackendError("boom"))[0] == 500
    assert error_info(RequestError("big", status=413))[0] == 413


def test_template_supports_tools():
    from localrun.model.chat_template import template_supports_tools

    assert template_supports_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not template_supports_tools("{{ messages }}")


def test_request_conversion():
    from localrun.server.errors import RequestError
    from localrun.server.ollama.convert import sampling_from_ollama
    from localrun.server.ollama.schemas import OllamaOptions
    from localrun.server.openai.convert import messages_from_openai, sampling_from_openai
    from localrun.server.openai.schemas import ChatCompletionRequest

    req = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "user", "content": "hi"},
            ],
            "stop": "END",
            "temperature": 0,
            "logit_bias": {"42": 5},
        }
    )
    msgs = messages_from_openai(req.messages)
    assert msgs[0] == {"role": "system", "content": "ab"}
    p = sampling_from_openai(req, max_tokens=7, logprobs=None)
    assert p.stop == ["END"] and p.temperature == 0 and p.max_tokens == 7 and p.logit_bias == {42: 5.0}
    with pytest.raises(RequestError):
        messages_from_openai([])
    with pytest.raises(RequestError):
        sampling_from_openai(
            ChatCompletionRequest.model_validate({"messages": [], "logit_bias": {"x": 1}}),
            max_tokens=None,
            logprobs=None,
        )
    p = sampling_from_ollama(OllamaOptions(num_predict=-1, temperature=0.2, stop=["\n"]), "json")
    assert p.max_tokens is None and p.temperature == 0.2 and p.stop == ["\n"] and p.grammar is None
    assert p.constraint is not None and p.constraint.kind == "json_object"  # Ollama's JSON mode (llguidance)


def test_queue_is_bounded(smollm_engine):
    """``max_queue`` places beyond the free slots: with 1 slot and 2 places, 3 requests are accepted at once
    even though the (unstarted) scheduler has admitted none of them yet."""
    import asyncio

    from localrun.backends.base import SamplingParams
    from localrun.server.errors import QueueFullError, ShuttingDownError
    from localrun.server.metrics import ServerMetrics
    from localrun.server.scheduler import Job, Scheduler

    assert smollm_engine.n_parallel == 1
    metrics = ServerMetrics().for_model("m", 1, 2048)
    sched = Scheduler(smollm_engine, metrics, max_queue=2)  # not started: nothing is admitted
    loop = asyncio.new_event_loop()
    try:
        jobs = [Job(loop=loop, queue=asyncio.Queue(), tokens=[1, 2], params=SamplingParams()) for _ in range(5)]
        for j in jobs[:3]:
            sched.submit(j)
        with pytest.raises(QueueFullError):
            sched.submit(jobs[3])
        sched.cancel(jobs[0])
        sched.submit(jobs[3])
        assert sched.n_waiting == 3
        sched.shutdown()  # SIGINT: every waiting request ends with ShuttingDownError, new ones are refused
        with pytest.raises(ShuttingDownError):
            sched.submit(jobs[4])
        loop.run_until_complete(asyncio.sleep(0))
        for j in jobs[1:4]:
            kind, err = j.queue.get_nowait()
            assert kind == "error" and isinstance(err, ShuttingDownError)
        assert sched.n_waiting == 0 and sched.idle
    finally:
        loop.close()


def test_parse_max_body():
    from localrun.commands.serve import parse_max_body

    assert parse_max_body("8MiB") == 8 * 1024 * 1024 and parse_max_body("512KiB") == 512 * 1024
    for bad in ("lots", "12"):
        with pytest.raises(ConfigError) as ei:
            parse_max_body(bad)
        assert "8MiB" in ei.value.hint


def test_parse_json_body_names_the_field():
    from localrun.server.body import parse_json_body
    from localrun.server.errors import RequestError

    assert parse_json_body(rb'{"a": [1, 2.5, "x\\ud800"]}') == {"a": [1, 2.5, "x\\ud800"]}  # an escaped backslash
    cases = {
        b'{"a": {"b": [1, NaN]}}': "a.b.1",
        b'{"t": 1e999}': "t",
        b'{"m": [{"c": "\\ud800"}]}': "m.0.c",
        b'{"x": -Infinity}': "x",
    }
    for body, field in cases.items():
        with pytest.raises(RequestError) as ei:
            parse_json_body(body)
        assert ei.value.param == field and ei.value.status == 400, body
    for body in (b"[]", b"{", b'{"a": "\xff"}', b"[" * 70 + b"]" * 70, b'{"a": ' * 65 + b"1" + b"}" * 65):
        with pytest.raises(RequestError):
            parse_json_body(body)
    assert parse_json_body(b'{"s": "' + b"[" * 500 + b'"}')["s"] == "[" * 500  # brackets inside a string


@pytest.mark.slow
@pytest.mark.model  # `localrun serve` loads the embedded model in a subprocess
def test_localrun_serve_command(tmp_path):
    """`localrun serve` from the shell: loads the default model through the planner and answers."""
    openai = pytest.importorskip("openai")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, LOCALRUN_HOME=str(tmp_path), LOCALRUN_API_KEY="k1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localrun",
            "serve",
            "--port",
            str(port),
            "--threads",
            "1",
            "--ctx",
            "512",
            "--parallel",
            "2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "localrun serve did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k1", timeout=120, max_retries=0)
        r = c.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )  # started with no model: "default" (or no model field) is the embedded SmolLM2, loaded now
        assert r.choices[0].message.content
        ps = httpx.get(f"http://127.0.0.1:{port}/api/ps", headers={"Authorization": "Bearer k1"}).json()
        plan = ps["models"][0]["localrun"]["plan"]
        assert plan["n_parallel"] == 2 and plan["n_ctx"] == 512
    finally:
        proc.terminate()
        try:
            out = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
    assert "Traceback" not in out
