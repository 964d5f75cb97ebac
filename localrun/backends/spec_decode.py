"""Speculative decoding, the parts that need no engine: drafters, acceptance rules, the adaptive controller.

Decode is memory-bound: every token reads all the weights once. Speculation drafts several tokens
cheaply and lets the target model check them in ONE forward pass (a verify step), so one read of the
weights yields up to ``1 + K`` tokens. The engines (``llamacpp.py``, ``mlx.py``) put the drafts in their
batch and call the rules here.

Drafters:

* ``NgramDrafter`` (prompt lookup, Saxena 2023 "prompt lookup decoding"; llama.cpp ``common/ngram-cache``):
  the continuation of the longest recent n-gram (``n_max`` … ``n_min`` tokens) of the sequence's own
  prompt + output that matches its last tokens. Deterministic: it depends on the context only.
* a draft model (``llamacpp.spec.DraftModel``): a small model with the same vocabulary.

Acceptance rules (both keep the output distribution the target's own):

* deterministic draft (prompt lookup; a draft model's greedy proposal): sample the target as usual at
  each position and accept the drafted token exactly when the target picked it; the first position where
  it did not gives the target's token instead. Each emitted token consumes exactly one sampling step, so
  greedy and seeded output are token-for-token those of decoding without speculation.
* sampled draft (a draft model at temperature > 0): ``speculative_accept``, the rule of Leviathan et al.
  2023 (arXiv:2211.17192, Algorithm 1) and Chen et al. 2023 (arXiv:2302.01318): accept draft token x with
  probability ``min(1, p(x)/q(x))``; on rejection sample from ``normalise(max(0, p - q))``; after K
  accepted drafts, sample the bonus token from p.

Adaptive draft length (``SpecController``): per sequence an acceptance estimate ``alpha`` (per drafted
position, the probability it is accepted given the ones before were), per engine the measured seconds of
a plain step and of each extra token per sequence in a verify step (``StepCost``). With K drafted tokens
a verify step yields ``E(K) = (1 - alpha^(K+1)) / (1 - alpha)`` tokens on average (Leviathan et al. eq. 1)
at cost ``plain + K × extra (+ draft cost)``; the controller picks the K in ``0..draft_max`` with the most
tokens per second, K = 0 being plain decoding. Prompt lookup keeps measuring ``alpha`` while it is off
(shadow drafts: what it would have proposed against what was generated), so it switches back on when it
would win; a draft model's estimate decays back toward its prior while off, so it is retried now and then.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from localrun.errors import LocalrunError

if TYPE_CHECKING:
    import numpy as np

SPEC_MODES = ("auto", "ngram", "draft", "off")
DRAFT_MAX_DEFAULT = 16  # tokens per verify step at most (as llama-server's --draft-max; the controller picks below)


def spec_mode_or_default(mode: str | None, draft_model: str | None) -> str:
    """``--spec`` as given, else the default: ``off``, or ``auto`` when ``--draft-model`` names a draft model
    (asking for one is asking for speculation). Off by default because it is not exact yet: a verify step's
    batch shape (chosen from measured step times, so it varies run to run) can change llama.cpp's logits;
    measured on Gemma-3 (CPU), a verify batch of two sequences x 4+ tokens moves the logits of the 4th
    token on by ~0.5 nats, so repeated greedy requests could part (docs/chat.md, "Not exact yet")."""
    if mode is not None:
        return mode
    return "auto" if draft_model else "off"


# ---------------------------------------------------------------------------------------------- prompt lookup
class NgramDrafter:
    """Prompt lookup over one sequence's tokens (prompt, then output as it is accepted).

    ``index[n]`` maps each n-gram of ``n`` in ``NGRAM_SIZES`` (by its hash; a hit is checked against the
    tokens) to the position right after its most recent occurrence that is not the sequence's current
    end, so ``propose`` is a handful of dict lookups, longest first. Long n-grams (up to 12) anchor a copy
    to the right place: in code or a passage repeated with edits, a 4-gram such as ``C.llama_sampler_``
    recurs every few lines and its latest occurrence is often the wrong one (measured on the edit workload
    of benches/speculative.py: fixed K = 16 went from 1.13× to 1.60× plain decoding with n up to 12).
    ``extend`` costs O(len(NGRAM_SIZES)) per token. Memory: ≈ 6 dict entries (≈ 0.6 KB) per token.
    """

    NGRAM_SIZES = (12, 8, 6, 4, 3, 2)

    def __init__(self, tokens: Sequence[int] = (), *, n_min: int = 2, n_max: int = 12) -> None:
        self.n_min, self.n_max = max(1, n_min), max(n_min, n_max)
        self.sizes = tuple(n for n in self.NGRAM_SIZES if self.n_min <= n <= self.n_max) or (self.n_min,)
        self.tokens: list[int] = []
        self.index: dict[int, dict[int, int]] = {n: {} for n in self.sizes}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        t = self.tokens
        for tok in tokens:
            t.append(int(tok))
            end = len(t) - 1  # the n-grams ending just before the new token now have a continuation
            for n, idx in self.index.items():
                if end >= n:
                    idx[hash(tuple(t[end - n:end]))] = end

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens continuing the longest n-gram match of the sequence's end ([] if none)."""
        t = self.tokens
        if k <= 0:
            return []
        for n in self.sizes:  # longest first
            if len(t) < n:
                continue
            tail = t[-n:]
            pos = self.index[n].get(hash(tuple(tail)))
            if pos is not None and t[pos - n:pos] == tail:  # not a hash collision
                return t[pos:pos + k]
        return []


# ---------------------------------------------------------------------------------------------- sampling rules
def target_probs(logits: np.ndarray, *, temperature: float, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, logit_bias: dict[int, float] | None = None) -> np.ndarray:
    """The distribution llama.cpp's sampler chain samples from (``llamacpp.sampling.make_sampler``'s
    order: logit bias, top-k, top-p, min-p, temperature, dist; src/llama-sampler.cpp), as float64
    ``[n_vocab]`` summing to 1. ``logits``: float ``[n_vocab]`` (-inf = banned). top-p and min-p see the
    softmax at temperature 1, as in the chain. ``temperature <= 0``: one-hot on the argmax."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64).copy()
    if logit_bias:
        for t, b in logit_bias.items():
            x[int(t)] += b
    if temperature <= 0:
        out = np.zeros_like(x)
        out[int(np.argmax(x))] = 1.0
        return out
    keep = np.isfinite(x)
    if 0 < top_k < keep.sum():
        kth = np.partition(x, -top_k)[-top_k]
        keep &= x >= kth
        if keep.sum() > top_k:  # ties at the k-th value: keep the first ones by id, as a stable sort would
            tied = np.flatnonzero(keep & (x == kth))
            keep[tied[top_k - int((x > kth).sum()):]] = False
    if 0 < top_p < 1:
        ids = np.flatnonzero(keep)
        order = ids[np.argsort(-x[ids], kind="stable")]
        p = np.exp(x[order] - x[order[0]])
        cum = np.cumsum(p / p.sum())
        n_keep = int(np.searchsorted(cum, top_p) + 1)  # the smallest set reaching top_p (min_keep 1)
        keep[:] = False
        keep[order[:n_keep]] = True
    if min_p > 0:
        m = x[keep].max()
        keep &= x >= m + math.log(min_p)
    z = np.where(keep, x / temperature, -np.inf)
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def speculative_accept(p: np.ndarray, q: np.ndarray, token: int, u: float, rng) -> tuple[bool, int]:
    """One position of speculative sampling (Leviathan et al. 2023, Algorithm 1): the draft sampled
    ``token`` from ``q``; the target's distribution is ``p`` (both float ``[n_vocab]``). ``u``: a
    uniform draw in [0, 1). Returns (accepted, the token to emit): ``token`` when
    ``u < min(1, p/q)``, else a draw (``rng``: numpy Generator) from ``normalise(max(0, p - q))``."""
    import numpy as np

    qx = float(q[token])
    if qx > 0 and u < min(1.0, float(p[token]) / qx):
        return True, int(token)
    resid = np.maximum(p - q, 0.0)
    s = resid.sum()
    if s <= 0:  # p == q: unreachable after a rejection, but never divide by zero
        resid, s = p, p.sum()
    return False, int(rng.choice(len(p), p=resid / s))


def sample(p: np.ndarray, rng) -> int:
    """A draw from ``p`` (float ``[n_vocab]``, sums to 1)."""
    return int(rng.choice(len(p), p=p))


# ---------------------------------------------------------------------------------------------- the controller
def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verify step with ``k`` drafts yields on average when each drafted position is accepted
    with probability ``alpha`` (given the ones before were): ``sum_{i=0..k} alpha^i`` (Leviathan et al.
    2023, eq. 1); the last term is the target's own token after the accepted ones."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class Acceptance:
    """One sequence's acceptance estimate: decayed counts of accepted / tried draft positions plus a
    prior (``prior_alpha`` worth ``prior_weight`` tries). ``decay`` per observation keeps it recent."""

    prior_alpha: float = 0.5
    prior_weight: float = 2.0
    decay: float = 0.9
    accepted: float = 0.0
    tried: float = 0.0

    @property
    def alpha(self) -> float:
        return (self.accepted + self.prior_alpha * self.prior_weight) / (self.tried + self.prior_weight)

    def observe(self, accepted: int, tried: int) -> None:
        if tried <= 0:
            return
        self.accepted = self.accepted * self.decay + accepted
        self.tried = self.tried * self.decay + tried

    def forget(self, factor: float = 0.98) -> None:
        """Drift back toward the prior (a drafter that is off and cannot measure itself)."""
        self.accepted *= factor
        self.tried *= factor


@dataclass
class StepCost:
    """Measured seconds of the engine's decode steps, by the number of sequences in the step.

    ``plain[n]``: a step of one token each (EMA, weight ``rate``). A verify step with ``k`` drafted tokens
    per sequence costs ``plain + fixed + k × per_token``: on a CPU the first drafted token costs most (the
    matrix products leave the one-row kernel; measured on SmolLM2 Q8_0, 2 threads: batches of 2, 9 and 17
    tokens cost 1.87×, 4.89× and 7.91× a plain step, so fixed ≈ 0.5 and per_token ≈ 0.43 of it), so a
    single cost per drafted token, measured at small k, overstates long drafts. ``fixed`` and
    ``per_token`` are a least-squares line through the last ``window`` verify steps of n sequences (their
    cost above ``plain``); until two draft lengths are seen, the priors (``prior_fixed``, ``prior_extra`` ×
    plain) scaled to what was measured. ``draft[n]``: a draft-model decode of n sequences, per token."""

    rate: float = 0.3
    prior_extra: float = 0.15
    prior_fixed: float = 0.0
    window: int = 32
    plain: dict[int, float] = field(default_factory=dict)
    verify: dict[int, deque] = field(default_factory=dict)  # n → deque of (k, seconds above plain)
    draft: dict[int, float] = field(default_factory=dict)  # a draft-model decode of n sequences

    def observe(self, n_seqs: int, k: int, seconds: float) -> None:
        if k <= 0:
            self.plain[n_seqs] = self._ema(self.plain.get(n_seqs), seconds)
            return
        pts = self.verify.setdefault(n_seqs, deque(maxlen=self.window))
        pts.append((k, max(0.0, seconds - self.plain_s(n_seqs))))

    def observe_draft(self, n_seqs: int, seconds_per_token: float) -> None:
        self.draft[n_seqs] = self._ema(self.draft.get(n_seqs), seconds_per_token)

    def plain_s(self, n_seqs: int) -> float:
        if n_seqs in self.plain:
            return self.plain[n_seqs]
        near = min(self.plain, key=lambda n: abs(n - n_seqs), default=None)
        return self.plain[near] if near is not None else 0.02

    def overhead(self, n_seqs: int) -> tuple[float, float]:
        """(fixed, per_token) seconds a verify step of ``n_seqs`` sequences adds to a plain one."""
        base = self.plain_s(n_seqs)
        pf, pp = self.prior_fixed * base, self.prior_extra * base
        pts = self.verify.get(n_seqs)
        if not pts:
            return pf, pp
        ks = [k for k, _ in pts]
        ys = [y for _, y in pts]
        mk, my = sum(ks) / len(ks), sum(ys) / len(ys)
        var = sum((k - mk) ** 2 for k in ks)
        if var > 0:
            b = sum((k - mk) * (y - my) for k, y in pts) / var
            a = my - b * mk
            if a >= 0 and b > 0:
                return a, b
            if a < 0 < b:  # through the origin: no fixed part
                return 0.0, sum(ks[i] * ys[i] for i in range(len(ks))) / sum(k * k for k in ks)
        scale = my / (pf + mk * pp) if pf + mk * pp > 0 else 1.0  # one draft length: the prior's shape
        return pf * scale, pp * scale

    def step_s(self, n_seqs: int, k: int, *, draft: bool = False) -> float:
        base = self.plain_s(n_seqs)
        if k <= 0:
            return base
        fixed, per = self.overhead(n_seqs)
        d = self.draft.get(n_seqs, 0.3 * base) if draft else 0.0
        return base + fixed + k * (per + d)

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.rate * (new - old)


def choose_k(alphas: Sequence[float], lengths: Sequence[int], k_max: int, cost: StepCost, *,
             draft: bool = False) -> int:
    """The draft length for one verify step of ``len(alphas)`` sequences (all padded to the same K:
    see ``llamacpp.py`` on ``split_equal``) that maximises expected tokens per second; 0 = a plain step.
    ``lengths[i]``: drafted tokens sequence i really has (prompt lookup may find fewer; a padded
    position counts as rejected). Sequences without a drafter count one token each."""
    n = len(alphas)
    if n == 0 or k_max <= 0:
        return 0
    best_k, best = 0, n / cost.step_s(n, 0)
    for k in range(1, k_max + 1):
        toks = sum(expected_tokens(a, min(k, ln)) for a, ln in zip(alphas, lengths))
        rate = toks / cost.step_s(n, k, draft=draft)
        if rate > best * 1.02:  # a clear win only: noise must not turn it on
            best_k, best = k, rate
    return best_k


@dataclass
class SeqSpec:
    """One generation's speculation state: its drafter (an ``NgramDrafter`` or None for the draft
    model), its acceptance estimate, the draft of the step in flight, and the counts it reports
    (``draft_tokens`` proposed and verified, ``accepted_tokens`` of them kept)."""

    ngram: NgramDrafter | None
    acceptance: Acceptance
    sampled: bool = False  # draft-model sampling rule (Leviathan) rather than the deterministic one
    draft: list[int] = field(default_factory=list)  # tokens in the current verify step (padded)
    real: int = 0  # how many of ``draft`` the drafter really proposed
    q_rows: list = field(default_factory=list)  # the draft model's distribution at each drafted position
    shadow: list[int] = field(default_factory=list)  # what prompt lookup would have drafted (a plain step)
    rng: object | None = None  # numpy Generator of the sampled rule (seeded from the request's seed)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    last_accepted: int = 0  # accepted drafted tokens in the last verify step

    def record(self, n_accepted: int) -> None:
        """After a verify step: ``n_accepted`` of the ``real`` drafted tokens were kept."""
        tried = min(self.real, n_accepted + 1)
        self.acceptance.observe(min(n_accepted, self.real), tried)
        self.draft_tokens += self.real
        self.accepted_tokens += min(n_accepted, self.real)
        self.last_accepted = min(n_accepted, self.real)
        self.verify_steps += 1

    def record_shadow(self, token: int) -> None:
        """After a plain step: was prompt lookup's first proposal the token generated?"""
        if self.shadow:
            self.acceptance.observe(int(self.shadow[0] == token), 1)
        self.shadow = []


def acceptance_rate(draft_tokens: int, accepted_tokens: int) -> float | None:
    """accepted / drafted, None before anything was drafted."""
    return accepted_tokens / draft_tokens if draft_tokens else None


@dataclass
class DraftLength:
    """One engine's per-step draft-length decision (the policy of ``llamacpp.spec.Speculation.plan``, here
    for every engine): measure a plain step of this many sequences first (the yardstick of every verify
    step), then ``choose_k``; while that says 0 and drafts are on offer, a short verify step (≤ 4 tokens)
    every ``probe_every`` steps, so a cost measured once under load, or a stale acceptance, cannot keep
    speculation off for good. ``adaptive`` False: always as many tokens as there is room for (tests,
    fixed-length benches)."""

    adaptive: bool = True
    probe_every: int = 64
    since_verify: int = 0  # decode steps since the last verify step

    def choose(self, alphas: Sequence[float], lengths: Sequence[int], k_room: int, cost: StepCost, *,
               draft: bool = False) -> int:
        """K for this step (0 = a plain step); arguments as ``choose_k``; ``k_room``: tokens per sequence
        there is room for (batch, context, max_tokens)."""
        k_room = max(0, int(k_room))
        if self.adaptive and len(alphas) not in cost.plain:
            k = 0
        elif self.adaptive:
            k = choose_k(alphas, lengths, k_room, cost, draft=draft)
        else:
            k = k_room if any(lengths) else 0
        self.since_verify = 0 if k else self.since_verify + 1
        if self.adaptive and k == 0 and any(lengths) and self.since_verify >= self.probe_every:
            k, self.since_verify = min(max(lengths), k_room, 4), 0
        return k


class EngineSpeculation:
    """What both engines' speculation share (``llamacpp.spec.Speculation``, ``mlx.spec.MlxSpeculation``): the
    mode (``auto`` | ``ngram`` | ``draft``), ``draft_max``, the optional draft model (``draft``, with a
    ``path``), the measured step costs (``cost``), the draft-length policy (``policy``) and the engine-wide
    counts (``totals``).

    ``memory_bound``: decode reads the weights once per step whatever the batch (a GPU, Metal), so a
    drafted token costs little (priors fixed 0.05, per token 0.1 of a plain step); else a CPU's one-row
    kernels, where the first drafted token costs ~0.4 of a step and each further one ~0.45 (``StepCost``'s
    measurement). Raises LocalrunError for an unknown mode or ``draft`` mode without a draft model."""

    def __init__(self, mode: str, draft_max: int, draft, *, memory_bound: bool) -> None:
        if mode not in SPEC_MODES or mode == "off":
            raise LocalrunError(f"unknown speculation mode {mode!r}", hint="use auto, ngram, draft or off")
        if mode == "draft" and draft is None:
            raise LocalrunError("--spec draft needs a draft model", hint="give --draft-model PATH, or use --spec ngram")
        self.mode = mode
        self.draft_max = max(0, int(draft_max))
        self.draft = draft if mode in ("auto", "draft") else None
        self.cost = StepCost(prior_fixed=0.05 if memory_bound else 0.4, prior_extra=0.1 if memory_bound else 0.45)
        self.policy = DraftLength()  # K per step: measured costs and acceptance
        self.draft_tokens = self.accepted_tokens = self.verify_steps = self.plain_steps = 0  # engine totals

    @property
    def adaptive(self) -> bool:
        """False: always draft as much as there is room for (tests, fixed-length benches)."""
        return self.policy.adaptive

    @adaptive.setter
    def adaptive(self, value: bool) -> None:
        self.policy.adaptive = bool(value)

    def totals(self) -> dict:
        """Engine-wide counts since loading: drafted / accepted tokens, verify and plain decode steps, the
        acceptance rate (None before any draft), the mode and the draft model's file."""
        return {"mode": self.mode, "draft_model": self.draft.path if self.draft else None,
                "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "acceptance_rate": acceptance_rate(self.draft_tokens, self.accepted_tokens),
                "verify_steps": self.verify_steps, "plain_steps": self.plain_steps}
