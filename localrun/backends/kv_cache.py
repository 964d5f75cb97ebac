"""KV-cache tiers for the llama.cpp engine: sequence snapshots kept in host RAM and on disk (docs/architecture.md §4).

A snapshot is one sequence's KV and state, copied with llama.cpp's per-sequence state API
(``llama_state_seq_get_data`` / ``llama_state_seq_set_data``, src/llama-context.cpp), keyed by the exact
tokens it holds and by the model file and KV settings (``identity``). The engine calls ``KVCache.admit``
when a prompt takes a slot: the slot's own tokens are saved first when the new prompt would cut them
(its KV is about to be dropped), then the snapshot whose tokens share the longest prefix with the prompt
is restored into the slot when it beats what the slot already holds. ``persist`` (the engine's ``close``)
saves every slot and writes the RAM tier to disk, so the disk tier survives a restart.

Tiers: RAM (``ram_bytes``) holds the payloads; the least recently used spill to the disk tier
(``disk_dir``, ``disk_bytes``) when RAM is over budget, and disk files are deleted LRU first to keep its
budget; a bad disk file is ignored with a warning and deleted, it never reaches llama.cpp. That storage is
``kv_store.SnapshotStore`` (which ``KVCache`` extends with the engine's hooks, the lookup and the
boundaries); the file format is ``kv_files.py``. This module re-exports both modules' names.

Sliding-window models (Gemma-3's SWA layers without ``swa_full``): the SWA cache holds only the last
``n_swa`` positions, so a snapshot can be resumed only at exactly the position where it was taken; such a
snapshot is restored only when its tokens are a strict prefix of the prompt (never cut back).

Recurrent layers (a hybrid's delta-net, Mamba or short-conv state: ``engine.recurrent``): the state has folded
in every token and cannot be cut back either (``exact_only``), so a snapshot keeps the slot's context
checkpoints (``llamacpp/checkpoints.py``; in RAM and in its disk file), and is restored when its tokens are
a strict prefix of the prompt or when one of its checkpoints lies within the shared prefix: the engine's cut
then restores that checkpoint. A slot's own tokens are reused up to its latest checkpoint, which is what a
snapshot must beat.

Boundaries: snapshots are taken where reuse is likely. The end of each turn comes for free (a slot's
tokens, saved when another prompt takes the slot). The end of a system prompt is told by ``note_boundary``
(the engine's ``tokenize_chat``: the tokens a chat's leading system messages render to); a later prompt
that starts with them is prefilled up to there, saved, then prefilled on (``boundary_in``), so the next
request with that system prompt and another user turn restores it, on sliding-window models too.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Sequence

from localrun.backends.kv_files import (
    MAGIC,
    SUFFIX,
    SnapshotFileError,
    engine_settings,
    model_identity,
    read_snapshot_file,
    read_snapshot_header,
    snapshot_file_size,
    tokens_sha256,
    write_snapshot_file,
)
from localrun.backends.kv_store import Snapshot, SnapshotStore, TierStats
from localrun.backends.text import common_prefix

__all__ = [
    "MAGIC", "SUFFIX", "MIN_TOKENS", "MAX_BOUNDARIES", "KVCache", "Snapshot", "SnapshotFileError", "SnapshotStore",
    "TierStats", "attach_kv_cache", "engine_settings", "exact_only", "load_slot_file", "model_identity",
    "read_snapshot_file", "read_snapshot_header", "save_slot_file", "snapshot_file_size", "system_prompt_end",
    "tokens_sha256", "write_snapshot_file",
]

log = logging.getLogger("localrun.kv_cache")

MIN_TOKENS = 32  # shorter prefixes are cheaper to prefill than to save and look up
MAX_BOUNDARIES = 64  # system prompts remembered (their tokens' SHA-256), least recently noted forgotten first


class KVCache(SnapshotStore):
    """One llama.cpp engine's snapshots in the RAM and disk tiers (``SnapshotStore``: ``ram_bytes``,
    ``disk_dir``, ``disk_bytes``), with the engine's hooks (``admit``, ``persist``, ``save``, ``restore``), the
    lookup (``best``) and the system-prompt boundaries (see the module docstring). ``min_tokens``: shorter
    prompts are neither saved nor looked up. Thread-safe.
    """

    def __init__(self, model_id: str | Callable[[], str], settings: dict, *, ram_bytes: int,
                 disk_dir: str | os.PathLike | None = None,
                 disk_bytes: int = 0, min_tokens: int = MIN_TOKENS) -> None:
        self.min_tokens = min_tokens
        self.boundaries: OrderedDict[str, int] = OrderedDict()  # SHA-256 of a prefix's tokens → its length
        super().__init__(model_id, settings, ram_bytes=ram_bytes, disk_dir=disk_dir, disk_bytes=disk_bytes)

    # ------------------------------------------------------------------ the engine's hooks
    def admit(self, engine, slot, prompt: Sequence[int]) -> None:
        """``prompt`` is about to run on ``slot`` (``LlamaCppEngine.start``, before it cuts the slot's KV to
        the shared prefix): save the slot's tokens when the prompt would drop some of them, then restore
        the best snapshot when it reuses more of the prompt than the slot does. The slot's ``tokens``
        always equal its KV afterwards. Never raises for a bad snapshot (it is deleted, the prompt is
        prefilled)."""
        with self._lock:
            cp = common_prefix(slot.tokens, prompt)
            own = self._own(engine, slot, cp)
            if cp < len(slot.tokens) - 1:
                self.save(engine, slot)
            if len(prompt) < self.min_tokens:
                return
            snap, usable = self.best(prompt, sliding=exact_only(engine))
            if snap is None or usable <= own:
                self.stats.misses += 1 if own == 0 else 0
                return
            self.restore(engine, slot, snap)

    def persist(self, engine) -> None:
        """Save every slot's tokens and write the RAM tier to disk (the engine is closing): the next
        process with the same ``disk_dir`` finds them."""
        if self.disk_dir is None:
            return  # RAM ends with the process
        with self._lock:
            for slot in engine.slots:
                if len(slot.tokens) >= self.min_tokens:
                    self.save(engine, slot)
            for snap in sorted(self.snapshots.values(), key=lambda s: -s.last_used):
                if snap.path is None and snap.data is not None:
                    self._write(snap)

    # ------------------------------------------------------------------ boundaries
    def note_boundary(self, tokens: Sequence[int]) -> None:
        """``tokens`` (a prompt's first tokens: a chat's system prompt) end where a snapshot is worth taking:
        prompts that start with them get one there (``boundary_in``). Shorter than ``min_tokens``: ignored.
        Remembers the last ``MAX_BOUNDARIES``."""
        if len(tokens) < self.min_tokens:
            return
        key = tokens_sha256(tokens)
        with self._lock:
            self.boundaries[key] = len(tokens)
            self.boundaries.move_to_end(key)
            while len(self.boundaries) > MAX_BOUNDARIES:
                self.boundaries.popitem(last=False)

    def boundary_in(self, prompt: Sequence[int], start: int, *, sliding: bool) -> int:
        """The longest noted boundary ``b`` inside ``prompt``'s part still to prefill (``start < b <
        len(prompt)``) whose tokens no snapshot holds yet → ``b`` (the engine stops its prefill there and
        calls ``save``), 0 when there is none. ``sliding``: only a snapshot of exactly ``prompt[:b]`` holds
        them (see ``best``); otherwise any snapshot that starts with them."""
        with self._lock:
            for n in sorted(set(self.boundaries.values()), reverse=True):
                if not start < n < len(prompt) or tokens_sha256(prompt[:n]) not in self.boundaries:
                    continue
                head = tuple(prompt[:n])
                held = head in self.snapshots if sliding else \
                    any(len(t) >= n and t[:n] == head for t in self.snapshots)
                return 0 if held else n
        return 0

    # ------------------------------------------------------------------ lookup
    def best(self, prompt: Sequence[int], *, sliding: bool) -> tuple[Snapshot | None, int]:
        """The snapshot that reuses the most of ``prompt`` → (snapshot, tokens reused), (None, 0) when none.
        ``sliding``: a snapshot whose tokens are a strict prefix of the prompt counts whole (an exact
        boundary), any other only up to its latest context checkpoint within the shared prefix (recurrent
        layers: the engine restores that checkpoint after the snapshot); otherwise any shared prefix (the
        restored KV is cut back to it)."""
        best, best_n = None, 0
        for snap in self.snapshots.values():
            n = common_prefix(snap.tokens, prompt)
            if sliding and not (n == len(snap.tokens) < len(prompt)):
                cut = min(n, len(prompt) - 1)
                n = max((c.n_tokens for c in snap.checkpoints if c.n_tokens <= cut), default=0)
                if n == 0:
                    continue
            if n > best_n or (n == best_n and best is not None and snap.data is not None and best.data is None):
                best, best_n = snap, n
        return (best, best_n) if best_n >= self.min_tokens else (None, 0)

    @staticmethod
    def _own(engine, slot, n_keep: int) -> int:
        """How many of the slot's own tokens a prompt sharing ``n_keep`` of them keeps (the engine's rules,
        ``LlamaCppEngine._cut``): all ``n_keep`` when nothing is cut; with sliding-window layers, ``n_keep``
        while the window before the cut is held, else 0; with recurrent layers, its latest context checkpoint
        at or before ``n_keep`` (0 without one)."""
        if n_keep == 0 or n_keep >= len(slot.tokens):
            return n_keep
        checkpoints = getattr(engine, "checkpoints", None)
        if checkpoints is not None:
            cp = checkpoints.best(slot, n_keep)
            return cp.n_tokens if cp is not None else 0
        if not engine.n_swa:
            return n_keep
        pos_min = engine.C.llama_memory_seq_pos_min(engine.mem, slot.seq_id)
        return n_keep if 0 <= pos_min <= max(0, n_keep - engine.n_swa) else 0

    # ------------------------------------------------------------------ save / restore
    def save(self, engine, slot) -> Snapshot | None:
        """Copy ``slot``'s KV into the RAM tier (spilling LRU snapshots to disk past ``ram_bytes``).
        Returns the snapshot, or None (too short, too big for every tier, or llama.cpp gave nothing)."""
        tokens = tuple(slot.tokens)
        if len(tokens) < self.min_tokens:
            return None
        with self._lock:
            old = self.touch(tokens)
            if old is not None:
                if old.data is not None and getattr(slot, "checkpoints", None):  # the slot's newer checkpoints too
                    have = {c.n_tokens for c in old.checkpoints}
                    old.checkpoints = sorted(old.checkpoints + [c for c in slot.checkpoints if c.n_tokens not in have],
                                             key=lambda c: c.n_tokens)
                return old
            C = engine.C
            n = int(C.llama_state_seq_get_size(engine.ctx, slot.seq_id))
            if n == 0 or n > max(self.ram_bytes, self.disk_bytes):
                return None
            buf = (ctypes.c_uint8 * n)()
            got = int(C.llama_state_seq_get_data(engine.ctx, buf, n, slot.seq_id))
            if got != n:
                log.warning("kv cache: llama.cpp copied %d of %d bytes of sequence %d; not saved", got, n,
                            slot.seq_id)
                return None
            return self.add(tokens, buf, sliding=exact_only(engine), checkpoints=getattr(slot, "checkpoints", ()))

    def restore(self, engine, slot, snap: Snapshot) -> bool:
        """Load ``snap`` into ``slot`` (its KV and ``tokens`` replaced). A disk snapshot is read and checked
        first; a bad one is deleted. Returns whether the slot now holds it."""
        t0 = time.perf_counter()
        data = self.payload(snap)
        if data is None:
            return False
        C = engine.C
        C.llama_memory_seq_rm(engine.mem, slot.seq_id, 0, -1)
        _forget(slot)
        got = int(C.llama_state_seq_set_data(engine.ctx, data, snap.nbytes, slot.seq_id))
        pos_max = C.llama_memory_seq_pos_max(engine.mem, slot.seq_id)
        if got == 0 or pos_max != len(snap.tokens) - 1:
            log.warning("kv cache: llama.cpp did not accept a %d-token snapshot (read %d bytes, pos_max %d); "
                        "deleted", len(snap.tokens), got, pos_max)
            C.llama_memory_seq_rm(engine.mem, slot.seq_id, 0, -1)
            self._drop(snap)
            self.stats.misses += 1
            return False
        slot.tokens.extend(snap.tokens)
        if snap.checkpoints and hasattr(slot, "checkpoints"):  # the engine's cut restores one of them
            slot.checkpoints[:] = [c for c in snap.checkpoints if c.data is not None]
        note = f" (recurrent state: at its end or one of its {len(snap.checkpoints)} checkpoints)" \
            if getattr(engine, "recurrent", False) else " (sliding window: exact boundary)" if engine.n_swa else ""
        self.restored(snap, data, t0, note)
        return True


def exact_only(engine) -> bool:
    """Whether ``engine``'s snapshots resume only at exactly their end: sliding-window or recurrent layers,
    whose cache cannot be cut back (``LlamaCppEngine.exact_snapshots``)."""
    return bool(getattr(engine, "exact_snapshots", engine.n_swa))


def _forget(slot) -> None:
    """``slot`` no longer holds its tokens (nor, on a recurrent model, their checkpoints)."""
    forget = getattr(slot, "forget", None)
    if forget is not None:
        forget()
    else:
        slot.tokens.clear()


def system_prompt_end(cache: KVCache, messages: Sequence, prompt: Sequence[int], render, *, tools: bool = False
                      ) -> int:
    """Note where ``prompt`` (``messages`` rendered) stops being the same for every user turn after its leading
    system (or developer) messages, as a boundary of ``cache`` (``KVCache.note_boundary``) → that position, 0 when
    there is none (no system message and no tools, nothing after it, too short, or a template that will not render
    the probe). ``tools``: ``render`` writes tool definitions, which templates put in the system turn (Qwen, Llama
    3, Hermes): an agent's request has a long shared head even with no system message, and concurrent requests
    that share it restore it instead of each prefilling it. ``render(messages)`` → token ids. The probe is the
    system messages plus a user turn whose text is one private-use character: the common prefix of its tokens and
    ``prompt``'s ends where the user's text begins (after the template's user header; a template that folds the
    system text into the first user turn, as Gemma's does, gives the same), and is always a true prefix of
    ``prompt``. Raises nothing."""
    from localrun.backends.base import Message
    from localrun.errors import LocalrunError

    def role(m) -> str | None:
        return m.get("role") if isinstance(m, dict) else getattr(m, "role", None)

    k = 0
    while k < len(messages) and role(messages[k]) in ("system", "developer"):
        k += 1
    if (k == 0 and not tools) or k == len(messages) or len(prompt) <= cache.min_tokens:
        return 0
    try:
        probe = render([*messages[:k], Message("user", "\ue000")])
    except (LocalrunError, ValueError, TypeError, KeyError, IndexError) as e:  # a template that refuses it
        log.debug("kv cache: no system-prompt boundary (%s)", e)
        return 0
    n = common_prefix(probe, prompt)
    if n >= len(prompt) or n < cache.min_tokens:
        return 0
    cache.note_boundary(prompt[:n])
    return n


def attach_kv_cache(engine, *, ram_bytes: int | None, disk_dir: str | os.PathLike | None = None,
                    disk_bytes: int = 0) -> KVCache:
    """Give a llama.cpp ``engine`` KV tiers: a ``KVCache`` for its model file and KV settings, its disk files
    in ``disk_dir/<model id>`` (one folder per model: another model's files are never touched). ``ram_bytes``
    None: the default (``offload.kv_tiers.default_cache_ram_bytes`` of the RAM available now, the model
    loaded). Sets and returns ``engine.kv_cache``."""
    if ram_bytes is None:
        import psutil

        from localrun.offload.kv_tiers import default_cache_ram_bytes

        ram_bytes = default_cache_ram_bytes(psutil.virtual_memory().available)
        log.info("kv cache: RAM tier %d MiB (the default)", ram_bytes >> 20)
    if disk_dir is not None:  # the folder is named by the model: hash it now
        mid = model_identity(engine.model_path)
        folder = Path(disk_dir) / mid
    else:  # RAM only: the identity matters only for files (/save), so it is hashed then, off the load path
        mid, folder = functools.partial(model_identity, engine.model_path), None
    cache = KVCache(mid, engine_settings(engine), ram_bytes=ram_bytes, disk_dir=folder, disk_bytes=disk_bytes)
    engine.kv_cache = cache
    return cache


def save_slot_file(engine, slot, path: str | os.PathLike) -> int:
    """Write ``slot``'s KV (a llama.cpp engine's sequence) to ``path`` as a snapshot file (``/save`` in
    ``localrun chat``) → bytes written; 0 when there is nothing to save. Raises OSError."""
    n = int(engine.C.llama_state_seq_get_size(engine.ctx, slot.seq_id)) if slot.tokens else 0
    if n == 0:
        return 0
    buf = (ctypes.c_uint8 * n)()
    if int(engine.C.llama_state_seq_get_data(engine.ctx, buf, n, slot.seq_id)) != n:
        return 0
    return write_snapshot_file(Path(path), model_identity(engine.model_path), engine_settings(engine),
                               tuple(slot.tokens), buf)


def load_slot_file(engine, slot, path: str | os.PathLike) -> int:
    """Restore a snapshot file written by ``save_slot_file`` into ``slot`` (its KV and ``tokens`` replaced)
    → tokens restored. Raises SnapshotFileError (another model or settings, corrupt, truncated, or llama.cpp
    refused it: the slot is then empty), OSError."""
    tokens, buf = read_snapshot_file(Path(path), model_identity(engine.model_path), engine_settings(engine))
    C = engine.C
    C.llama_memory_seq_rm(engine.mem, slot.seq_id, 0, -1)
    _forget(slot)
    got = int(C.llama_state_seq_set_data(engine.ctx, buf, ctypes.sizeof(buf), slot.seq_id))
    if got == 0 or C.llama_memory_seq_pos_max(engine.mem, slot.seq_id) != len(tokens) - 1:
        C.llama_memory_seq_rm(engine.mem, slot.seq_id, 0, -1)
        raise SnapshotFileError("llama.cpp did not accept the snapshot")
    slot.tokens.extend(tokens)
    return len(tokens)
