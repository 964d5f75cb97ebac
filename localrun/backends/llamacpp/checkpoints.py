"""Context checkpoints: prefix caching for models with recurrent layers (docs/architecture.md §4).

A model with recurrent layers (gated delta-net, Mamba-2, short-conv: ``qwen35``, ``lfm2``, ``nemotron_h``…,
``llama_model_is_recurrent`` or ``llama_model_is_hybrid``) keeps one state per sequence that has folded
in every token so far. llama.cpp cannot cut it back: ``llama_memory_seq_rm(seq, p0, -1)`` returns false for
``0 < p0 <= pos_max`` (src/llama-memory-recurrent.cpp ``seq_rm``; ``n_rs_seq`` rollback aside), so a new
prompt that leaves a slot's cached tokens before their end could only be prefilled whole.

So the engine saves the sequence's recurrent part (``llama_state_seq_get_data_ext`` with
``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: the R/S state rows, plus the sliding-window cells of a
hybrid-iSWA model; the full-attention KV is not copied, it can be cut) at chosen positions of each prompt,
as llama-server's context checkpoints do (``--ctx-checkpoints``, tools/server/server-context.cpp
``create_checkpoint``). A prompt that must cut the slot back to ``n_keep`` tokens restores the latest
checkpoint at ``n <= n_keep`` (``set_data_ext`` with the same flag) and removes the attention KV from ``n``
on, which the restored state now lets ``seq_rm`` do; then only ``prompt[n:]`` is prefilled.

Where a checkpoint is taken (the positions cost a prefill chunk boundary, never a separate decode):

* at the end of each prompt (the state after its last token, before the first decode step): the next
  turn's history re-renders the reply, and a reply that re-tokenizes differently, or a template that drops
  the reply's thinking, leaves the cached tokens right after the prompt;
* ``TAILS`` = 4 and 1 tokens before the end of each prompt (4 is llama-server's offset): a template whose
  generation prompt differs from how it renders a finished turn (a reply's first token that merges with
  the header's newline, thinking dropped), the same prompt sent again;
* where the last user message's text begins (``note_turn_start``, from the engine's ``tokenize_chat``; as
  llama-server checkpoints at the last user message): a later request that edits that message, or resends
  an earlier turn, parts from this one there;
* every ``INTERVAL`` tokens of a long prefill (absolute positions, so a prefill that starts at 0 keeps its
  ``n_batch`` chunks): an edit early in a long history;
* at the end of each generation (``release``): a later turn that edits the turn after it.

Bounds: at most ``max_per_slot`` per slot and ``max_bytes`` in all (host RAM); past either, the
checkpoint closest to the one before it in its slot goes first (the spacing stays even), the newest never.
``max_bytes`` follows the model unless given: ``offload.kv_tiers.checkpoint_max_bytes`` (the formula `fit`
prices them with) of the largest checkpoint llama.cpp has given so far (before the first, the plan's
recurrent state of one sequence), the slots, and the RAM available when the engine was built (psutil: the
model is in by then), so that every slot keeps its ``max_per_slot`` where RAM allows (a 27B qwen35 at 32k × 4
sequences: 64 × 149.6 MiB = 9.35 GiB, where a fixed 1 GiB held 6 in all).
``stats`` counts saves, restores, the tokens they saved, evictions and whole prefills; the log says why a
prompt is prefilled whole, at INFO (``recurrent state cannot be cut at 412 of 586; no checkpoint ≤ 412``),
and which checkpoint a cut restored, at DEBUG.

The KV tiers (``kv_cache.py``) hold full snapshots of such a model (attention KV and recurrent state) and
restore one only when its tokens are a strict prefix of the prompt, never to be cut (``exact_only``).
"""

from __future__ import annotations

import ctypes
import logging
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from localrun.backends.kv_files import tokens_sha256
from localrun.backends.kv_store import Checkpoint
from localrun.backends.text import common_prefix
from localrun.offload.kv_tiers import CHECKPOINTS_MIN_BYTES, CHECKPOINTS_PER_SLOT, checkpoint_max_bytes

__all__ = ["Checkpoint", "CheckpointStats", "Checkpoints", "has_recurrent_state"]

log = logging.getLogger("localrun.checkpoints")

INTERVAL = 1024  # tokens between checkpoints in a long prefill (a multiple of the usual n_batch, 512)
TAILS = (4, 1)  # checkpoints these many tokens before each prompt's end (4: llama-server's, server-context.cpp)
MAX_NOTED = 64  # prompts whose last user message's start is remembered (by their tokens' SHA-256)
MAX_PER_SLOT = CHECKPOINTS_PER_SLOT  # checkpoints per slot at most (16; llama-server keeps 32 by default)
# why a cut prefilled the prompt whole: no checkpoint at or before the cut, or llama.cpp refused the one there
FULL_PREFILL_REASONS = ("no_checkpoint", "restore_failed")


@dataclass
class CheckpointStats:
    """Counters since the engine loaded: ``saves``, ``restores`` (a cut served by a checkpoint),
    ``restored_tokens`` (prompt tokens those restores kept), ``full_prefills`` (a cut no checkpoint could
    serve: the prompt was prefilled whole) and ``full_prefill_reasons`` (why → how many of them: one of
    ``FULL_PREFILL_REASONS``), ``evictions``, ``held`` / ``held_bytes`` now."""

    saves: int = 0
    restores: int = 0
    restored_tokens: int = 0
    full_prefills: int = 0
    evictions: int = 0
    held: int = 0
    held_bytes: int = 0
    full_prefill_reasons: dict = field(default_factory=lambda: dict.fromkeys(FULL_PREFILL_REASONS, 0))

    def to_dict(self) -> dict:
        return asdict(self)


def has_recurrent_state(C, model) -> bool:
    """Whether the llama.cpp ``model`` keeps a recurrent state per sequence (recurrent or hybrid memory:
    src/llama-model.cpp ``create_memory``), which ``llama_memory_seq_rm`` cannot cut back."""
    return bool(C.llama_model_is_recurrent(model)) or bool(C.llama_model_is_hybrid(model))


class Checkpoints:
    """One engine's context checkpoints (see the module docstring); they live on its slots
    (``Slot.checkpoints``). ``engine``: the ``LlamaCppEngine`` (its ``C``, ``ctx``, ``mem``, ``slots``, and
    ``plan`` when it has one). ``max_bytes``: a fixed byte bound (bytes), or None to follow the model (see the
    module docstring); ``ram_left_bytes``: the RAM that bound may take its share of (bytes; None: psutil's
    available RAM now)."""

    def __init__(self, engine, *, interval: int = INTERVAL, tails: Sequence[int] = TAILS,
                 max_per_slot: int = MAX_PER_SLOT, max_bytes: int | None = None,
                 ram_left_bytes: int | None = None) -> None:
        self.engine = engine
        self.interval, self.tails = max(1, int(interval)), tuple(max(1, int(t)) for t in tails)
        self.max_per_slot = max(1, int(max_per_slot))
        self.follows_model = max_bytes is None
        if ram_left_bytes is None and self.follows_model:
            import psutil

            ram_left_bytes = psutil.virtual_memory().available
        self.ram_left_bytes = max(0, int(ram_left_bytes or 0))
        plan = getattr(engine, "plan", None)
        n_seq = max(1, len(engine.slots))
        self.one_bytes = int(getattr(plan, "recurrent_bytes", 0) or 0) // n_seq  # the plan's, until llama.cpp's
        self.measured = False  # one_bytes is llama.cpp's size of a checkpoint (the largest so far)
        if max_bytes is not None:
            self.max_bytes = max(0, int(max_bytes))
        else:  # the floor until a size is known (save() sizes it again from llama.cpp's first checkpoint)
            self.max_bytes = checkpoint_max_bytes(self.one_bytes, n_seq, self.ram_left_bytes) if self.one_bytes \
                else CHECKPOINTS_MIN_BYTES
        self.stats = CheckpointStats()
        self.flags = engine.C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        self.noted: OrderedDict[str, int] = OrderedDict()  # SHA-256 of a prompt's tokens → its last user turn's start

    # ------------------------------------------------------------------ where
    def marks(self, n_prompt: int, turn_start: int = 0) -> tuple[int, ...]:
        """A ``n_prompt``-token prompt's own checkpoint positions besides the ``INTERVAL`` multiples and its
        end: ``n_prompt - t`` for each of ``TAILS``, and ``turn_start`` (``turn_start_of``) when > 0."""
        return tuple(sorted({n for n in (*(n_prompt - t for t in self.tails), turn_start) if 0 < n < n_prompt}))

    def next_stop(self, n_done: int, n_prompt: int, marks: Sequence[int] = ()) -> int:
        """The first checkpoint position of a ``n_prompt``-token prompt after ``n_done`` tokens (an
        ``INTERVAL`` multiple, or one of ``marks``) → the prefill's chunk stops there; ``n_prompt`` when none
        comes before the end (the end itself is a checkpoint too)."""
        stop = (n_done // self.interval + 1) * self.interval
        return min([stop, n_prompt, *(m for m in marks if m > n_done)])

    def wanted(self, n: int, n_prompt: int, marks: Sequence[int] = ()) -> bool:
        """Is ``n`` (tokens of a ``n_prompt``-token prompt now in the sequence) a checkpoint position?"""
        return n > 0 and (n == n_prompt or n in marks or n % self.interval == 0)

    def note_turn_start(self, messages: Sequence, prompt: Sequence[int], render: Callable[[list], list[int]]) -> int:
        """Remember where the last user message's text begins in ``prompt`` (``messages`` rendered), for
        ``turn_start_of`` → that position, 0 when there is none. ``render(messages)`` → token ids, without
        the generation prompt. The probe is the messages before it plus a user turn whose text is one
        private-use character (as ``kv_cache.system_prompt_end``): its common prefix with ``prompt`` ends
        where the message's text begins. Raises nothing."""
        from localrun.backends.base import Message
        from localrun.errors import LocalrunError

        def role(m) -> str | None:
            return m.get("role") if isinstance(m, dict) else getattr(m, "role", None)

        k = next((i for i in range(len(messages) - 1, -1, -1) if role(messages[i]) == "user"), None)
        if k is None:
            return 0
        try:
            probe = render([*messages[:k], Message("user", "\ue000")])
        except (LocalrunError, ValueError, TypeError, KeyError, IndexError) as e:  # a template that refuses it
            log.debug("checkpoint: no user-turn start (%s)", e)
            return 0
        n = common_prefix(probe, prompt)
        if not 0 < n < len(prompt):
            return 0
        key = tokens_sha256(prompt)
        self.noted[key] = n
        self.noted.move_to_end(key)
        while len(self.noted) > MAX_NOTED:
            self.noted.popitem(last=False)
        return n

    def turn_start_of(self, prompt: Sequence[int]) -> int:
        """Where ``prompt``'s last user message begins, as ``note_turn_start`` saw it; 0 when not noted."""
        return self.noted.get(tokens_sha256(prompt), 0) if self.noted else 0

    # ------------------------------------------------------------------ save / restore / cut
    def save(self, slot) -> Checkpoint | None:
        """Save ``slot``'s recurrent state after its ``len(slot.tokens)`` tokens (the engine's KV must hold
        exactly them) → the checkpoint, or None (nothing held, already saved there, or llama.cpp gave
        nothing)."""
        n = len(slot.tokens)
        if n == 0 or any(c.n_tokens == n for c in slot.checkpoints):
            return None
        eng = self.engine
        C = eng.C
        size = int(C.llama_state_seq_get_size_ext(eng.ctx, slot.seq_id, self.flags))
        if self.follows_model and size > 0 and (size > self.one_bytes or not self.measured):
            self.one_bytes, self.measured = max(size, self.one_bytes if self.measured else 0), True
            self.max_bytes = checkpoint_max_bytes(self.one_bytes, len(eng.slots), self.ram_left_bytes)
        if size == 0 or size > self.max_bytes:
            return None
        buf = (ctypes.c_uint8 * size)()
        if int(C.llama_state_seq_get_data_ext(eng.ctx, buf, size, slot.seq_id, self.flags)) != size:
            log.warning("checkpoint: llama.cpp copied less than %d bytes of sequence %d; not saved", size,
                        slot.seq_id)
            return None
        cp = Checkpoint(n, size, buf)
        slot.checkpoints.append(cp)
        slot.checkpoints.sort(key=lambda c: c.n_tokens)
        self.stats.saves += 1
        self._keep_budget(cp)
        log.debug("checkpoint: sequence %d at %d tokens (%d bytes)", slot.seq_id, n, size)
        return cp

    def best(self, slot, n_keep: int) -> Checkpoint | None:
        """The latest checkpoint of ``slot`` at ``n_keep`` tokens or before, None when there is none."""
        return next((c for c in reversed(slot.checkpoints) if c.n_tokens <= n_keep), None)

    def cut(self, slot, n_keep: int, n_prompt: int) -> int:
        """Cut ``slot``'s sequence back to at most ``n_keep`` of its ``len(slot.tokens)`` tokens for a
        ``n_prompt``-token prompt: ``llama_memory_seq_rm`` when the memory allows it, else the latest
        checkpoint at or before ``n_keep`` restored and the attention KV after it removed → the tokens kept
        (``slot.tokens`` is NOT shortened here; the engine does). 0 with the sequence emptied when no
        checkpoint serves; the log says why."""
        eng = self.engine
        C = eng.C
        if C.llama_memory_seq_rm(eng.mem, slot.seq_id, n_keep, -1):
            self.drop_after(slot, n_keep)
            return n_keep
        cp = self.best(slot, n_keep)
        if cp is not None and self._restore(slot, cp):
            self.drop_after(slot, cp.n_tokens)
            self.stats.restores += 1
            self.stats.restored_tokens += cp.n_tokens
            log.debug("checkpoint: recurrent state cannot be cut at %d of %d; restored the checkpoint at %d "
                      "(%d bytes), prefilling %d of %d prompt tokens", n_keep, len(slot.tokens), cp.n_tokens,
                      cp.nbytes, n_prompt - cp.n_tokens, n_prompt)
            return cp.n_tokens
        why = "its checkpoint did not restore" if cp is not None else f"no checkpoint ≤ {n_keep}"
        log.info("recurrent state cannot be cut at %d of %d; %s: prefilling all %d prompt tokens", n_keep,
                 len(slot.tokens), why, n_prompt)
        self.stats.full_prefills += 1
        reason = FULL_PREFILL_REASONS[cp is not None]
        self.stats.full_prefill_reasons[reason] += 1
        C.llama_memory_seq_rm(eng.mem, slot.seq_id, 0, -1)
        slot.checkpoints.clear()
        self._count()
        return 0

    def drop_after(self, slot, n_keep: int) -> None:
        """Forget ``slot``'s checkpoints past ``n_keep`` tokens (the tokens after it are about to change)."""
        if slot.checkpoints and slot.checkpoints[-1].n_tokens > n_keep:
            slot.checkpoints[:] = [c for c in slot.checkpoints if c.n_tokens <= n_keep]
            self._count()

    def _restore(self, slot, cp: Checkpoint) -> bool:
        """Put ``cp``'s state into ``slot``'s sequence and remove the attention KV after it; the sequence
        then holds exactly its first ``cp.n_tokens`` tokens. False (with a warning) when llama.cpp refuses."""
        eng = self.engine
        C = eng.C
        got = int(C.llama_state_seq_set_data_ext(eng.ctx, cp.data, cp.nbytes, slot.seq_id, self.flags))
        ok = got != 0 and C.llama_memory_seq_rm(eng.mem, slot.seq_id, cp.n_tokens, -1)
        if ok and C.llama_memory_seq_pos_max(eng.mem, slot.seq_id) == cp.n_tokens - 1:
            return True
        log.warning("checkpoint: llama.cpp did not take the checkpoint at %d tokens of sequence %d (read %d "
                    "bytes); forgotten", cp.n_tokens, slot.seq_id, got)
        slot.checkpoints.remove(cp)
        self._count()
        return False

    # ------------------------------------------------------------------ bounds
    def _keep_budget(self, newest: Checkpoint) -> None:
        """Evict until every slot holds at most ``max_per_slot`` and all together at most ``max_bytes``:
        the checkpoint nearest the one before it in its slot first (the first of a slot counts its distance
        from 0), never ``newest``."""
        slots: Sequence = self.engine.slots
        while True:
            over = [s for s in slots if len(s.checkpoints) > self.max_per_slot]
            pool = over or (slots if sum(c.nbytes for s in slots for c in s.checkpoints) > self.max_bytes else [])
            victims = [(c.n_tokens - (s.checkpoints[i - 1].n_tokens if i else 0), s.last_used, s, c)
                       for s in pool for i, c in enumerate(s.checkpoints) if c is not newest]
            if not victims:
                break
            _, _, slot, cp = min(victims, key=lambda v: (v[0], v[1]))
            slot.checkpoints.remove(cp)
            self.stats.evictions += 1
        self._count()

    def _count(self) -> None:
        held = [c for s in self.engine.slots for c in s.checkpoints]
        self.stats.held, self.stats.held_bytes = len(held), sum(c.nbytes for c in held)
