"""Speculative decoding on the MLX backend (issue 15, item 5), through mlx[cpu]: prompt lookup and a draft
model (the ``draft_pair`` fixture: a Q8_0 SmolLM2 written by llama.cpp's quantizer as the target, which MLX
loads natively, and the shipped Q4_1 as the draft). Every test compares speculation against plain decoding
on the same engine (token ids), so nothing depends on the CPU's rounding."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from localrun.backends.base import Constraint, Message, SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=16)
EDIT = ("Repeat this list exactly, changing only 'pear' to 'plum':\n"
        "apple, banana, cherry, pear, grape, lemon, mango, orange, peach, kiwi, lime, melon")


@pytest.fixture(scope="module")
def target(draft_pair, tmp_path_factory):
    from helpers import mlx_smollm_engine

    yield from mlx_smollm_engine(draft_pair[0], tmp_path_factory)


def _prompt(eng, text: str) -> list[int]:
    return eng.tokenize_chat([Message("user", text)])[1]


_PLAIN: dict[tuple, tuple] = {}


def _warm(eng, prompt) -> None:
    """Leave ``prompt[:-1]`` in the engine's cache, computed once: every measured run then reuses the same
    cached KV and evaluates the prompt's last token itself, so plain and speculative runs start from one
    state (a cold prefill of the whole prompt takes ~6 s on mlx[cpu]; the runs compare, so any one shared
    start does). A run that starts cold is thrown away."""
    if eng._cache is not None and eng._cache_tokens[:len(prompt) - 1] == list(prompt[:-1]):
        return
    eng.reset_cache()
    spec = eng.speculation
    eng.speculation = None  # a one-token warm-up drafts nothing either way
    try:
        list(eng.generate(prompt, SamplingParams(temperature=0, max_tokens=1)))
    finally:
        eng.speculation = spec


def _run(eng, prompt, params):
    """(token ids, last chunk) of a run from the warm prompt (``_warm``). Runs without speculation are
    computed once per (prompt, params): several tests compare against the same plain run."""
    key = (tuple(prompt), repr(params)) if eng.speculation is None else None
    if key in _PLAIN:
        return _PLAIN[key]
    _warm(eng, prompt)
    chunks = list(eng.generate(prompt, params))
    assert chunks[-1].stats.cached_tokens == len(prompt) - 1  # the warm path, every time
    out = [c.token_id for c in chunks], chunks[-1]
    if key is not None:
        _PLAIN[key] = out
    return out


# 3 drafted tokens a step: MLX's CPU kernels make a verify step of k tokens cost nearly k plain steps, so
# longer drafts only slow the tests down; what they check (drafts verified, kept or cut) needs no more
def _set(eng, mode, draft=None, *, adaptive=True, draft_max=3):
    eng.set_speculation(mode, draft_max, str(draft) if draft else None)
    if eng.speculation is not None:
        eng.speculation.adaptive = adaptive


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_greedy_identical(target, draft_pair, mode):
    prompt = _prompt(target, EDIT)
    p = GREEDY
    _set(target, "off")
    plain, _ = _run(target, prompt, p)
    _set(target, mode, draft_pair[1], adaptive=False)
    spec, last = _run(target, prompt, p)
    assert spec == plain
    st = last.stats
    assert st.draft_tokens > 0 and st.accepted_tokens > 0  # it did speculate, and kept some
    assert st.completion_tokens == len(plain)
    totals = target.speculation.totals()
    assert totals["mode"] == mode and totals["draft_tokens"] >= st.draft_tokens
    assert totals["acceptance_rate"] == pytest.approx(totals["accepted_tokens"] / totals["draft_tokens"])


def test_auto_mode_same_text(target):
    """Adaptive: it measures a plain step first, then drafts only where it pays; the text stays the same."""
    prompt = _prompt(target, EDIT)
    p = GREEDY  # the plain run is test_greedy_identical's (``_PLAIN``)
    _set(target, "off")
    plain, _ = _run(target, prompt, p)
    _set(target, "auto")
    spec, last = _run(target, prompt, p)
    assert spec == plain
    totals = target.speculation.totals()
    assert totals["plain_steps"] + totals["verify_steps"] > 0


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_seeded_sampling_identical(target, draft_pair, mode):
    """The deterministic rule splits the key once per emitted token, as plain decoding: same seed, same tokens."""
    prompt = _prompt(target, EDIT)
    _set(target, "off")
    runs = [SamplingParams(temperature=0.7, top_k=20, seed=s, max_tokens=10) for s in range(2)]
    plain = [_run(target, prompt, p)[0] for p in runs]
    _set(target, mode, draft_pair[1], adaptive=False)
    spec = [_run(target, prompt, p)[0] for p in runs]
    assert spec == plain
    assert target.speculation.totals()["accepted_tokens"] > 0


def test_stop_string_constraint_penalty_and_logprobs_same(target):
    prompt = _prompt(target, EDIT)
    # the regex ends the list after 3 more items, where the model (and an n-gram draft) would go on: the
    # grammar forces "." against the drafted ","
    regex = Constraint("regex", r"apple, banana(, [a-z]+){2,3}\.")
    cases = [SamplingParams(temperature=0, max_tokens=40, stop=["cherry"]),
             SamplingParams(temperature=0, max_tokens=40, constraint=regex),
             SamplingParams(temperature=0, max_tokens=8, repeat_penalty=1.3),
             SamplingParams(temperature=0, max_tokens=8, logprobs=2)]

    def run(p):
        _warm(target, prompt)
        chunks = list(target.generate(prompt, p))
        lps = [(x.token_id, round(x.logprob, 4), x.top_ids) for c in chunks for x in c.logprobs or []]
        return [c.token_id for c in chunks], chunks[-1].finish_reason, lps

    _set(target, "off")
    plain = [run(p) for p in cases]
    _set(target, "ngram", adaptive=False)
    spec = [run(p) for p in cases]
    assert spec == plain
    assert plain[0][1] == plain[1][1] == "stop"
    assert target.detokenize(plain[1][0]).startswith("apple, banana")
    assert len(plain[3][2]) >= 8


def test_draft_pair_acceptance_is_high(target, draft_pair):
    """Q4_1 drafting for its Q8_0 target agrees on most greedy tokens: near-zero acceptance would mean the
    draft's cache is out of step with the accepted tokens."""
    p = SamplingParams(temperature=0, max_tokens=12)
    _set(target, "draft", draft_pair[1], adaptive=False, draft_max=4)
    drafted = accepted = 0
    for text in ("Explain why the sky is blue in two sentences.", "Write a short poem about the sea."):
        _, last = _run(target, _prompt(target, text), p)
        drafted += last.stats.draft_tokens
        accepted += last.stats.accepted_tokens
    assert drafted >= 12
    assert accepted / drafted > 0.4, (accepted, drafted)
    totals = target.speculation.totals()
    assert (totals["draft_tokens"], totals["accepted_tokens"]) == (drafted, accepted)


def test_prefix_reuse_across_turns_with_speculation(target):
    """A second request that extends the first reuses its cache (rejected drafts were cut off it)."""
    prompt = _prompt(target, EDIT)
    p = SamplingParams(temperature=0, max_tokens=8)
    _set(target, "ngram", adaptive=False)
    first, _ = _run(target, prompt, p)
    follow = prompt + first + target.tokenize("\nAgain:", add_special=False)
    warm = list(target.generate(follow, p))
    assert warm[-1].stats.cached_tokens >= len(prompt)
    _set(target, "off")
    target.reset_cache()
    cold = [c.token_id for c in target.generate(follow, p)]
    assert [c.token_id for c in warm] == cold


def test_vocabulary_mismatch_is_a_clear_error(target, gemma_path):
    from localrun.backends.draft_vocab import VocabularyMismatchError

    with pytest.raises(VocabularyMismatchError) as e:
        target.set_speculation("draft", 4, str(gemma_path))
    assert e.value.hint and target.speculation is None


def test_spec_reaches_the_mlx_engine_through_load_model(draft_pair, monkeypatch, tmp_path):
    """``--spec`` (chat, bench, serve all load through ``loading``) turns speculation on for MLX too."""
    from localrun.loading import load_model

    monkeypatch.setenv("LOCALRUN_HOME", str(tmp_path))
    loaded = load_model(str(draft_pair[0]), backend="mlx", n_ctx=512, spec_mode="ngram", draft_max=5, force=True)
    try:
        eng = loaded.engine
        assert eng.backend == "mlx" and eng.speculation is not None
        assert eng.speculation.mode == "ngram" and eng.speculation.draft_max == 5
    finally:
        loaded.engine.close()
