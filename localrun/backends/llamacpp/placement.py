"""Which sequence id a request runs on, so that one decode step is one pass over the weights
(docs/architecture.md §1, "One pass per step").

With one KV stream per sequence (``kv_unified`` off) llama.cpp cuts a decode batch into one ubatch per
run of consecutive sequence ids (src/llama-batch.cpp ``split_equal(sequential=true)``;
``llamacpp/ubatch.py``), and each ubatch reads all the weights again. Prefix affinity alone (take the
slot whose cached tokens share the longest prefix) scatters the running sequences over the ids, so the
engine keeps them in one run:

* ``acquire_slot`` takes, among the free slots that keep the running ids in as few runs as possible
  (a hole first, then either end of the run), the one sharing the longest prefix with the prompt. When
  another free slot would reuse ``MOVE_MIN_TOKENS`` or more tokens beyond that, its KV is copied into
  the chosen one (``move_kv``) instead of giving up the reuse.
* ``compact`` (called by ``step`` before a decode step): a sequence that finished inside the run leaves a
  hole that no new request filled, or a new prompt still prefilling sits in it; the decoding sequences
  outside the densest window of ids are copied into its free ids. When no free id can take them (every
  slot busy) and the prompt in the hole ends within one chunk, ``hole_filler`` has ``step`` prefill it
  first instead.

A copy goes through llama.cpp's per-sequence state (``llama_state_seq_get_data`` /
``llama_state_seq_set_data``, as the KV tiers do: bytes ∝ tokens held, sliding-window cells included),
so it costs about as much as one step reads for that sequence's KV; an extra ubatch costs a pass over
all the weights on every step. The destination's own cached tokens are saved to the KV tiers first
when they are on, and are otherwise dropped. With a unified KV (one stream) any batch is one ubatch
(``split_simple``) and nothing moves.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Iterable, Sequence

from localrun.backends.llamacpp.seq import Generation, Slot
from localrun.backends.text import common_prefix

MOVE_MIN_TOKENS = 32  # reuse worth a copy: prefilling 32 tokens costs far more than copying their KV


def count_runs(ids: Iterable[int]) -> int:
    """Maximal runs of consecutive integers in ``ids`` ({0, 1, 3} → 2; empty → 0)."""
    s = sorted(set(ids))
    return sum(1 for i, x in enumerate(s) if i == 0 or x != s[i - 1] + 1)


def densest_window(active: Sequence[int], movable: Iterable[int], n_slots: int) -> int | None:
    """The start of the window of ``len(active)`` consecutive ids in ``0..n_slots-1`` holding the most of
    ``active`` whose other ids are all in ``movable`` (free slots, which can take a sequence); the lowest
    such start on ties; None when no window qualifies."""
    r, have, free = len(active), set(active), set(movable)
    best, best_n = None, -1
    for lo in range(0, n_slots - r + 1):
        ids = range(lo, lo + r)
        if any(i not in have and i not in free for i in ids):
            continue
        n = sum(1 for i in ids if i in have)
        if n > best_n:
            best, best_n = lo, n
    return best


class SlotPlacement:
    """``acquire_slot``, ``compact`` and ``move_kv`` as methods of ``LlamaCppEngine`` (attributes set in
    its constructor)."""

    C: Any
    ctx: Any
    mem: Any
    slots: list[Slot]
    kv_unified: bool
    kv_cache: Any
    speculation: Any
    step_totals: Any
    prefill_chunk_decoding: int

    def acquire_slot(self, prompt: Sequence[int]) -> Slot | None:
        """The slot ``prompt`` should run on (see the module docstring), None when every slot is busy. May
        copy an idle slot's cached KV into the returned slot (never touches a busy one)."""
        free = [s for s in self.slots if not s.busy]
        if not free:
            return None

        def reuse(s: Slot):  # longest cached prefix; then the lowest id; then least recently used
            return common_prefix(s.tokens, prompt), -s.seq_id, -s.last_used

        best = max(free, key=reuse)
        if self.kv_unified:
            return best
        busy = [s.seq_id for s in self.slots if s.busy]
        base = count_runs(busy)
        delta = {s.seq_id: count_runs(busy + [s.seq_id]) - base for s in free}
        least = min(delta.values())
        keep_run = [s for s in free if delta[s.seq_id] == least]
        chosen = max(keep_run, key=reuse)
        gain = reuse(best)[0] - reuse(chosen)[0]
        if gain >= MOVE_MIN_TOKENS:
            # the reuse is elsewhere: copy it into the run, onto the free slot holding the least
            target = min(keep_run, key=lambda s: (len(s.tokens), s.last_used))
            self.move_kv(best, target)  # best now runs on target's id (or, failing, stays where it was)
        return best if gain >= MOVE_MIN_TOKENS else chosen

    def compact(self, gens: Sequence[Generation], prefilling: Sequence[Generation] = ()) -> None:
        """Before a decode step over ``gens`` (the sequences that decode in it): when their ids are not one
        run, copy the ones outside the densest window of ids into its other ids (``move_kv``), so the step is
        one ubatch. A window id held by a prompt still prefilling (one of ``prefilling``) is freed first by
        moving that prompt to a free id outside the window, the nearest above it first. Other busy slots (a
        finished generation not yet released) are neither targets nor moved. A no-op with a unified KV or
        when the ids already are one run."""
        if self.kv_unified:
            return
        active = sorted(g.slot.seq_id for g in gens if not g.done)
        if count_runs(active) <= 1:
            return
        pre = {g.slot.seq_id for g in prefilling if not g.done}
        movable = pre | {s.seq_id for s in self.slots if not s.busy}
        lo = densest_window(active, movable, len(self.slots))
        if lo is None:
            return
        hi = lo + len(active)
        by_id = {s.seq_id: s for s in self.slots}
        holes = [i for i in range(lo, hi) if i not in active]
        outside = [by_id[i] for i in active if not lo <= i < hi]
        for src, hole in zip(outside, holes):
            dst = by_id[hole]
            if dst.busy:  # a prompt still prefilling: out of the window first
                spare = sorted((s for s in self.slots if not s.busy and not lo <= s.seq_id < hi),
                               key=lambda s: (s.seq_id < hi, abs(s.seq_id - hi)))
                if not spare:
                    continue
                free = spare[0]
                if not self.move_kv(dst, free):  # dst (the prompt) takes free's id; free is now the hole
                    continue
                dst = free
                by_id = {s.seq_id: s for s in self.slots}
            self.move_kv(src, dst)
            by_id = {s.seq_id: s for s in self.slots}

    def hole_filler(self, waiting: Sequence[Generation], decoding: Sequence[Generation]) -> Generation | None:
        """A prompt still prefilling whose id lies inside the span of the ``decoding`` ids (so those are not
        one run while it prefills) and whose rest fits in one chunk taken while others decode
        (``prefill_chunk_decoding``): ``step`` prefills it first, and the next decode step is one ubatch
        without moving anything. None when there is none (or with a unified KV)."""
        if self.kv_unified:
            return None
        ids = sorted(g.slot.seq_id for g in decoding)
        if count_runs(ids) <= 1:
            return None
        fit = [w for w in waiting if ids[0] < w.slot.seq_id < ids[-1] and not w.images
               and len(w.prompt) - w.n_prompt_done <= self.prefill_chunk_decoding]
        return min(fit, key=lambda w: (w.last_prefill, w.t_start)) if fit else None

    def move_kv(self, src: Slot, dst: Slot) -> bool:
        """Copy ``src``'s KV to ``dst``'s sequence id and swap the two slots' ids: ``src`` (and the
        Generation running on it) continues on the other id with the same tokens; ``dst`` becomes an empty
        slot on ``src``'s old id. ``dst`` must be idle; its cached tokens go to the KV tiers first (when
        on). The draft model's KV follows (``DraftModel.move``). Returns False (nothing changed but
        ``dst``'s KV dropped) when llama.cpp cannot copy the state."""
        C = self.C
        if dst.busy or src is dst:
            return False
        if dst.tokens and self.kv_cache is not None:
            self.kv_cache.save(self, dst)
        C.llama_memory_seq_rm(self.mem, dst.seq_id, 0, -1)
        dst.forget()
        n = 0
        if src.tokens:
            n = int(C.llama_state_seq_get_size(self.ctx, src.seq_id))
            buf = (ctypes.c_uint8 * max(1, n))()
            ok = n > 0 and int(C.llama_state_seq_get_data(self.ctx, buf, n, src.seq_id)) == n
            ok = ok and int(C.llama_state_seq_set_data(self.ctx, buf, n, dst.seq_id)) != 0
            if not ok or C.llama_memory_seq_pos_max(self.mem, dst.seq_id) != len(src.tokens) - 1:
                C.llama_memory_seq_rm(self.mem, dst.seq_id, 0, -1)
                return False
        C.llama_memory_seq_rm(self.mem, src.seq_id, 0, -1)
        draft = getattr(self.speculation, "draft", None)
        if draft is not None:
            draft.move(src.seq_id, dst.seq_id)
        src.seq_id, dst.seq_id = dst.seq_id, src.seq_id
        dst.last_used = time.monotonic()
        self.step_totals.moves += 1
        self.step_totals.moved_bytes += n
        return True
