"""A GGUF header cache on disk: the ``ModelSpec`` that ``read_gguf`` parsed, kept as JSON under
``<LOCALRUN_HOME>/cache/gguf-headers/`` and keyed by the file's absolute path, size (bytes) and mtime (ns).

Why: the header of a model with a large vocabulary is mostly its token and merge strings, which the planner
does not need but the parser must walk to find the tensor table (~50 ms of CPU for SmolLM2's 98k strings,
~0.3 s for Gemma-3's 262k-token vocabulary). ``localrun serve`` pays that on the request path of every cold
start (request → first token); with this cache it is paid once per file, usually already by ``ls``, ``pull``
or ``fit``. A file rewritten in place (a resumed download) has another size or mtime and is parsed again.

The cache is only an optimization: an unreadable, corrupt or foreign entry is ignored (and replaced), and a
read-only home just means no cache. Entries are written atomically (a temporary file, then ``os.replace``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from localrun.model.spec import ModelSpec, TensorInfo

FORMAT = 1  # bump when ModelSpec's stored fields change


def _entry(path: str, file_bytes: int, mtime_ns: int) -> tuple[Path, dict]:
    from localrun.config import get_settings

    key = {"format": FORMAT, "path": os.path.abspath(path), "size": file_bytes, "mtime_ns": mtime_ns}
    name = hashlib.sha256(key["path"].encode()).hexdigest()[:24] + ".json"
    return get_settings().home / "cache" / "gguf-headers" / name, key


def load(path: str, file_bytes: int, mtime_ns: int) -> ModelSpec | None:
    """The cached spec of ``path`` when its entry matches the file's size and mtime, else None."""
    try:
        entry, key = _entry(path, file_bytes, mtime_ns)
        d = json.loads(entry.read_text())
        if d.get("key") != key:
            return None
        s = d["spec"]
        tensors = [TensorInfo(t[0], tuple(t[1]), t[2], t[3], t[4], t[5]) for t in s["tensors"]]
        return ModelSpec(path, file_bytes, s["gguf_version"], s["arch"], s["name"], s["metadata"], tensors,
                         s["data_offset"], s["array_lengths"], s["array_offsets"])
    except (OSError, ValueError, KeyError, TypeError, IndexError):  # missing, corrupt or foreign: parse again
        return None


def store(spec: ModelSpec, mtime_ns: int) -> None:
    """Write ``spec`` as the entry of its file (atomically). Never raises: a cache that cannot be written is
    no cache."""
    try:
        entry, key = _entry(spec.path, spec.file_bytes, mtime_ns)
        d = {"key": key, "spec": {
            "gguf_version": spec.gguf_version, "arch": spec.arch, "name": spec.name, "metadata": spec.metadata,
            "tensors": [[t.name, list(t.shape), t.ggml_type, t.type_name, t.offset, t.n_bytes] for t in spec.tensors],
            "data_offset": spec.data_offset, "array_lengths": spec.array_lengths,
            "array_offsets": spec.array_offsets}}
        text = json.dumps(d)
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".partial-", dir=entry.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, entry)
        except BaseException:
            os.unlink(tmp)
            raise
    except (OSError, TypeError, ValueError):  # read-only home, or metadata JSON cannot hold: no cache
        pass
