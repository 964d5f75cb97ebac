"""Prompt-cache tiers on the MLX backend (issue 17, item 1), through mlx[cpu] on SmolLM2: a snapshot of the
engine's mlx-lm prompt cache in the RAM and disk tiers (``backends/mlx/cache.py`` on ``kv_cache.KVCache``),
the chat ``/save`` file, and bad files. Every test compares a restored run with a cold one on the same
engine (token ids), so nothing depends on the CPU's rounding."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from localrun.backends.base import Message, SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=6)  # a restored cache that is wrong diverges at once
FILL = SamplingParams(temperature=0, max_tokens=1)  # a run that only fills the engine's cache (its output unused)
STORY = ("The river flows through the old town, past the market square where farmers sell apples, bread and "
         "cheese every Saturday morning. Children run between the stalls while their parents talk about the "
         "weather, the harvest and the price of milk. In the afternoon the square is quiet again.")


@pytest.fixture(scope="module")
def eng(smollm_path, tmp_path_factory):
    from helpers import mlx_smollm_engine

    yield from mlx_smollm_engine(smollm_path, tmp_path_factory)


def _chat(eng, *turns: str) -> list[int]:
    msgs = [Message("system", "You are a helpful assistant. " + STORY)]
    for i, t in enumerate(turns):
        msgs.append(Message("user" if i % 2 == 0 else "assistant", t))
    return eng.tokenize_chat(msgs)[1]


def _gen(eng, prompt, params=GREEDY):
    chunks = list(eng.generate(prompt, params))
    return [c.token_id for c in chunks], chunks[-1].stats


_COLD: dict[tuple[int, ...], list[int]] = {}


def _cold(eng, prompt):
    """Greedy ids of ``prompt`` from an empty cache (computed once per prompt: the engine is the module's)."""
    key = tuple(prompt)
    if key not in _COLD:
        eng.reset_cache()
        _COLD[key] = _gen(eng, prompt)[0]
    return _COLD[key]


def test_ram_tier_restores_a_prefix_with_cold_output(eng):
    from localrun.backends.mlx.cache import attach_mlx_kv_cache

    first = _chat(eng, "What do farmers sell?")
    other = _chat(eng, "Who runs between the stalls?")  # shares the system prompt only
    follow = _chat(eng, "What do farmers sell?", "Apples, bread and cheese.", "And when?")
    cold_follow = _cold(eng, follow)
    cache = attach_mlx_kv_cache(eng, ram_bytes=1 << 30)
    try:
        eng.reset_cache()
        _gen(eng, first, FILL)
        _gen(eng, other, FILL)  # cuts the first conversation off the engine's cache: it is saved first
        assert cache.stats.saves >= 1 and cache.ram_used_bytes > 0
        ids, st = _gen(eng, follow)  # restores the first conversation, prefills only the rest
        assert cache.stats.hits_ram == 1
        assert st.cached_tokens >= len(first) - 1
        assert ids == cold_follow
    finally:
        eng.kv_cache = None


@pytest.fixture(scope="module")
def persisted(eng, tmp_path_factory):
    """The disk tier after the first conversation ran and the tiers were persisted (what close() does),
    written once for the module: (the tiers' disk folder, the cache's disk_used_bytes then). Tests copy it."""
    from localrun.backends.mlx.cache import attach_mlx_kv_cache

    folder = tmp_path_factory.mktemp("mlx_kv_disk")
    cache = attach_mlx_kv_cache(eng, ram_bytes=1 << 30, disk_dir=folder, disk_bytes=1 << 30)
    try:
        eng.reset_cache()
        _gen(eng, _chat(eng, "What do farmers sell?"), FILL)
        cache.persist(eng)
    finally:
        eng.kv_cache = None
    return folder, cache.disk_used_bytes


def _copy_disk_tier(persisted, to) -> None:
    import shutil

    shutil.copytree(persisted[0], to, dirs_exist_ok=True)


def test_disk_tier_survives_a_new_engine(eng, persisted, smollm_path, tmp_path, tmp_path_factory):
    from helpers import mlx_smollm_engine

    from localrun.backends.mlx.cache import attach_mlx_kv_cache

    prompt = _chat(eng, "What do farmers sell?")
    follow = _chat(eng, "What do farmers sell?", "Apples.", "Anything else?")
    cold = _cold(eng, follow)
    _copy_disk_tier(persisted, tmp_path)
    files = list(tmp_path.rglob("*.kvs"))
    assert len(files) == 1
    size = files[0].stat().st_size
    assert persisted[1] == size <= 1 << 30

    gen = mlx_smollm_engine(smollm_path, tmp_path_factory)
    fresh = next(gen)
    try:
        c2 = attach_mlx_kv_cache(fresh, ram_bytes=1 << 30, disk_dir=tmp_path, disk_bytes=1 << 30)
        assert len(c2.snapshots) == 1
        ids, st = _gen(fresh, follow)
        assert c2.stats.hits_disk == 1 and st.cached_tokens >= len(prompt) - 1
        assert ids == cold
    finally:
        fresh.kv_cache = None
        next(gen, None)


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_bad_disk_file_is_ignored_and_deleted(eng, persisted, tmp_path, damage):
    from localrun.backends.mlx.cache import attach_mlx_kv_cache, mlx_settings

    follow = _chat(eng, "What do farmers sell?", "Apples.", "Anything else?")
    _copy_disk_tier(persisted, tmp_path)  # the first conversation's file, as test_disk_tier_survives_... reads it
    [path] = list(tmp_path.rglob("*.kvs"))
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-100] ^= 0xFF
        path.write_bytes(bytes(raw))
    elif damage == "truncate":
        path.write_bytes(bytes(raw[: len(raw) // 2]))
    else:  # the same file under another model's folder: its header names this model, the folder another
        other = tmp_path / "0123456789abcdef"
        other.mkdir()
        path.rename(other / path.name)
        path = other / path.name
    try:
        if damage == "foreign":
            from localrun.backends.mlx.cache import MlxKVCache

            c2 = MlxKVCache("0123456789abcdef", mlx_settings(eng), ram_bytes=1 << 30, disk_dir=path.parent,
                            disk_bytes=1 << 30)
            assert c2.stats.corrupt_files == 1 and not path.exists() and not c2.snapshots
            return
        cold = _cold(eng, follow)
        c2 = attach_mlx_kv_cache(eng, ram_bytes=1 << 30, disk_dir=tmp_path, disk_bytes=1 << 30)
        eng.reset_cache()
        ids, st = _gen(eng, follow)
        assert ids == cold  # never wrong output
        assert c2.stats.corrupt_files == 1 and c2.stats.hits_disk == 0
        assert not path.exists()
    finally:
        eng.kv_cache = None


def test_chat_file_round_trip_and_foreign_file(eng, tmp_path):
    """/save FILE writes FILE.kv; /load restores it into a cleared engine: the next turn prefills only
    itself and writes the cold text. A file of other settings is refused."""
    from localrun.backends.kv_cache import SnapshotFileError, read_snapshot_header, write_snapshot_file
    from localrun.backends.mlx.cache import load_mlx_file, mlx_identity, mlx_settings, save_mlx_file

    convo = _chat(eng, "What do farmers sell?")
    eng.reset_cache()
    _gen(eng, convo, FILL)
    path = tmp_path / "chat.json.kv"
    assert save_mlx_file(eng, path) > 0
    held = eng.cached_tokens
    follow = held + eng.tokenize("\nMore?", add_special=False)
    cold = _cold(eng, follow)
    assert load_mlx_file(eng, path) == len(held)
    warm, st = _gen(eng, follow)
    assert st.cached_tokens == len(held) and warm == cold

    hdr, off = read_snapshot_header(path, mlx_identity(eng), mlx_settings(eng))
    import ctypes

    payload = (ctypes.c_uint8 * (path.stat().st_size - off)).from_buffer_copy(path.read_bytes()[off:])
    other = tmp_path / "other.kv"
    write_snapshot_file(other, mlx_identity(eng), {**mlx_settings(eng), "cpu_dequantized": "other"},
                        hdr["tokens"], payload)
    with pytest.raises(SnapshotFileError, match="another model"):
        load_mlx_file(eng, other)
    # a payload that claims more tokens than its cache holds: refused before it reaches the engine
    bad = tmp_path / "bad.kv"
    write_snapshot_file(bad, mlx_identity(eng), mlx_settings(eng), list(hdr["tokens"]) + [1], payload)
    with pytest.raises(SnapshotFileError, match="offsets"):
        load_mlx_file(eng, bad)


def test_chat_session_save_load_resumes_without_prefill(eng, tmp_path):
    """``ChatSession.save`` writes FILE.kv on MLX too; a new session on a cleared engine loads it and the
    next turn evaluates only itself (what /save, /load and --resume do)."""
    from localrun.chat.session import ChatSession

    params = SamplingParams(temperature=0, max_tokens=4)  # the turns' prefill is what this checks
    eng.reset_cache()
    first = ChatSession(eng, params, system="You are a helpful assistant. " + STORY)
    list(first.send("What do farmers sell?"))
    saved = first.save(tmp_path / "chat.json")
    assert saved.with_name("chat.json.kv").is_file()
    eng.reset_cache()  # as a new process would start
    second = ChatSession(eng, params, system=first.system)
    assert second.load(saved) == 2
    assert second.kv_restored_tokens > 0 and not second.notices
    list(second.send("And when?"))
    st = second.last_stats
    assert st.cached_tokens == second.kv_restored_tokens
    assert 0 < st.prompt_tokens - st.cached_tokens <= 16  # the new turn only
