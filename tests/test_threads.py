"""``LOCALRUN_THREADS``: the CPU threads llama.cpp runs with where no ``--threads`` was given (what the test
workers set so that their threads together stay within the cores), a bad value a clear error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from localrun.config import env_threads
from localrun.errors import ConfigError


@pytest.mark.parametrize("raw, want", [(None, None), ("", None), ("3", 3), (" 1 ", 1)])
def test_env_threads_reads_a_positive_integer(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("LOCALRUN_THREADS", raising=False)
    else:
        monkeypatch.setenv("LOCALRUN_THREADS", raw)
    assert env_threads() == want


@pytest.mark.parametrize("raw", ["0", "-2", "two", "1.5"])
def test_a_bad_value_says_what_to_set(monkeypatch, raw):
    monkeypatch.setenv("LOCALRUN_THREADS", raw)
    with pytest.raises(ConfigError) as e:
        env_threads()
    assert repr(raw) in str(e.value) and "integer ≥ 1" in e.value.hint


def test_a_bad_value_is_one_line_from_the_cli_not_a_traceback(tmp_path):
    env = dict(os.environ, LOCALRUN_THREADS="lots", LOCALRUN_HOME=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "localrun", "chat", "-p", "hi", "-n", "1"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "LOCALRUN_THREADS='lots' is not a thread count" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("threads", ["1", "2"])
def test_the_engine_runs_with_the_threads_it_names(smollm_path, monkeypatch, threads):
    """An engine loaded through ``loading.load_model`` (chat, serve, bench) without ``--threads``: llama.cpp's
    context has ``LOCALRUN_THREADS`` threads for decode and for batches."""
    from llama_cpp import llama_cpp as C

    from localrun.loading import load_model

    monkeypatch.setenv("LOCALRUN_THREADS", threads)
    loaded = load_model(str(smollm_path), n_ctx=256, force=True)
    try:
        ctx = loaded.engine.ctx
        assert C.llama_n_threads(ctx) == C.llama_n_threads_batch(ctx) == int(threads)
        assert loaded.engine.plan.n_threads == int(threads)
    finally:
        loaded.engine.close()
