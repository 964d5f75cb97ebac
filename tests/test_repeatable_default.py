"""Repeatable output with the default settings (issue 34, item 1).

Speculative decoding is not exact yet (a verify step's batch shape can move llama.cpp's logits: on Gemma-3,
two sequences x 4+ drafted tokens move the 4th position's logits by ~0.5 nats), so ``--spec`` is ``off`` by
default. These tests hold the default to its promise: a default ``localrun serve`` (``--parallel 4``) gives
one text, token for token, for identical greedy requests sent one after another (2) and all at once (8), and
likewise for identical seeded requests; ``localrun chat -p`` likewise across runs. Each text is long enough
to reach the token where the reported ones parted (SmolLM2 through its chat template: a raw completion of
this prompt is one end-of-turn token). Speculation's own tests set the mode explicitly (tests/test_spec*.py).

Gemma-3's concurrent cases hold for this module's sequence of requests, not for every burst: the open Gemma
fault (a sequence's logits move with the other sequences' KV lengths, tests/test_batch_equivalence.py's
strict xfail) parted identical seeded requests in 6 of 13 bursts of 5 or 8 sent outside this module
(docs/serve.md, "Reproducibility"). A fix of that fault makes them hold for any burst.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent / "clients"))
from harness import Serve  # noqa: E402

N = 8  # concurrent: each batch composition, from 1 to 4 running, meets the same request
N_SEQUENTIAL = 2  # sequential: the first runs cold, the second from the cached prompt (a third would again)
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
MAX_TOKENS = {"smollm": 160, "gemma": 32}  # reported: SmolLM2's texts parted after ~125 tokens, Gemma-3's at 18
# SmolLM2 is an instruct model: asked through its chat template (a raw completion of this prompt is its end of
# turn at once, one token: nothing to compare). Gemma-3-270M is a base model without one: a plain completion.
CHAT = {"smollm": True, "gemma": False}


@pytest.fixture(scope="module", params=["smollm", "gemma"])
def server(request, tmp_path_factory):
    path = request.getfixturevalue("smollm_path" if request.param == "smollm" else "gemma_path")
    srv = Serve(path, tmp_path_factory.mktemp(f"repeat-{request.param}"), "--parallel", "4")
    srv.max_tokens, srv.chat = MAX_TOKENS[request.param], CHAT[request.param]
    try:
        yield srv
    finally:
        srv.close()


def _ask(srv: Serve, **sampling) -> tuple[str, list | None, dict]:
    """(text, the tokens as the server reports them, usage) of one request."""
    body = {"model": "m", "max_tokens": srv.max_tokens, "ignore_eos": True, **sampling}  # every text as long
    if srv.chat:
        body.update(messages=[{"role": "user", "content": PROMPT}], logprobs=True)
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=600)
    else:
        body.update(prompt=PROMPT, logprobs=0)
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if srv.chat:
        text = choice["message"]["content"]
        tokens = [tuple(t["bytes"]) for t in (choice.get("logprobs") or {}).get("content") or []] or None
    else:
        text, tokens = choice["text"], (choice.get("logprobs") or {}).get("tokens")
    return text, tokens, r.json()["usage"]


def _all(srv: Serve, concurrent: bool, **sampling):
    if not concurrent:
        return [_ask(srv, **sampling) for _ in range(N_SEQUENTIAL)]
    with ThreadPoolExecutor(N) as pool:
        return list(pool.map(lambda _: _ask(srv, **sampling), range(N)))


@pytest.mark.model  # spawns `localrun serve` on real models
@pytest.mark.parametrize("concurrent", [False, True], ids=["sequential", "concurrent"])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 7}], ids=["greedy", "seeded"])
def test_identical_requests_give_one_text(server, concurrent, sampling):
    answers = _all(server, concurrent, **sampling)
    texts = {a[0] for a in answers}
    assert len(texts) == 1, f"{len(texts)} different texts for one request sent {len(answers)} times: {sorted(texts)!r}"
    assert len({tuple(a[1] or ()) for a in answers}) == 1  # token for token
    # long enough to reach where the reported texts parted (SmolLM2 ~125 tokens, Gemma-3 18) on any CPU: an
    # end of turn that comes earlier where the kernels round differently does not end the comparison
    assert answers[0][2]["completion_tokens"] == server.max_tokens, answers[0][2]
    assert answers[0][1] and len(answers[0][1]) == answers[0][2]["completion_tokens"]
    assert all("speculative" not in a[2] for a in answers)  # the default does not speculate


def test_chat_prompt_is_repeatable(smollm_path, isolated_home):
    """``localrun chat -p`` (greedy) with the default settings prints the same answer run after run."""
    cmd = [sys.executable, "-m", "localrun", "chat", str(smollm_path), "-p", PROMPT, "--temp", "0",
           "-n", str(MAX_TOKENS["smollm"])]
    outs = [subprocess.run(cmd, capture_output=True, text=True, timeout=600) for _ in range(2)]  # each cold
    for o in outs:
        assert o.returncode == 0, o.stderr[-2000:]
    assert len({o.stdout for o in outs}) == 1 and outs[0].stdout.strip()


def test_spec_is_off_by_default_and_on_with_a_draft_model():
    from localrun.backends.spec_decode import spec_mode_or_default

    assert spec_mode_or_default(None, None) == "off"
    assert spec_mode_or_default(None, "draft.gguf") == "auto"  # asking for a draft model asks for speculation
    assert spec_mode_or_default("ngram", None) == "ngram" and spec_mode_or_default("off", "d.gguf") == "off"
