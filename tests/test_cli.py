"""The CLI as a user runs it: real subprocesses, real models, exit codes, no tracebacks."""

import json
import os
import subprocess
import sys

import pytest
from helpers import localrun_inprocess


def run(*args, stdin=None, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "localrun", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=e)


def test_help_is_fast_and_imports_nothing_heavy():
    code = ("import sys, time; t=time.time(); sys.argv=['localrun','--help']\n"
            "from localrun.cli import main\n"
            "try: main()\nexcept SystemExit: pass\n"
            "heavy=[m for m in ('llama_cpp','mlx','fastapi','numpy','gguf') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    assert "chat" in out.stdout and "inspect" in out.stdout


def test_inspect_json_all_three(smollm_path, gemma_path, deepseek_header_path):
    expect = {smollm_path: (30, 9, 3, True), gemma_path: (18, 4, 1, True), deepseek_header_path: (28, 28, 4, False)}
    for path, (layers, heads, kv, complete) in expect.items():
        r = run("inspect", str(path), "--json")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert (d["n_layer"], d["n_head"], d["n_head_kv"], d["weights_complete"]) == (layers, heads, kv, complete)
    r = run("inspect", str(deepseek_header_path))
    assert "INCOMPLETE" in r.stdout and r.returncode == 0


def test_one_shot_prompt_and_piped_stdin(smollm_engine):
    from helpers import assert_robust_greedy

    from localrun.backends.base import Message, SamplingParams

    # chat's defaults (DRY, loop guard) answer this question by a wide margin on every token: CPU-proof
    assert_robust_greedy(smollm_engine, [Message("system", "You are a helpful assistant."),
                                         Message("user", "What is the capital of Japan?")], "Tokyo",
                         params=SamplingParams(dry_multiplier=0.8, stop_loops=True))
    r = run("chat", "--prompt", "What is the capital of Japan?", "--temperature", "0", "--max-tokens", "20")
    assert r.returncode == 0, r.stderr
    assert "Tokyo" in r.stdout
    p = run("chat", "--temperature", "0", "--max-tokens", "20", stdin="What is the capital of Japan?\n")
    assert p.returncode == 0 and p.stdout.strip() == r.stdout.strip()  # only the answer, scriptable


def test_raw_completion_on_base_model(gemma_path):
    r = run("chat", str(gemma_path), "--raw", "-p", "The capital of France is", "--temp", "0", "-n", "10")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split()) >= 3


@pytest.mark.parametrize("case", ["missing", "not_gguf", "truncated", "no_template", "bad_policy", "bad_template",
                                  "log_level", "foreign_host"])
def test_user_errors_are_typed_messages_not_tracebacks(case, tmp_path, gemma_path, deepseek_header_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("definitely not a model")
    args, code, needle = {
        "missing": (["chat", str(tmp_path / "missing.gguf"), "-p", "hi"], 2, "model not found"),
        "not_gguf": (["chat", str(bad), "-p", "hi"], 3, "not a usable GGUF"),
        "truncated": (["chat", str(deepseek_header_path), "-p", "hi"], 3, "weights incomplete"),
        "no_template": (["chat", str(gemma_path), "-p", "hi"], 5, "no chat template"),
        # said before the model is even looked for (a missing file would be exit 2, "model not found")
        "bad_policy": (["chat", str(tmp_path / "missing.gguf"), "-p", "hi", "--context-policy", "sometimes"], 9,
                       "context policy"),
        "bad_template": (["chat", "-p", "hi", "--chat-template", "nonesuch"], 5, "unknown chat template"),
        "log_level": (["serve", "--log-level", "loud"], 9, "unknown --log-level"),
        "foreign_host": (["serve", "--host", "192.0.2.1", "--api-key", "k"], 9, "not an address of this machine"),
    }[case]
    r = run(*args)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert needle in r.stderr.replace("\n", " ")
    assert "hint:" in r.stderr
    assert "Traceback" not in r.stderr


def test_hw_json():
    r = run("hw", "--json")
    assert r.returncode == 0
    d = json.loads(r.stdout)
    assert d["cpu"]["logical_cores"] >= 1 and d["ram_total_bytes"] > 0 and "gpus" in d


@pytest.mark.parametrize("args", [["chat", "--ctx", "0", "-p", "hi"], ["chat", "--bogus"], ["frob"],
                                  ["chat", "--temperature", "-1", "-p", "hi"], ["fit", "--ctx", "abc"]])
def test_bad_flags_are_usage_errors_not_tracebacks(args):
    r = localrun_inprocess(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and ("Invalid value" in r.stderr or "No such" in r.stderr)
    assert "--help" in r.stderr  # says what to do next


def test_hint_with_brackets_is_printed_verbatim(tmp_path):
    r = run("chat", str(tmp_path / "missing[1].gguf"), "-p", "hi")
    assert r.returncode == 2 and "missing[1].gguf" in r.stderr.replace("\n", "")


@pytest.mark.model  # `localrun chat` on the embedded model
def test_one_shot_says_on_stderr_what_the_context_policy_dropped():
    """A prompt longer than --ctx: rolling keeps its end and says so on stderr (stdout stays the answer);
    stop refuses with exit 6 and the ContextOverflowError message."""
    long_prompt = "Remember this line. " * 70 + "What is the capital of Japan?"  # ≈ 290 tokens
    r = run("chat", "--ctx", "256", "--context-policy", "rolling", "--temp", "0", "-n", "8", stdin=long_prompt)
    assert r.returncode == 0, r.stderr
    # what was dropped (not what was kept), said before the answer starts (issue 34)
    assert "note: context full: dropped the first" in r.stderr and "tokens of your message" in r.stderr
    assert "note:" not in r.stdout and r.stdout.strip()
    r = run("chat", "--ctx", "256", "--context-policy", "stop", "--temp", "0", "-n", "8", stdin=long_prompt)
    assert r.returncode == 6 and "error: prompt is" in r.stderr and "Traceback" not in r.stderr
