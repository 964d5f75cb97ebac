"""Speculative decoding's pure parts (fast tier): prompt lookup, the sampling rules, the controller, the
vocabulary check, the draft model's place in the plan."""

from __future__ import annotations

import numpy as np
import pytest

from localrun.backends.spec_decode import (
    Acceptance,
    NgramDrafter,
    SeqSpec,
    StepCost,
    choose_k,
    expected_tokens,
    speculative_accept,
    target_probs,
)


def test_ngram_proposes_the_continuation_of_the_longest_latest_match():
    d = NgramDrafter([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 1, 2, 3])
    # suffix (1, 2, 3) matched at the start → 4, 5, 9; the shorter (2, 3) would give 7, 8 (more recent)
    assert d.propose(3) == [4, 5, 9]
    d.extend([4, 5, 9])
    assert d.propose(2) == [2, 3]  # (3, 4, 5, 9) first seen at position 2: continuation 2, 3
    assert NgramDrafter([1, 2, 3]).propose(4) == []  # nothing repeats
    assert d.propose(0) == []


def test_ngram_repeat_of_a_passage_drafts_its_rest():
    passage = list(range(100, 160))
    d = NgramDrafter(passage + [7] + passage[:10])
    assert d.propose(8) == passage[10:18]


def test_target_probs_follows_the_chain_order():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    p = target_probs(logits, temperature=1.0, top_k=3)
    assert np.allclose(p, [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0])
    p = target_probs(logits, temperature=1.0, top_p=0.6)  # 0.5 < 0.6 → the second one too
    assert np.count_nonzero(p) == 2
    p = target_probs(logits, temperature=1.0, min_p=0.35)  # >= 0.35 × 0.5
    assert np.count_nonzero(p) == 2
    p = target_probs(logits, temperature=0.5)
    sq = np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    assert np.allclose(p, sq / sq.sum())
    assert target_probs(logits, temperature=0).tolist() == [1, 0, 0, 0, 0]
    p = target_probs(logits, temperature=1.0, logit_bias={0: float("-inf")})
    assert p[0] == 0 and abs(p.sum() - 1) < 1e-12


def test_speculative_rule_gives_the_target_distribution():
    """Draft from q, accept with min(1, p/q), else resample from max(0, p - q): the result is p (chi-square)."""
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.25, 0.15, 0.1, 0.0])
    q = np.array([0.1, 0.3, 0.2, 0.2, 0.2])  # q puts mass where p has none
    n = 6000
    counts = np.zeros(5)
    for x, u in zip(rng.choice(5, size=n, p=q), rng.random(n)):
        counts[speculative_accept(p, q, int(x), float(u), rng)[1]] += 1
    assert counts[4] == 0
    exp = p[:4] * n
    chi2 = float(((counts[:4] - exp) ** 2 / exp).sum())
    assert chi2 < 16.27  # 3 degrees of freedom, p = 0.001
    # q == p: everything accepted
    assert all(speculative_accept(p, p, x, 0.999, rng) == (True, x) for x in range(4))


def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(0.9, 0) == 1.0


def test_controller_turns_off_where_it_loses_and_on_where_it_wins():
    cost = StepCost()
    cost.observe(1, 0, 0.010)
    cost.observe(1, 4, 0.012)  # a GPU: 4 extra tokens cost 20 %
    assert choose_k([0.8], [8], 8, cost) > 2
    assert choose_k([0.05], [8], 8, cost) == 0
    assert choose_k([0.8], [0], 8, cost) == 0  # nothing to draft
    cpu = StepCost()
    cpu.observe(1, 0, 0.010)
    cpu.observe(1, 2, 0.020)  # a CPU: each extra token costs half a step
    assert choose_k([0.5], [8], 8, cpu) == 0
    assert choose_k([0.95], [8], 8, cpu) > 0
    # a draft model's own cost counts
    cost.observe_draft(1, 0.02)
    assert choose_k([0.6], [8], 8, cost, draft=True) == 0


def test_step_cost_fits_a_fixed_part_and_a_per_token_part():
    """On a CPU the first drafted token costs most (SmolLM2 Q8_0, 2 threads: 1.87×, 4.89×, 7.91× a plain
    step for 1, 8 and 16 drafted tokens): the line through the measured verify steps recovers both parts,
    and with them a high acceptance drafts longer than one cost per token measured at k = 1 would."""
    cost = StepCost(prior_fixed=0.4, prior_extra=0.45)
    cost.observe(1, 0, 0.010)
    assert cost.overhead(1) == pytest.approx((0.004, 0.0045))  # the priors, before any verify step
    cost.observe(1, 1, 0.0187)
    f, p = cost.overhead(1)
    assert f + p == pytest.approx(0.0087) and f / p == pytest.approx(0.4 / 0.45)  # one k: the prior's shape
    for k, rel in ((8, 4.89), (16, 7.91), (1, 1.87), (8, 4.89)):
        cost.observe(1, k, 0.010 * rel)
    f, p = cost.overhead(1)
    assert f == pytest.approx(0.005, abs=0.001) and p == pytest.approx(0.0041, abs=0.0003)  # a line: concave data
    assert cost.step_s(1, 16) == pytest.approx(0.0791, rel=0.03)
    flat = StepCost()
    flat.observe(1, 0, 0.010)
    flat.observe(1, 1, 0.0187)  # the same first point read as 0.87 of a step per drafted token
    assert choose_k([0.95], [16], 16, cost) > choose_k([0.95], [16], 16, flat)


def test_acceptance_estimate_and_shadow_drafts():
    sp = SeqSpec(ngram=NgramDrafter(), acceptance=Acceptance(prior_alpha=0.5, prior_weight=2))
    sp.draft, sp.real = [1, 2, 3, 4], 4
    sp.record(4)
    assert (sp.draft_tokens, sp.accepted_tokens) == (4, 4) and sp.acceptance.alpha > 0.75
    for _ in range(30):
        sp.shadow = [5]
        sp.record_shadow(6)  # lookup would have been wrong every time
    assert sp.acceptance.alpha < 0.1
    a = Acceptance(prior_alpha=0.6)
    a.observe(0, 10)
    low = a.alpha
    for _ in range(200):
        a.forget()
    assert a.alpha > low  # drifts back toward the prior: a draft model is tried again


class _Spec:
    def __init__(self, tokens, model="gpt2", bos=1, eos=2):
        self.metadata = {"tokenizer.ggml.model": model}
        self.tokens, self.bos_token_id, self.eos_token_id = tokens, bos, eos
        self.array_offsets: dict = {}  # a header whose token array was not read: the first and last 256 ids

    @property
    def vocab_size(self):
        return len(self.tokens)

    def token_text(self, i):
        return self.tokens[i]


def test_vocabulary_check_names_the_difference():
    from localrun.backends.draft_vocab import VocabularyMismatchError, check_same_vocab

    base = [f"t{i}" for i in range(1000)]
    check_same_vocab(_Spec(base), _Spec(list(base)))
    with pytest.raises(VocabularyMismatchError, match="sizes differ"):
        check_same_vocab(_Spec(base), _Spec(base[:999]))
    other = list(base)
    other[970] = "zz"
    with pytest.raises(VocabularyMismatchError, match="token 970") as e:
        check_same_vocab(_Spec(base), _Spec(other))
    assert "--spec ngram" in e.value.hint


def test_serve_spec_flags_are_checked_at_start_up(tmp_path):
    from localrun.errors import ConfigError, ModelNotFoundError
    from localrun.server.spec_options import SpecOptions

    with pytest.raises(ConfigError, match="--spec") as e:
        SpecOptions("sometimes").check(tmp_path)
    assert "auto" in e.value.hint
    with pytest.raises(ConfigError, match="--draft-model"):
        SpecOptions("draft").check(tmp_path)
    with pytest.raises(ModelNotFoundError):
        SpecOptions("auto", str(tmp_path / "missing.gguf")).check(tmp_path)
    assert SpecOptions("ngram", "whatever", 3).check(tmp_path) == SpecOptions("ngram", None, 3)  # not needed: unread
    assert SpecOptions("off").for_model(tmp_path / "m.gguf") == {"spec_mode": "off", "draft_model": None,
                                                                  "draft_max": None}
