"""KV-tier snapshot files without a model (fast tier): round trip, and every kind of bad file refused."""

from __future__ import annotations

import ctypes
import logging

import pytest

from localrun.backends.kv_cache import (
    SUFFIX,
    KVCache,
    SnapshotFileError,
    read_snapshot_file,
    write_snapshot_file,
)

SETTINGS = {"n_ctx": 1024, "kv_type": "f16", "swa_full": False, "flash_attn": None, "llama_cpp": "x"}


def _payload(n=5000):
    return (ctypes.c_uint8 * n)(*[i % 251 for i in range(n)])


def _write(folder, model="m1", tokens=tuple(range(40)), settings=SETTINGS):
    path = folder / ("snap" + SUFFIX)
    write_snapshot_file(path, model, settings, tokens, _payload())
    return path


def test_round_trip(tmp_path):
    path = _write(tmp_path)
    tokens, buf = read_snapshot_file(path, "m1", SETTINGS)
    assert tokens == tuple(range(40)) and bytes(buf) == bytes(_payload())
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("damage, why", [
    (lambda b: b[:-10], "truncated"),
    (lambda b: b[:-100] + bytes([b[-100] ^ 1]) + b[-99:], "checksum"),
    (lambda b: b[:20], "truncated header"),
    (lambda b: b"GGUF" + b[4:], "not a localrun KV snapshot"),
])
def test_damaged_files_are_refused(tmp_path, damage, why):
    path = _write(tmp_path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(SnapshotFileError, match=why):
        read_snapshot_file(path, "m1", SETTINGS)


def test_another_model_or_settings_is_refused(tmp_path):
    path = _write(tmp_path, model="m2")
    with pytest.raises(SnapshotFileError, match="another model"):
        read_snapshot_file(path, "m1", SETTINGS)
    path = _write(tmp_path, settings=dict(SETTINGS, kv_type="q8_0"))
    with pytest.raises(SnapshotFileError, match="another model or KV settings"):
        read_snapshot_file(path, "m1", SETTINGS)


def test_the_index_drops_bad_files_and_leftover_temporaries(tmp_path, caplog):
    good = tmp_path / ("good" + SUFFIX)
    write_snapshot_file(good, "m1", SETTINGS, tuple(range(50)), _payload())
    foreign = _write(tmp_path, model="m2")
    (tmp_path / ".x.kvs.123.tmp").write_bytes(b"half")
    with caplog.at_level(logging.WARNING, logger="localrun.kv_cache"):
        cache = KVCache("m1", SETTINGS, ram_bytes=1 << 20, disk_dir=tmp_path, disk_bytes=1 << 20)
    assert list(cache.snapshots) == [tuple(range(50))] and cache.stats.corrupt_files == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name] and not foreign.exists()
    assert any("another model" in r.getMessage() for r in caplog.records)


def test_serve_flags():
    from localrun.commands.serve import parse_kv_tiers
    from localrun.errors import LocalrunError

    assert parse_kv_tiers("0", None, "8GiB") is None
    assert parse_kv_tiers("1GiB", "/tmp/x", "2GiB") == {"ram_bytes": 1 << 30, "disk_dir": "/tmp/x",
                                                        "disk_bytes": 2 << 30}
    assert parse_kv_tiers("512MiB", None, "2GiB")["disk_bytes"] == 0
    with pytest.raises(LocalrunError, match="--cache-ram"):
        parse_kv_tiers("lots", None, "1GiB")


def test_boundaries_are_noted_found_and_skipped_once_held():
    from localrun.backends.kv_cache import MAX_BOUNDARIES, Snapshot, tokens_sha256

    cache = KVCache("m1", SETTINGS, ram_bytes=1 << 20)
    system = list(range(100, 160))  # 60 tokens
    cache.note_boundary(system[:10])  # shorter than min_tokens: not worth a snapshot
    cache.note_boundary(system)
    assert list(cache.boundaries.values()) == [60]
    prompt = system + [7, 8, 9]
    assert cache.boundary_in(prompt, 0, sliding=True) == 60
    assert cache.boundary_in(prompt, 60, sliding=True) == 0  # already cached up to there
    assert cache.boundary_in(system, 0, sliding=True) == 0  # nothing after it: the turn's end covers it
    assert cache.boundary_in([1] + prompt, 0, sliding=True) == 0  # another prefix
    cache.snapshots[tuple(prompt)] = Snapshot(tuple(prompt), 10)  # a longer snapshot covers it ...
    assert cache.boundary_in(prompt + [5], 0, sliding=False) == 0
    assert cache.boundary_in(prompt + [5], 0, sliding=True) == 60  # ... except on a sliding window
    cache.snapshots[tuple(system)] = Snapshot(tuple(system), 10)
    assert cache.boundary_in(prompt + [5], 0, sliding=True) == 0
    for i in range(MAX_BOUNDARIES + 5):
        cache.note_boundary([i] * 40)
    assert len(cache.boundaries) == MAX_BOUNDARIES and tokens_sha256([0] * 40) not in cache.boundaries
    assert tokens_sha256([MAX_BOUNDARIES + 4] * 40) in cache.boundaries  # the oldest go first


def test_system_prompt_end_is_where_user_turns_part():
    from localrun.backends.base import Message
    from localrun.backends.kv_cache import system_prompt_end
    from localrun.errors import ChatTemplateError

    def render(msgs):  # a toy template: [1] + each message as [role id, its words' lengths..., 2]
        out = [1]
        for m in msgs:
            out += [{"system": 3, "user": 4}[m.role], *[len(w) for w in m.content.split()], 2]
        return out

    cache = KVCache("m1", SETTINGS, ram_bytes=1 << 20)
    system = Message("system", " ".join(["word"] * 50))
    msgs = [system, Message("user", "which question")]
    prompt = render(msgs)
    assert system_prompt_end(cache, msgs, prompt, render) == 54  # [1, 3, 50 words, 2, 4]: the user header too
    assert list(cache.boundaries.values()) == [54]
    assert system_prompt_end(cache, msgs[1:], render(msgs[1:]), render) == 0  # no system message
    assert system_prompt_end(cache, msgs[:1], render(msgs[:1]), render) == 0  # nothing after it

    def refuse(msgs):
        raise ChatTemplateError("this template wants a user turn first")

    assert system_prompt_end(cache, msgs, prompt, refuse) == 0

    def with_tools(msgs):  # a template that writes 40 tools' words into a system turn of its own
        return [1, 3, *[5] * 40, 2] + render(msgs)[1:]

    asked = [Message("user", "which question")]
    assert system_prompt_end(cache, asked, with_tools(asked), with_tools) == 0  # not told that tools are there
    assert system_prompt_end(cache, asked, with_tools(asked), with_tools, tools=True) == 44  # [1, 3, 40, 2, 4]
