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
