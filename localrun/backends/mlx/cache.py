"""Prompt-cache tiers on MLX (docs/architecture.md §4): ``MlxEngine``'s KV cache saved to and restored from the same
RAM and disk tiers as llama.cpp's sequence snapshots (``kv_cache.py``).

A snapshot's payload is mlx-lm's own prompt-cache file (``mlx_lm.models.cache.save_prompt_cache``: a
safetensors blob of every layer's ``state`` plus the cache classes), written to memory instead of a file.
Growing ``KVCache`` layers are cut to their ``offset`` first (mlx-lm keeps a buffer rounded up to 256
tokens). The tiers, budgets, LRU spilling, the file format (``MAGIC``, a JSON header with the model
identity, the KV settings and the exact tokens, SHA-256 of tokens and payload) and atomic writes are
``kv_cache.KVCache``'s: ``MlxKVCache`` subclasses it and replaces only how a payload is taken from and
put into an engine. A restored payload is checked again against the model (the cache classes of
``make_prompt_cache(model)``, one layer each, every offset = the snapshot's token count); one that does not
match is deleted with a warning and the prompt is prefilled.

Keys: the model (``model_identity`` of the GGUF file; for an MLX folder, of its config.json and
safetensors files) and ``mlx_settings``: mlx and mlx-lm versions, how the weights were converted (native
or re-quantized GGUF, an MLX folder) and whether they were dequantized for the CPU — all change the KV's
bits.

Sliding-window models (Gemma-3 on MLX: ``RotatingKVCache`` layers): a snapshot is restored only when its
tokens are a strict prefix of the prompt (an exact boundary, never cut back), as on llama.cpp.

The MLX engine holds one sequence, so ``slot`` is None everywhere here (the hooks keep ``KVCache``'s
signatures).
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from localrun.backends.kv_cache import (
    KVCache,
    Snapshot,
    SnapshotFileError,
    model_identity,
    read_snapshot_file,
    write_snapshot_file,
)
from localrun.backends.text import common_prefix

if TYPE_CHECKING:
    from localrun.backends.mlx.engine import MlxEngine

log = logging.getLogger("localrun.kv_cache")


class _NamedBytes(io.BytesIO):
    name = "prompt_cache.safetensors"  # mx.load reads the format from the name (load_prompt_cache passes none)


def mlx_identity(engine: MlxEngine) -> str:
    """16 hex digits naming the model: ``model_identity`` of a GGUF file; for an MLX folder, SHA-256 over
    config.json and each safetensors file's name, size and first 1 MiB."""
    path = Path(engine.model_path)
    if path.is_file():
        return model_identity(path)
    h = hashlib.sha256()
    for f in sorted([path / "config.json", *path.glob("*.safetensors")]):
        if f.is_file():
            h.update(f"{f.name}:{f.stat().st_size}".encode())
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def mlx_settings(engine: MlxEngine) -> dict:
    """What a snapshot's KV depends on besides the model file (see the module docstring)."""
    import mlx.core as mx
    import mlx_lm

    return {"backend": "mlx", "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
            "weights": engine.conversion_note, "cpu_dequantized": bool(engine.cpu_dequantized)}


def cache_payload(cache: list):
    """mlx-lm per-layer caches → their prompt-cache file as a ctypes uint8 array (what ``KVCache`` stores)."""
    from mlx_lm.models.cache import KVCache as MlxKV
    from mlx_lm.models.cache import save_prompt_cache

    def compact(c):
        if type(c) is MlxKV and c.keys is not None and c.offset < c.keys.shape[2]:
            return MlxKV.from_state((c.keys[..., :c.offset, :], c.values[..., :c.offset, :], c.offset))
        return c

    buf = io.BytesIO()
    save_prompt_cache(buf, [compact(c) for c in cache])
    view = buf.getbuffer()
    return (ctypes.c_uint8 * len(view)).from_buffer(view)


def cache_from_payload(engine: MlxEngine, data, n_tokens: int) -> list:
    """A payload of ``cache_payload`` → per-layer caches for ``engine``'s model holding ``n_tokens``. Raises
    SnapshotFileError when it is not a cache of this model's shape (classes, layers, offsets)."""
    from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache

    try:
        cache = load_prompt_cache(_NamedBytes(memoryview(data)))
    except (ValueError, KeyError, RuntimeError, TypeError) as e:
        raise SnapshotFileError(f"not an mlx-lm prompt cache ({e})") from None
    want = [type(c).__name__ for c in make_prompt_cache(engine.model)]
    got = [type(c).__name__ for c in cache]
    if got != want:
        raise SnapshotFileError(f"cache layers {got[:2]}… ×{len(got)} do not fit this model ({want[:2]}… ×{len(want)})")
    if any(int(getattr(c, "offset", -1)) != n_tokens for c in cache):
        raise SnapshotFileError(f"cache offsets differ from its {n_tokens} tokens")
    return cache


def _sliding(engine: MlxEngine) -> bool:
    """Whether the model has sliding-window layers (snapshots resume only at exact boundaries)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = engine.prompt_cache or make_prompt_cache(engine.model)
    return any(getattr(c, "max_size", None) for c in cache)


class MlxKVCache(KVCache):
    """``KVCache`` (tiers, budgets, files, stats) for an ``MlxEngine``: ``admit`` / ``persist`` / ``save`` /
    ``restore`` take the payload from mlx-lm's prompt cache (see the module docstring). Thread-safe."""

    def admit(self, engine: MlxEngine, slot, prompt: Sequence[int]) -> None:
        """``prompt`` is about to run (``MlxEngine.reuse_prefix``, before it cuts the cache to the shared
        prefix): save the cache when the prompt would drop some of it, then restore the best snapshot when it
        reuses more of the prompt than the cache does. Never raises for a bad snapshot."""
        from mlx_lm.models.cache import can_trim_prompt_cache

        with self._lock:
            held = engine.cached_tokens
            cp = min(common_prefix(held, prompt), len(prompt) - 1)
            own = cp if cp == len(held) or (engine.prompt_cache and can_trim_prompt_cache(engine.prompt_cache)) else 0
            if cp < len(held) - 1:
                self.save(engine, slot)
            if len(prompt) < self.min_tokens:
                return
            snap, usable = self.best(prompt, sliding=_sliding(engine))
            if snap is None or min(usable, len(prompt) - 1) <= own:
                self.stats.misses += 1 if own == 0 else 0
                return
            self.restore(engine, slot, snap)

    def persist(self, engine: MlxEngine) -> None:
        """Save the engine's cache and write the RAM tier to disk (the engine is closing)."""
        if self.disk_dir is None:
            return
        with self._lock:
            self.save(engine, None)
            for snap in sorted(self.snapshots.values(), key=lambda s: -s.last_used):
                if snap.path is None and snap.data is not None:
                    self._write(snap)

    def save(self, engine: MlxEngine, slot=None) -> Snapshot | None:
        """Copy the engine's KV cache into the RAM tier (spilling LRU snapshots to disk past ``ram_bytes``) →
        the snapshot, or None (too short, or too big for every tier)."""
        tokens = tuple(engine.cached_tokens)
        if len(tokens) < self.min_tokens or not engine.prompt_cache:
            return None
        with self._lock:
            old = self.touch(tokens)
            if old is not None:
                return old
            return self.add(tokens, cache_payload(engine.prompt_cache), sliding=_sliding(engine))

    def restore(self, engine: MlxEngine, slot, snap: Snapshot) -> bool:
        """Replace the engine's cache by ``snap`` (a disk snapshot is read and checked first; a bad one is
        deleted) → whether the engine now holds it."""
        t0 = time.perf_counter()
        data = self.payload(snap)
        if data is None:
            return False
        try:
            cache = cache_from_payload(engine, data, len(snap.tokens))
        except SnapshotFileError as e:
            log.warning("kv cache: a %d-token snapshot does not fit this model (%s); deleted", len(snap.tokens), e)
            self._drop(snap)
            self.stats.misses += 1
            return False
        engine.set_prompt_cache(cache, snap.tokens)
        self.restored(snap, data, t0, " (mlx)")
        return True


def attach_mlx_kv_cache(engine: MlxEngine, *, ram_bytes: int | None, disk_dir: str | os.PathLike | None = None,
                        disk_bytes: int = 0) -> MlxKVCache:
    """Give an MLX ``engine`` KV tiers (``kv_cache.attach_kv_cache``'s keywords; ``ram_bytes`` None: the
    default share of the RAM available now, ``offload.kv_tiers.default_cache_ram_bytes``), its disk files in
    ``disk_dir/<model id>``. Sets and returns ``engine.kv_cache``."""
    if ram_bytes is None:
        import psutil

        from localrun.offload.kv_tiers import default_cache_ram_bytes

        ram_bytes = default_cache_ram_bytes(psutil.virtual_memory().available)
    mid = mlx_identity(engine)
    folder = Path(disk_dir) / mid if disk_dir is not None else None
    cache = MlxKVCache(mid, mlx_settings(engine), ram_bytes=ram_bytes, disk_dir=folder, disk_bytes=disk_bytes)
    engine.kv_cache = cache
    return cache


def save_mlx_file(engine: MlxEngine, path: str | os.PathLike) -> int:
    """Write the engine's KV cache to ``path`` as a snapshot file (chat ``/save``: ``FILE.kv``) → bytes
    written; 0 when the cache is empty. Raises OSError."""
    tokens = tuple(engine.cached_tokens)
    if not tokens or not engine.prompt_cache:
        return 0
    return write_snapshot_file(Path(path), mlx_identity(engine), mlx_settings(engine), tokens,
                               cache_payload(engine.prompt_cache))


def load_mlx_file(engine: MlxEngine, path: str | os.PathLike) -> int:
    """Restore a file of ``save_mlx_file`` into the engine (its cache replaced) → tokens restored. Raises
    SnapshotFileError (another model or settings, corrupt, truncated, not a cache of this model), OSError."""
    tokens, buf = read_snapshot_file(Path(path), mlx_identity(engine), mlx_settings(engine))
    engine.set_prompt_cache(cache_from_payload(engine, buf, len(tokens)), tokens)
    return len(tokens)
