"""Speculative decoding on MLX (docs/architecture.md §5): prompt lookup and a draft model for ``MlxEngine``.

The pure parts are shared with llama.cpp (``spec_decode.py``): the n-gram drafter, the per-sequence
acceptance estimate and counts (``SeqSpec``), the measured step costs and the draft-length policy
(``StepCost``, ``DraftLength`` → ``choose_k``). What is MLX's own is the verify step, following mlx-lm's
``speculative_generate_step`` (mlx_lm/generate.py): feed the pending token and K drafted ones in one
forward pass, take K + 1 logits rows, and cut the rejected tail off the prompt cache with
``trim_prompt_cache`` (``MlxEngine.rewind``). mlx-lm's generator itself is not used: it has its own
sampler and stopping, and localrun's loop keeps the token control, stop strings, logprobs and seeded keys.

**One sequence.** ``MlxEngine`` decodes one sequence at a time (``serve`` queues requests through
``SerialEngine``), so speculation always runs with exactly one sequence and never meets a batch; there is
nothing to turn off when several requests arrive (they wait their turn, each speculating alone).

**Exactness.** Both drafters are deterministic given the context (prompt lookup; the draft model's
argmax), and the engine samples every row as plain decoding would, with the same key split per emitted
token; a drafted token is kept exactly when the target's own sample picks it, so greedy text is identical
to decoding without speculation and seeded sampling gives the same tokens (``spec_decode`` module
docstring). Leviathan's min(1, p/q) rule (a sampled draft) is not used on MLX.

**Sliding-window caches.** A ``RotatingKVCache`` can be cut back only while it has not wrapped, so a step
drafts at most ``max_size - offset - 2`` tokens (none once a window is full): ``trim_room``.

**Draft model.** A second ``MlxEngine`` (a GGUF through ``mlx.gguf`` or an MLX folder) with the target's
vocabulary (checked on the GGUF headers by ``backends.draft_vocab.check_same_vocab``, and on the tokenizers),
drafting greedily from its own prompt cache, which follows the context by ``reuse_prefix``: only the
tokens accepted since its last proposal are fed to it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

from localrun.backends.spec_decode import (
    DRAFT_MAX_DEFAULT,
    SPEC_MODES,
    Acceptance,
    EngineSpeculation,
    NgramDrafter,
    SeqSpec,
)
from localrun.errors import LocalrunError

if TYPE_CHECKING:
    from localrun.backends.base import StreamSpeculationTarget


def configure_speculation(engine: StreamSpeculationTarget, mode: str, draft_max: int | None, draft_path: str | None,
                          load_draft: Callable[[str], StreamSpeculationTarget]) -> None:
    """Set ``engine.speculation`` (``MlxEngine.set_speculation``): ``mode`` auto | ngram | draft | off,
    ``draft_max`` tokens per verify step at most (None: ``DRAFT_MAX_DEFAULT``), ``draft_path`` a model with
    the engine's vocabulary, loaded here with ``load_draft(path)`` (the engine's own class: this module never
    imports it). Raises VocabularyMismatchError, LocalrunError, BackendError."""
    old = engine.speculation
    if old is not None:
        old.close()
    engine.speculation = None
    if mode == "off":
        return
    if mode not in SPEC_MODES:
        raise LocalrunError(f"unknown speculation mode {mode!r}", hint="use auto, ngram, draft or off")
    draft = MlxDraftModel(draft_path, engine, load_draft) if draft_path and mode in ("auto", "draft") else None
    engine.speculation = MlxSpeculation(engine, mode, DRAFT_MAX_DEFAULT if draft_max is None else draft_max, draft)


def trim_room(cache) -> int:
    """Tokens that may be fed to ``cache`` (mlx-lm per-layer caches) and still be cut back off: unbounded
    (a large number) for growing caches, ``max_size - offset - 1`` for a sliding window that has not
    wrapped (``RotatingKVCache.is_trimmable``: ``offset < max_size``), 0 for a cache that cannot trim."""
    room = 1 << 30
    for c in cache or ():
        if not c.is_trimmable():
            return 0
        max_size = getattr(c, "max_size", None)
        if max_size:
            room = min(room, int(max_size) - int(c.offset) - 1)
    return max(0, room)


class MlxDraftModel:
    """A small model next to the target: its own engine (and so its own prompt cache), ``load(path)`` (an
    ``MlxEngine`` with the target's plan: ``MlxEngine.set_speculation``). Raises VocabularyMismatchError
    (before loading when both are GGUF files; after, on the tokenizers otherwise), ModelNotFoundError,
    BackendError."""

    def __init__(self, path: str, target: StreamSpeculationTarget,
                 load: Callable[[str], StreamSpeculationTarget]) -> None:
        import os

        from localrun.backends.draft_vocab import VocabularyMismatchError, check_same_vocab

        if target.spec is not None and os.path.isfile(path):
            from localrun.model.gguf_info import read_gguf

            check_same_vocab(target.spec, read_gguf(path))
        self.path = str(path)
        self.engine = load(self.path)
        a, b = target.tokenizer, self.engine.tokenizer
        if (len(a), a.bos_token_id, a.eos_token_id) != (len(b), b.bos_token_id, b.eos_token_id) \
                or a.get_vocab() != b.get_vocab():
            self.engine.close()
            raise VocabularyMismatchError(
                "the draft model does not share the target's vocabulary (the tokenizers differ)",
                hint="use a draft model of the same family (the same tokenizer), or --spec ngram")
        self.caught_up = 0  # tokens fed to catch up in the last proposal (a new prompt's prefill included)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """``k`` greedy draft tokens continuing ``context`` (token ids). The draft's cache is cut to what
        it shares with ``context`` and only the rest is fed."""
        eng = self.engine
        mx = eng.mx
        keep = eng.reuse_prefix(list(context))
        self.caught_up = len(context) - keep
        logits = eng.feed(context[keep:])
        out: list[int] = []
        for i in range(k):
            out.append(int(mx.argmax(logits[-1], axis=-1).item()))
            if i < k - 1:
                logits = eng.feed(out[-1:])
        return out

    def close(self) -> None:
        self.engine.close()


class MlxSpeculation(EngineSpeculation):
    """``MlxEngine``'s speculative decoding: the mode (``auto`` | ``ngram`` | ``draft``), ``draft_max``, the
    optional draft model, the measured step costs, the engine-wide counts (``totals``, the same keys as
    llama.cpp's ``Speculation.totals``), and per generation a ``SeqSpec`` (``begin``).

    ``auto`` uses the draft model when one is loaded, else prompt lookup; each only while the controller
    measures that it pays. Steps are evaluated synchronously while speculation is on, so that a plain
    step and a verify step are timed alike."""

    def __init__(self, engine: StreamSpeculationTarget, mode: str = "auto", draft_max: int = DRAFT_MAX_DEFAULT,
                 draft: MlxDraftModel | None = None) -> None:
        # a drafted token costs little where decode is memory-bound (Metal), about half a step on a CPU (StepCost)
        super().__init__(mode, draft_max, draft, memory_bound=not engine.cpu_dequantized)
        self.engine = engine

    def begin(self, prompt: Sequence[int], params) -> SeqSpec:
        """A generation's speculation state (the draft model drafts greedily: the deterministic rule)."""
        if self.draft is not None:
            return SeqSpec(ngram=None, acceptance=Acceptance(prior_alpha=0.6))
        return SeqSpec(ngram=NgramDrafter(prompt), acceptance=Acceptance(prior_alpha=0.5))

    def record(self, sp: SeqSpec, n_accepted: int) -> None:
        """A verify step ended with ``n_accepted`` of ``sp.draft`` kept (engine totals and ``sp``)."""
        sp.record(n_accepted)
        self.verify_steps += 1
        self.draft_tokens += sp.real
        self.accepted_tokens += sp.last_accepted
        sp.draft, sp.real = [], 0

    def step(self, sp: SeqSpec, pending: int, prev_draft: list[int], n_accepted: int, context: list[int],
             n_left: int) -> tuple[list[int], object]:
        """End the step that drafted ``prev_draft`` (``n_accepted`` kept; the rest is cut off the cache), then
        run the next one: draft K tokens after ``pending`` (the last token of ``context``, not yet in the
        cache; ``n_left``: tokens the request may still emit) and feed them → (the drafted tokens, logits
        rows ``[K + 1, vocab]``, evaluated)."""
        eng = self.engine
        if prev_draft:
            self.record(sp, n_accepted)
            eng.rewind(len(prev_draft) - n_accepted)
        else:
            sp.record_shadow(pending)
            self.plain_steps += 1
        draft = self._plan(sp, context, n_left)
        t0 = time.perf_counter()
        rows = eng.feed([pending] + draft, rows=len(draft) + 1)
        eng.mx.eval(rows)
        self.cost.observe(1, len(draft), time.perf_counter() - t0)
        return draft, rows

    def _plan(self, sp: SeqSpec, context: list[int], n_left: int) -> list[int]:
        """Choose K and draft it; sets ``sp.draft``/``sp.real`` (a verify step) or ``sp.shadow`` (a plain one)."""
        eng = self.engine
        k_room = min(self.draft_max, eng.n_batch - 1, eng.n_ctx - len(context) - 2, n_left - 1,
                     trim_room(eng.prompt_cache) - 1)
        if sp.ngram is not None:
            sp.ngram.extend(context[len(sp.ngram.tokens):])
            proposal = sp.ngram.propose(max(0, k_room))
            length = len(proposal)
        else:
            sp.acceptance.forget()
            proposal, length = [], max(0, k_room)
        k = self.policy.choose([sp.acceptance.alpha], [length], k_room, self.cost, draft=self.draft is not None)
        if k == 0:
            sp.shadow, sp.draft, sp.real = proposal, [], 0
            return []
        if self.draft is not None:
            t0 = time.perf_counter()
            proposal = self.draft.propose(context, k)
            if self.draft.caught_up <= self.draft_max + 1:  # not a prompt's prefill: a draft's cost
                self.cost.observe_draft(1, (time.perf_counter() - t0) / k)
        sp.draft = proposal[:k]
        sp.real = len(sp.draft)
        return list(sp.draft)

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
            self.draft = None
