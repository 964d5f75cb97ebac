"""The KV snapshot file (docs/architecture.md §4): what ``kv_cache.KVCache``'s disk tier and ``localrun chat``'s
``FILE.kv`` hold, and the identity of the model and KV settings a snapshot belongs to.

A file is ``MAGIC``, a little-endian u64 header length, a JSON header (model id, settings, the tokens and
their SHA-256, payload length and SHA-256), then the payload (``llama_state_seq_get_data``'s bytes, or any
backend's). A snapshot of a model with recurrent layers may carry context checkpoints
(``llamacpp/checkpoints.py``): the header's ``checkpoints`` lists ``[n_tokens, bytes]`` of each, and their
bytes follow the state in the payload, in that order (the payload's length and SHA-256 cover them all).
It is written atomically (a temporary name in the same folder, then ``os.replace``); a reader checks the
model, the settings, the length and both checksums before anything reaches the backend.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Sequence

MAGIC = b"LRKV0001"
SUFFIX = ".kvs"


def model_identity(path: str | os.PathLike) -> str:
    """A cheap identity of a model file: SHA-256 over its size, first 4 MiB and last 1 MiB (header,
    metadata and the end of the tensor data), 16 hex digits. Hashing a whole multi-GB file would take
    seconds at every load."""
    p = Path(path)
    size = p.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(p, "rb") as f:
        h.update(f.read(4 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def engine_settings(engine) -> dict:
    """The KV settings a snapshot depends on: context per sequence (tokens), KV type, SWA mode, flash
    attention (V stored transposed without it), and the llama.cpp build."""
    plan = engine.plan
    return {"n_ctx": int(engine.n_ctx), "kv_type": str(plan.kv_type).lower(), "swa_full": bool(plan.swa_full),
            "flash_attn": plan.flash_attn, "llama_cpp": str(getattr(engine.llama_cpp, "__version__", "?"))}


def tokens_sha256(tokens: Sequence[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()


class SnapshotFileError(Exception):
    """A snapshot file that must not be restored; ``str()`` says why (truncated, corrupt, another model)."""


def write_snapshot_file(path: Path, model_id: str, settings: dict, tokens: Sequence[int], data,
                        checkpoints: Sequence = ()) -> int:
    """Write a snapshot file atomically (a temporary name in the same folder, then ``os.replace``): ``MAGIC``,
    a u64 header length, the JSON header, the payload ``data`` (any buffer: a ctypes uint8 array, bytes, a
    NumPy array), then each of ``checkpoints``' ``data`` (objects with ``n_tokens``, ``nbytes``, ``data``,
    listed in the header). → bytes written. Raises OSError (the temporary file is removed)."""
    parts = [memoryview(data).cast("B")] + [memoryview(c.data).cast("B") for c in checkpoints]
    nbytes = sum(part.nbytes for part in parts)
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    fields = {"model": model_id, "settings": settings, "n_tokens": len(tokens), "tokens_sha256": tokens_sha256(tokens),
              "tokens": list(tokens), "payload_bytes": nbytes, "payload_sha256": digest.hexdigest()}
    if checkpoints:
        fields["checkpoints"] = [[int(c.n_tokens), int(c.nbytes)] for c in checkpoints]
    header = json.dumps(fields).encode()
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(header)) + header)
            for part in parts:
                f.write(part)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return len(MAGIC) + 8 + len(header) + nbytes


def snapshot_file_size(tokens: Sequence[int], nbytes: int, model_id: str, settings: dict,
                       n_checkpoints: int = 0) -> int:
    """An upper bound of the file ``write_snapshot_file`` writes (the header's JSON, estimated); ``nbytes``:
    the whole payload, checkpoints included."""
    return (len(MAGIC) + 8 + 400 + len(json.dumps(settings)) + len(model_id) + 12 * len(tokens) + 40 * n_checkpoints
            + nbytes)


def read_snapshot_header(path: Path, model_id: str, settings: dict) -> tuple[dict, int]:
    """(header, payload offset) of a snapshot file of this model and settings. Raises SnapshotFileError
    (not a snapshot, another model or settings, truncated, corrupt header), OSError."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + 8)
        if len(head) < len(MAGIC) + 8 or head[: len(MAGIC)] != MAGIC:
            raise SnapshotFileError("not a localrun KV snapshot")
        (n,) = struct.unpack("<Q", head[len(MAGIC):])
        try:
            hdr = json.loads(f.read(n).decode()) if n < size else None
        except (ValueError, UnicodeDecodeError) as e:
            raise SnapshotFileError(f"corrupt header ({e})") from None
    if not isinstance(hdr, dict):
        raise SnapshotFileError("truncated header")
    if hdr.get("model") != model_id or hdr.get("settings") != settings:
        raise SnapshotFileError(f"from another model or KV settings ({hdr.get('model')}, {hdr.get('settings')}; "
                                f"this is {model_id}, {settings})")
    if tokens_sha256(hdr.get("tokens", [])) != hdr.get("tokens_sha256"):
        raise SnapshotFileError("corrupt header (token checksum)")
    want = len(MAGIC) + 8 + n + int(hdr.get("payload_bytes", -1))
    if size != want:
        raise SnapshotFileError(f"truncated ({size} bytes, the header says {want})")
    return hdr, len(MAGIC) + 8 + n


def read_snapshot_file(path: Path, model_id: str, settings: dict):
    """(tokens, payload as a ctypes uint8 array) of a checked snapshot file. Raises SnapshotFileError (see
    ``read_snapshot_header``; the payload's SHA-256 differs), OSError."""
    hdr, offset = read_snapshot_header(path, model_id, settings)
    buf = (ctypes.c_uint8 * int(hdr["payload_bytes"]))()
    with open(path, "rb") as f:
        f.seek(offset)
        if f.readinto(buf) != ctypes.sizeof(buf):
            raise SnapshotFileError("truncated payload")
    if hashlib.sha256(memoryview(buf)).hexdigest() != hdr["payload_sha256"]:
        raise SnapshotFileError("content checksum mismatch")
    return tuple(int(t) for t in hdr["tokens"]), buf
