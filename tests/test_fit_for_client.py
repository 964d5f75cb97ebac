"""`localrun fit MODEL --for CLIENT`: the context an agent needs, its first prompt's TTFT and the tool-call
format, from the same client table `localrun launch` uses (``localrun.clients``)."""

from __future__ import annotations

import json

from helpers import localrun_inprocess

from localrun.clients import CLIENTS, get_client


def _fit(*args):
    r = localrun_inprocess("fit", *args)
    assert "Traceback" not in r.stderr
    return r


def test_for_claude_code_plans_its_context_and_says_how_tools_are_written(smollm_path):
    r = _fit(str(smollm_path), "--for", "claude-code", "--json")
    d = json.loads(r.stdout[r.stdout.index("{"):])
    need = CLIENTS["claude"].n_ctx
    assert d["n_ctx"] == need  # --for sets the context when --ctx is not given
    c = d["client"]
    assert (c["client"], c["n_ctx_needed"], c["n_ctx"], c["fits_session"]) == ("Claude Code", need, need, True)
    assert c["tool_calls"] == "generic"  # SmolLM2's template has no tool syntax: serve's generic format
    assert c["ttft_first_prompt_s"] == round(CLIENTS["claude"].first_prompt / d["prefill_tok_s"], 1)
    # trained to 8k: said, with what to do
    assert any("trained to 8192" in a for a in c["advice"])


def test_a_smaller_context_is_kept_and_the_advice_names_the_flag(smollm_path):
    r = _fit(str(smollm_path), "--for", "codex", "--ctx", "16384")
    assert "For Codex CLI (OpenAI Responses)" in r.stdout
    assert "needs a 32768-token context" in r.stdout and "this plan has 16384" in r.stdout
    assert "its first prompt fits" in r.stdout and "--ctx 32768" in r.stdout
    small = _fit(str(smollm_path), "--for", "claude", "--ctx", "4096", "--json")
    c = json.loads(small.stdout[small.stdout.index("{"):])["client"]
    assert not c["fits_first_prompt"] and any("prompt is too long" in a for a in c["advice"])


def test_an_unknown_client_is_a_clear_error():
    r = _fit("--for", "vscode")
    assert r.returncode != 0
    assert "unknown client 'vscode'" in r.stderr and "claude, codex, opencode" in r.stderr
    assert get_client("Claude-Code")[0] == "claude"
