"""The sequences the llama.cpp engine runs: a ``Slot`` (one sequence's KV cells) and a ``Generation`` (a
request running on a slot: prompt, sampler, output, timings). ``LlamaCppEngine.step`` advances them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from localrun.backends.base import SamplingParams, Stats
from localrun.backends.text import TextStream


@dataclass
class Slot:
    """One sequence's KV cells. ``tokens`` are exactly the tokens whose KV the cache holds for it.
    ``checkpoints``: a model with recurrent layers' saved states at positions inside ``tokens``
    (``llamacpp/checkpoints.py``), ascending; each is valid while ``tokens`` up to it stay the same."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    last_used: float = 0.0
    checkpoints: list = field(default_factory=list)  # llamacpp.checkpoints.Checkpoint, by n_tokens

    def forget(self) -> None:
        """The sequence's KV is gone (or replaced): no tokens, no checkpoints."""
        self.tokens.clear()
        self.checkpoints.clear()


@dataclass
class Generation:
    """A running request on a slot: its prompt, sampler, token control, output text and timings."""

    slot: Slot
    prompt: list[int]
    params: SamplingParams
    sampler: object
    n_prompt_done: int  # prompt tokens whose KV is in the cache (cached prefix + prefilled)
    cached_tokens: int
    t_start: float
    stream: TextStream  # tokens → text, stop strings, finish reason (backends/text.py)
    pending: int | None = None  # last sampled token, to be decoded next step
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    t_first: float = 0.0
    t_prefill_done: float = 0.0
    cancelled: bool = False
    last_prefill: int = -1  # engine step number of this sequence's last prefill chunk (round-robin)
    control: object | None = None  # backends.control.TokenControl: forced tokens, masks, complete; None = free
    spec: object | None = None  # spec_decode.SeqSpec: speculative decoding state and counts; None = off
    snapshot_at: int = 0  # prompt position where the prefill stops for a KV-tier snapshot (kv_cache.boundary_in)
    checkpoint_marks: tuple[int, ...] = ()  # prompt positions for context checkpoints (llamacpp/checkpoints.py)
    images: list[tuple[int, int]] | None = None  # (start, end) of each image in prompt (llamacpp/mtmd.py)
    greedy: bool = False  # the sampler chain is greedy alone: the step takes the row's argmax (sampling.plain_greedy)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        return self.n_prompt_done < len(self.prompt)

    def stats(self, n_ctx: int) -> Stats:
        now = time.perf_counter()
        return Stats(
            prompt_tokens=len(self.prompt), cached_tokens=self.cached_tokens,
            completion_tokens=len(self.generated),
            ttft_s=(self.t_first or now) - self.t_start,
            prefill_s=(self.t_prefill_done or now) - self.t_start,
            decode_s=max(0.0, now - (self.t_first or now)),
            n_ctx_used=len(self.slot.tokens), n_ctx=n_ctx,
            draft_tokens=self.spec.draft_tokens if self.spec is not None else 0,
            accepted_tokens=self.spec.accepted_tokens if self.spec is not None else 0)
