"""The storage of the KV-cache tiers (``kv_cache.KVCache`` is built on it): snapshot payloads in host RAM
and in files on disk, each keyed by the exact tokens whose KV it holds.

Tiers: RAM (``ram_bytes``) holds the payloads; the least recently used spill to the disk tier
(``disk_dir``, ``disk_bytes``) when RAM is over budget, and disk files are deleted LRU first to keep its
budget. A disk file (its format: ``kv_files.py``) is written atomically; a file that is truncated, corrupt
(the checksum differs) or from another model or other settings is ignored with a warning and deleted; it
never reaches the backend. A restored disk snapshot is promoted to RAM when it fits there.

What a payload is belongs to the backend (llama.cpp: a sequence's state, ``kv_cache.KVCache``; MLX: mlx-lm's
prompt-cache file, ``mlx/cache.py``); this module stores, budgets, counts and checks them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from localrun.backends.kv_files import (
    SUFFIX,
    SnapshotFileError,
    read_snapshot_file,
    read_snapshot_header,
    snapshot_file_size,
    tokens_sha256,
    write_snapshot_file,
)

log = logging.getLogger("localrun.kv_cache")


@dataclass
class Checkpoint:
    """A partial state inside a sequence's tokens: after its first ``n_tokens``, ``nbytes`` of ``data`` (a
    ctypes uint8 array; None while only in a disk file). llama.cpp's context checkpoint of a model with
    recurrent layers (``llama_state_seq_get_data_ext(..., LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)``,
    ``llamacpp/checkpoints.py``)."""

    n_tokens: int
    nbytes: int
    data: object = None


@dataclass
class Snapshot:
    """One saved sequence: ``tokens`` (the exact tokens whose KV it holds), ``nbytes`` (payload bytes),
    ``data`` (the payload while in the RAM tier, else None), ``path`` (its disk file, or None),
    ``checkpoints`` (``Checkpoint``s at positions inside ``tokens``, ascending: llama.cpp's context
    checkpoints of a model with recurrent layers; in RAM with the payload, written after it in its disk
    file, their ``data`` None while only there)."""

    tokens: tuple[int, ...]
    nbytes: int
    data: object = None  # ctypes uint8 array
    path: Path | None = None
    last_used: float = field(default_factory=time.monotonic)
    checkpoints: list = field(default_factory=list)

    @property
    def ram_bytes(self) -> int:
        """Bytes it holds in RAM: the payload and its checkpoints (0 once spilled)."""
        if self.data is None:
            return 0
        return self.nbytes + sum(c.nbytes for c in self.checkpoints if c.data is not None)

    def spilled(self) -> None:
        """Its payload left RAM: only a disk file keeps it and its checkpoints (their positions stay known)."""
        self.data = None
        self.checkpoints = [Checkpoint(c.n_tokens, c.nbytes) for c in self.checkpoints] if self.path else []


@dataclass
class TierStats:
    """Counters for /metrics and bench: hits per tier, misses, restored tokens, restore seconds, saves."""

    hits_ram: int = 0
    hits_disk: int = 0
    misses: int = 0
    restored_tokens: int = 0
    restore_s: float = 0.0
    saves: int = 0
    spills: int = 0
    corrupt_files: int = 0


class SnapshotStore:
    """The RAM and disk tiers of one engine's snapshots (see the module docstring).

    ``model_id``: 16 hex digits naming the model (or a function giving them, called on the first disk
    access); ``settings``: the KV settings a file must match (``kv_files.engine_settings``); ``ram_bytes``:
    payload bytes held in RAM at most; ``disk_dir``: the folder for this model's files (created, its files
    indexed), None for no disk tier; ``disk_bytes``: bytes of files in ``disk_dir`` at most. Thread-safe.
    """

    def __init__(self, model_id: str | Callable[[], str], settings: dict, *, ram_bytes: int,
                 disk_dir: str | os.PathLike | None = None, disk_bytes: int = 0) -> None:
        self._model_id = model_id  # or a function giving it: hashed on the first disk access, not at load
        self.settings = settings
        self.ram_bytes = max(0, int(ram_bytes))
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self.disk_bytes = max(0, int(disk_bytes)) if self.disk_dir is not None else 0
        self.stats = TierStats()
        self.snapshots: dict[tuple[int, ...], Snapshot] = {}
        self._lock = threading.RLock()
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            self._scan()

    @property
    def model_id(self) -> str:
        """16 hex digits naming the model (``kv_files.model_identity``); computed when first needed."""
        if callable(self._model_id):
            self._model_id = self._model_id()
        return self._model_id

    # ------------------------------------------------------------------ sizes
    @property
    def ram_used_bytes(self) -> int:
        return sum(s.ram_bytes for s in self.snapshots.values())

    @property
    def disk_used_bytes(self) -> int:
        return sum(s.path.stat().st_size for s in self.snapshots.values() if s.path is not None and s.path.exists())

    def spill_all(self) -> None:
        """Move every RAM snapshot to the disk tier (those that do not fit there are forgotten)."""
        with self._lock:
            for snap in list(self.snapshots.values()):
                if snap.data is not None and snap.path is None and self.disk_dir is not None:
                    self._write(snap)
                    self.stats.spills += 1
                snap.spilled()
                if snap.path is None:
                    self.snapshots.pop(snap.tokens, None)

    # ------------------------------------------------------------------ snapshots in the tiers
    def touch(self, tokens: tuple[int, ...]) -> Snapshot | None:
        """The snapshot of exactly ``tokens``, marked as just used, or None."""
        with self._lock:
            snap = self.snapshots.get(tokens)
            if snap is not None:
                snap.last_used = time.monotonic()
            return snap

    def add(self, tokens: tuple[int, ...], data, *, sliding: bool, checkpoints=()) -> Snapshot | None:
        """Record ``data`` (a payload: a ctypes uint8 array) as the snapshot of ``tokens`` in the RAM tier,
        spilling LRU snapshots to disk past ``ram_bytes`` → the snapshot, or None when it is too big for every
        tier. Unless ``sliding`` (the model has sliding-window or recurrent layers: a snapshot resumes only at
        its exact end, or at one of its ``checkpoints``), a longer snapshot covers every prefix of itself, so
        the snapshots of its prefixes are dropped."""
        n = ctypes.sizeof(data)
        if n > max(self.ram_bytes, self.disk_bytes):
            return None
        with self._lock:
            snap = Snapshot(tokens, n, data=data, checkpoints=list(checkpoints))
            if not sliding:
                for t in [t for t in self.snapshots if len(t) < len(tokens) and tokens[: len(t)] == t]:
                    self._drop(self.snapshots[t])
            self.snapshots[tokens] = snap
            self.stats.saves += 1
            self._keep_ram_budget()
            return snap

    def payload(self, snap: Snapshot):
        """The payload of ``snap`` to restore: its RAM copy, or its disk file read and checked → a ctypes uint8
        array, or None (a bad file: warned, deleted, forgotten; counted as a miss)."""
        data = snap.data if snap.data is not None else self._read(snap)
        if data is None:
            self.stats.misses += 1
        return data

    def restored(self, snap: Snapshot, data, t0: float, note: str = "") -> None:
        """Count ``snap`` (its ``payload``, ``data``) as restored, the restore having begun at ``t0``
        (``time.perf_counter``): a hit of its tier, promoted from disk to RAM when it fits there, logged
        (``note`` ends the line)."""
        tier = "ram" if data is snap.data else "disk"
        snap.last_used = time.monotonic()
        if tier == "disk":
            self.stats.hits_disk += 1
            if snap.nbytes <= self.ram_bytes:  # promote: the next hit is a RAM hit
                snap.data = data
                self._keep_ram_budget(keep=snap)
            else:
                snap.spilled()  # its checkpoints' bytes read with it stay on disk only
            if snap.path is not None and snap.path.exists():
                os.utime(snap.path)
        else:
            self.stats.hits_ram += 1
        dt = time.perf_counter() - t0
        self.stats.restore_s += dt
        self.stats.restored_tokens += len(snap.tokens)
        log.debug("kv cache: restored %d tokens from %s in %.3f s%s", len(snap.tokens), tier, dt, note)

    # ------------------------------------------------------------------ tiers
    def _keep_ram_budget(self, keep: Snapshot | None = None) -> None:
        """Spill (or, without a disk tier, forget) the least recently used RAM snapshots until the RAM
        tier is within ``ram_bytes``."""
        in_ram = sorted((s for s in self.snapshots.values() if s.data is not None), key=lambda s: s.last_used)
        used = sum(s.ram_bytes for s in in_ram)
        for snap in in_ram:
            if used <= self.ram_bytes:
                break
            if snap is keep:
                continue
            used -= snap.ram_bytes
            if snap.path is None and self.disk_dir is not None:
                self._write(snap)
                self.stats.spills += 1
            snap.spilled()
            if snap.path is None:
                self.snapshots.pop(snap.tokens, None)

    def _drop(self, snap: Snapshot) -> None:
        self.snapshots.pop(snap.tokens, None)
        snap.data = None
        snap.checkpoints = []
        if snap.path is not None:
            snap.path.unlink(missing_ok=True)
            snap.path = None

    def _write(self, snap: Snapshot) -> bool:
        """Write ``snap`` to the disk tier atomically, first deleting LRU files so that the folder stays
        within ``disk_bytes`` while the temporary file exists. False when it cannot fit."""
        cps = [c for c in snap.checkpoints if c.data is not None]
        size = snapshot_file_size(snap.tokens, snap.nbytes + sum(c.nbytes for c in cps), self.model_id,
                                  self.settings, len(cps))
        if size > self.disk_bytes:
            return False
        on_disk = sorted((s for s in self.snapshots.values() if s.path is not None), key=lambda s: s.last_used)
        used = self._folder_bytes()
        for old in on_disk:
            if used + size <= self.disk_bytes:
                break
            used -= old.path.stat().st_size if old.path.exists() else 0
            old.path.unlink(missing_ok=True)
            old.path = None
            if old.data is None:
                self.snapshots.pop(old.tokens, None)
        if used + size > self.disk_bytes:
            return False
        path = self.disk_dir / (tokens_sha256(snap.tokens)[:32] + SUFFIX)
        try:
            write_snapshot_file(path, self.model_id, self.settings, snap.tokens, snap.data, cps)
        except OSError as e:
            log.warning("kv cache: could not write %s: %s", path, e)
            return False
        snap.path = path
        snap.checkpoints = cps
        return True

    def _folder_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.disk_dir.iterdir() if p.is_file())

    def _read_header(self, path: Path) -> tuple[dict, int] | None:
        """The header of ``path`` and the payload's offset, or None (with a warning, the file deleted) when
        it is not a snapshot of this model and settings, or is truncated."""
        try:
            return read_snapshot_header(path, self.model_id, self.settings)
        except (SnapshotFileError, OSError) as e:
            self._reject(path, str(e))
            return None

    def _reject(self, path: Path, why: str) -> None:
        self.stats.corrupt_files += 1
        log.warning("kv cache: ignoring %s: %s; deleted", path, why)
        path.unlink(missing_ok=True)

    def _scan(self) -> None:
        """Index the disk tier's files (headers only); reject foreign, truncated and stray files."""
        for path in sorted(self.disk_dir.iterdir()):
            if not path.is_file():
                continue
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # a write that never finished
                continue
            got = self._read_header(path)
            if got is None:
                continue
            hdr, _ = got
            tokens = tuple(int(t) for t in hdr["tokens"])
            try:
                cps = [Checkpoint(int(n), int(b)) for n, b in hdr.get("checkpoints", [])]
            except (TypeError, ValueError):
                self._reject(path, "corrupt header (checkpoints)")
                continue
            nbytes = int(hdr["payload_bytes"]) - sum(c.nbytes for c in cps)
            if nbytes <= 0 or any(not 0 < c.n_tokens <= len(tokens) or c.nbytes <= 0 for c in cps):
                self._reject(path, "corrupt header (checkpoints)")
                continue
            self.snapshots[tokens] = Snapshot(tokens, nbytes, path=path, checkpoints=cps,
                                              last_used=time.monotonic() - (time.time() - path.stat().st_mtime))

    def _read(self, snap: Snapshot):
        """The payload of a disk snapshot, checked against its header → a ctypes uint8 array, or None (the
        file was bad: warned, deleted, forgotten)."""
        try:
            tokens, buf = read_snapshot_file(snap.path, self.model_id, self.settings)
            if tokens == snap.tokens and ctypes.sizeof(buf) == snap.nbytes + sum(c.nbytes for c in snap.checkpoints):
                if not snap.checkpoints:
                    return buf
                off, cps = snap.nbytes, []  # the checkpoints follow the state (kv_files.py): each its own copy
                for c in snap.checkpoints:
                    cps.append(Checkpoint(c.n_tokens, c.nbytes, (ctypes.c_uint8 * c.nbytes).from_buffer_copy(buf, off)))
                    off += c.nbytes
                snap.checkpoints = cps
                return (ctypes.c_uint8 * snap.nbytes).from_buffer(buf)
            why = "its tokens changed since it was indexed"
        except (SnapshotFileError, OSError) as e:
            why = str(e)
        if snap.path is not None:
            self._reject(snap.path, why)
        self.snapshots.pop(snap.tokens, None)
        snap.path = None
        return None
