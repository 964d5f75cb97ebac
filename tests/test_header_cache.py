"""The GGUF header cache on disk (localrun/model/header_cache.py): the cached spec equals a fresh parse, a
rewritten file is parsed again, and a damaged or foreign entry is ignored, never trusted."""

from __future__ import annotations

import os
import shutil

from localrun.model import gguf_info, header_cache


def _fresh(path):
    st = os.stat(path)
    return gguf_info._read_cached.__wrapped__(str(path), st.st_size, st.st_mtime_ns)


def _entries(home):
    d = home / "cache" / "gguf-headers"
    return sorted(d.glob("*.json")) if d.is_dir() else []


def test_cached_spec_equals_the_parse(smollm_path, isolated_home):
    parsed = gguf_info._read(smollm_path, os.stat(smollm_path).st_size)
    first = _fresh(smollm_path)  # parses and writes the entry
    assert len(_entries(isolated_home)) == 1
    second = _fresh(smollm_path)  # from the entry
    assert first == parsed and second == parsed
    assert second.tensor_groups == parsed.tensor_groups
    assert isinstance(second.tensors[0].shape, tuple)
    # the vocabulary is still read on demand through the skipped array's offset
    assert second.token_text(0) == parsed.token_text(0) and second.token_text(0)


def test_rewritten_file_is_parsed_again(smollm_path, tmp_path, isolated_home):
    copy = tmp_path / "m.gguf"
    shutil.copyfile(smollm_path, copy)
    a = _fresh(copy)
    with open(copy, "ab") as f:  # another size (a resumed download): the entry no longer matches
        f.write(b"\0" * 64)
    b = _fresh(copy)
    assert b.file_bytes == a.file_bytes + 64
    assert header_cache.load(str(copy), a.file_bytes, os.stat(copy).st_mtime_ns) is None


def test_damaged_or_foreign_entry_is_ignored(smollm_path, gemma_path, isolated_home):
    good = _fresh(smollm_path)
    (entry,) = _entries(isolated_home)
    st = os.stat(smollm_path)
    entry.write_text(entry.read_text()[:-40])  # truncated JSON
    assert header_cache.load(str(smollm_path), st.st_size, st.st_mtime_ns) is None
    assert _fresh(smollm_path) == good  # parsed again and rewritten
    # another file's entry under this file's name: its key (path, size, mtime) does not match
    gemma = _fresh(gemma_path)
    (g_entry,) = [e for e in _entries(isolated_home) if e != entry]
    shutil.copyfile(g_entry, entry)
    assert header_cache.load(str(smollm_path), st.st_size, st.st_mtime_ns) is None
    assert _fresh(smollm_path) == good and gemma.arch != good.arch
