"""Split GGUFs (``NAME-00001-of-00003.gguf`` …, written by llama.cpp's ``gguf-split`` or gguf-py's
``GGUFWriter(split_max_tensors=…)``) read as ONE model: ``join_shards`` turns the first shard's header and the
others' into one ``ModelSpec`` whose tensor table, parameter count and sizes are the shards' sums.

The rules are llama.cpp's (src/llama-model-loader.cpp, ``llama_model_loader``; names from src/llama.cpp
``llama_split_path`` / ``llama_split_prefix``): a split model is opened from its first shard (``split.no`` 0);
``split.count`` shards named ``{prefix}-{i:05d}-of-{count:05d}.gguf`` (i from 1) lie beside it; shard i holds
``split.no`` = i - 1; the tensors of all shards together number ``split.tensors.count`` and no name repeats.
Where llama.cpp would fail at load time, this fails while reading headers, naming the shard: a
``ModelFormatError`` (exit 3) before any load, in every command that reads the model (fit, inspect, ls,
show, chat, serve).

The joined spec's tensors keep their order (shard by shard); each ``offset`` is counted from the first
shard's data section through the shards' files laid end to end, so ``spec.data_offset + t.offset`` is the
tensor's byte position in that concatenation. ``spec.shards`` holds each shard's own spec, which is what
``SplitModelSpec.truncated`` / ``check_complete`` judge (a shard cut short names itself).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from localrun.errors import ModelFormatError, TruncatedModelError
from localrun.model.spec import ModelSpec

SPLIT_COUNT = "split.count"  # gguf-py constants.py Keys.Split; llama-arch.cpp LLM_KV_SPLIT_*
SPLIT_NO = "split.no"
SPLIT_TENSORS_COUNT = "split.tensors.count"
_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass
class SplitModelSpec(ModelSpec):
    """A split model as one ``ModelSpec`` (module docstring): ``path`` is its first shard (what llama.cpp
    opens), ``file_bytes`` and the tensor table the shards' sums; ``shards`` each shard's own spec, in order.
    Completeness is judged shard by shard, so a shard cut short is named."""

    shards: list[ModelSpec] = field(default_factory=list, repr=False, compare=False)

    @property
    def expected_file_bytes(self) -> int:
        """The shards' sizes as their tensor tables imply them, summed (bytes)."""
        return sum(s.expected_file_bytes for s in self.shards)

    @property
    def truncated(self) -> bool:
        return any(s.truncated for s in self.shards)

    def check_complete(self) -> None:
        """Raise ``TruncatedModelError`` naming the first shard whose tensor data is cut short."""
        for s in self.shards:
            if s.truncated:
                raise TruncatedModelError(s.path, s.file_bytes, s.expected_file_bytes)


def split_count(spec: ModelSpec) -> int:
    """How many files the model is split into (``split.count``); 1 for an ordinary GGUF."""
    try:
        return max(1, int(spec.metadata.get(SPLIT_COUNT) or 1))
    except (TypeError, ValueError):
        return 1


def shard_paths(first: str | Path, count: int) -> list[Path]:
    """The ``count`` shard paths of the split model whose first shard is ``first`` (llama.cpp's
    ``llama_split_prefix`` then ``llama_split_path``: ``{prefix}-{i:05d}-of-{count:05d}.gguf``). Raises
    ModelFormatError when ``first`` is not named as shard 1 of ``count``."""
    p = Path(first)
    suffix = f"-00001-of-{count:05d}.gguf"
    if not p.name.endswith(suffix) or len(p.name) <= len(suffix):
        raise ModelFormatError(str(p), f"its header says it is shard 1 of a model split in {count} files, but its "
                               f"name does not end in {suffix}, so its other shards cannot be found",
                               hint=f"give it its gguf-split name (NAME{suffix}), with the other shards beside it")
    prefix = p.name[: -len(suffix)]
    return [p.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def join_shards(first: ModelSpec, read: Callable[[str], ModelSpec]) -> ModelSpec:
    """``first`` (the header of shard 1 of a split model) + its other shards, read with ``read(path)`` → one
    ModelSpec for the whole model (module docstring). ``first`` is returned as is when it is not split.

    Raises:
        ModelFormatError: ``first`` is not shard 1 (naming shard 1's file when its name allows), a shard is
            missing or unreadable, a shard's ``split.no`` / ``split.count`` disagree with its place, the
            tensors of all shards are not ``split.tensors.count``, or a tensor name repeats.
    """
    count = split_count(first)
    if count == 1:
        return first
    no = int(first.metadata.get(SPLIT_NO, 0) or 0)
    if no != 0:
        m = _NAME.match(Path(first.path).name)
        named = (Path(first.path).with_name(f"{m['prefix']}-00001-of-{int(m['count']):05d}.gguf")
                 if m else None)
        raise ModelFormatError(first.path, f"shard {no + 1} of {count} of a split model; a split model is opened "
                               "from its first shard",
                               hint=f"give {named}" if named else "give the shard named NAME-00001-of-…gguf")
    paths = shard_paths(first.path, count)
    shards = [first]
    for i, p in enumerate(paths[1:], start=1):
        if not p.is_file():
            raise ModelFormatError(str(p), f"shard {i + 1} of {count} of {Path(first.path).name} is missing",
                                   hint="a split model needs all its shards side by side: download the missing "
                                   "one (`localrun pull` fetches every part) and run this again")
        s = read(str(p))
        got_no, got_count = s.metadata.get(SPLIT_NO), s.metadata.get(SPLIT_COUNT)
        if got_no != i or got_count != count:
            raise ModelFormatError(str(p), f"expected shard {i + 1} of {count} of {Path(first.path).name}, its "
                                   f"header says split.no={got_no}, split.count={got_count}",
                                   hint="the shards come from different models or downloads: download this "
                                   "shard again beside the others")
        shards.append(s)
    return _joined(first, shards)


def _joined(first: ModelSpec, shards: list[ModelSpec]) -> ModelSpec:
    tensors, seen, base = [], set(), 0  # base: the shard's file start in the concatenation
    for s in shards:
        shift = base + s.data_offset - first.data_offset
        for t in s.tensors:
            if t.name in seen:
                raise ModelFormatError(s.path, f"tensor {t.name} is also in an earlier shard",
                                       hint="the shards come from different models: download them again")
            seen.add(t.name)
            tensors.append(replace(t, offset=t.offset + shift))
        base += s.file_bytes
    want = first.metadata.get(SPLIT_TENSORS_COUNT)
    if want is not None and int(want) != len(tensors):
        raise ModelFormatError(first.path, f"its shards hold {len(tensors)} tensors, the header says {int(want)}",
                               hint="a shard is from another model or download: download the shards again")
    return SplitModelSpec(first.path, sum(s.file_bytes for s in shards), first.gguf_version, first.arch,
                          first.name, first.metadata, tensors, first.data_offset, first.array_lengths,
                          first.array_offsets, string_reader=first.string_reader, shards=shards)


def shard_files(path: str | Path) -> list[Path]:
    """The shard files that exist for a model given by ``path``: every ``-0000i-of-0000N`` sibling when ``path``
    is named as a split's first shard (from its name alone, no header read), else ``[path]``."""
    p = Path(path)
    m = _NAME.match(p.name)
    if not m or int(m["no"]) != 1:
        return [p]
    count = int(m["count"])
    return [q for q in (p.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))
            if q.exists()]
