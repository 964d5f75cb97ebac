"""A split GGUF (``NAME-00001-of-0000N.gguf``) is one model: its size, tensor table and parameter count are its
shards' sums in every command that reads it, it loads from its first shard and generates what the single file
generates, and a missing, foreign or cut-short shard is an error naming that shard (exit 3) before any load.

The shards are written from SmolLM2's GGUF with gguf-py's own splitter (``GGUFWriter(split_max_tensors=…,
small_first_shard=True)``, what ``convert_hf_to_gguf.py --split-max-tensors`` uses): the first shard holds
the metadata only, as gguf-split's ``--no-tensor-first-split`` writes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import ServerThread, localrun_inprocess

from localrun.model.gguf_info import read_gguf

SHARD_TENSORS = 140  # SmolLM2's 273 tensors → a metadata-only shard + 2 shards of tensors


def write_split(src: Path, out_dir: Path, *, max_tensors: int = SHARD_TENSORS) -> list[Path]:
    """``src`` rewritten as a split model in ``out_dir`` by gguf-py's writer (metadata and tensor bytes copied
    as they are, as gguf-py's scripts/gguf_new_metadata.py copies them) → the shard paths, first first."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    stem = src.name.removesuffix(".gguf")
    writer = gguf.GGUFWriter(str(out_dir / f"{stem}.gguf"), arch, split_max_tensors=max_tensors,
                             small_first_shard=True)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(out_dir.glob(f"{stem}-*-of-*.gguf"))


@pytest.fixture(scope="module")
def split(smollm_path, tmp_path_factory) -> list[Path]:
    return write_split(smollm_path, tmp_path_factory.mktemp("split"))


def _variant(split: list[Path], tmp_path: Path, change) -> list[Path]:
    """A copy of the split model in ``tmp_path`` with ``change(paths)`` applied to its shards."""
    paths = [Path(shutil.copy(p, tmp_path / p.name)) for p in split]
    change(paths)
    return paths


def test_the_writer_made_a_split_model(split):
    assert [p.name[-20:] for p in split] == ["-00001-of-00003.gguf", "-00002-of-00003.gguf", "-00003-of-00003.gguf"]
    from localrun.model.gguf_info import read_shard

    assert read_shard(str(split[0])).tensors == []  # the first shard is the metadata alone


def test_a_split_model_is_the_sum_of_its_shards(smollm_path, split):
    whole, parts = read_gguf(smollm_path), read_gguf(split[0])
    assert parts.n_params == whole.n_params > 100e6
    assert parts.tensor_bytes == whole.tensor_bytes
    assert [t.name for t in parts.tensors] == [t.name for t in whole.tensors]
    assert parts.file_bytes == sum(p.stat().st_size for p in split)
    assert parts.layer_bytes == whole.layer_bytes and parts.vocab_size == whole.vocab_size
    assert not parts.truncated and [s.path for s in parts.shards] == [str(p) for p in split]
    joined = b"".join(p.read_bytes() for p in split)  # offsets run through the shards' files laid end to end
    single = Path(smollm_path).read_bytes()
    for t in parts.tensors[:2] + parts.tensors[-2:]:
        at = parts.data_offset + t.offset
        assert joined[at:at + t.n_bytes] == single[whole.data_offset + whole.tensor(t.name).offset:][:t.n_bytes]


def test_fit_inspect_ls_see_the_whole_model(smollm_path, split, isolated_home):
    fit_whole = json.loads(localrun_inprocess("fit", str(smollm_path), "--json").stdout)
    r = localrun_inprocess("fit", str(split[0]), "--json")
    assert r.returncode == 0, r.stderr
    fit_split = json.loads(r.stdout)

    for key in ("weights_bytes", "weights_cpu_bytes", "kv_cache_bytes", "n_layers", "quant", "weights_complete"):
        assert fit_split[key] == fit_whole[key], key
    assert fit_split["weights_bytes"] > 50e6 and fit_split["weights_complete"] is True

    r = localrun_inprocess("inspect", str(split[0]), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["n_params"] == read_gguf(smollm_path).n_params and info["weights_complete"]
    assert [s["path"] for s in info["shards"]] == [str(p) for p in split]

    store = isolated_home / "models" / "smol-split"
    store.mkdir(parents=True)
    for p in split:
        shutil.copy(p, store / p.name)
    r = localrun_inprocess("ls", "--json", "--no-external")
    rows = [m for m in json.loads(r.stdout) if m["source"] == "localrun"]
    assert len(rows) == 1 and rows[0]["size_bytes"] == sum(p.stat().st_size for p in split)
    assert rows[0]["complete"] and rows[0]["problem"] is None


@pytest.mark.parametrize("fault", ["missing", "foreign", "later"])
def test_a_broken_split_is_an_error_naming_the_shard(split, tmp_path, isolated_home, fault):
    if fault == "missing":
        paths = _variant(split, tmp_path, lambda ps: ps[1].unlink())
        bad, said = paths[1], "is missing"
    elif fault == "foreign":  # shard 2's bytes under shard 3's name: split.no says 1, its place says 2
        paths = _variant(split, tmp_path, lambda ps: shutil.copy(ps[1], ps[2]))
        bad, said = paths[2], "split.no=1"
    else:
        paths = _variant(split, tmp_path, lambda ps: None)
        bad, said = paths[1], "opened from its first shard"
    given = paths[1] if fault == "later" else paths[0]
    for cmd in (["fit", str(given)], ["inspect", str(given)], ["show", str(given)]):
        r = localrun_inprocess(*cmd)
        assert r.returncode == 3, (cmd, r.stdout, r.stderr)
        assert str(bad) in r.stderr and said in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    if fault == "missing":
        store = isolated_home / "models" / "broken"
        shutil.copytree(tmp_path, store, ignore=shutil.ignore_patterns("*.json"))
        rows = [m for m in json.loads(localrun_inprocess("ls", "--json", "--no-external").stdout)
                if m["source"] == "localrun"]
        assert len(rows) == 1 and not rows[0]["complete"] and "is missing" in rows[0]["problem"]


def test_a_cut_short_shard_is_incomplete_and_chat_refuses_it(split, tmp_path):
    def cut(ps):
        with open(ps[1], "r+b") as f:
            f.truncate(ps[1].stat().st_size // 2)

    paths = _variant(split, tmp_path, cut)
    info = json.loads(localrun_inprocess("inspect", str(paths[0]), "--json").stdout)
    assert info["weights_complete"] is False
    assert [s["weights_complete"] for s in info["shards"]] == [True, False, True]
    r = localrun_inprocess("chat", str(paths[0]), "--temp", "0")
    assert r.returncode == 3 and str(paths[1]) in r.stderr and "weights incomplete" in r.stderr, r.stderr


def test_a_missing_shard_stops_chat_before_loading(split, tmp_path):
    paths = _variant(split, tmp_path, lambda ps: ps[2].unlink())
    r = localrun_inprocess("chat", str(paths[0]))
    assert r.returncode == 3 and str(paths[2]) in r.stderr and "is missing" in r.stderr, r.stderr


@pytest.mark.model
def test_the_split_model_generates_what_the_single_file_generates(smollm_path, split):
    """llama.cpp opens the split from its first shard; greedy tokens and their logprobs equal the single
    file's (same weights, same kernels: no margin needed, the two paths are compared)."""
    from localrun.backends import load_engine
    from localrun.backends.base import SamplingParams
    from localrun.offload.plan import simple_plan

    params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=1, seed=0)
    out = []
    for path in (smollm_path, split[0]):
        plan = simple_plan(read_gguf(path), n_ctx=512)
        plan.n_threads = plan.n_threads_batch = 1
        eng = load_engine(path, plan)
        try:
            lps = [lp for c in eng.generate("The capital of France is", params) for lp in (c.logprobs or [])]
        finally:
            eng.close()
        out.append([(lp.token_id, lp.logprob) for lp in lps])
    assert len(out[0]) == 16 and out[1] == out[0]


@pytest.mark.model
def test_the_server_lists_and_loads_the_whole_split_model(smollm_path, split, isolated_home):
    """/v1/models lists the set at its full size and parameter count; loaded, /api/ps reports all its weights."""
    import httpx

    from localrun.commands.serve import make_registry
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    store = isolated_home / "models" / "smol-split"
    store.mkdir(parents=True)
    for p in split:
        shutil.copy(p, store / p.name)
    total = sum(p.stat().st_size for p in split)
    whole = read_gguf(smollm_path)
    settings, opts = Settings(home=isolated_home, models_dir=isolated_home / "models"), ServeOptions()
    reg = make_registry(settings, opts, parallel=1, ctx=512, threads=1)
    srv = ServerThread(create_app(None, settings, opts, registry=reg))
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            models = http.get("/v1/models").json()["data"]
            entry = next(m for m in models if m["meta"]["path"].startswith(str(store)))
            assert entry["meta"]["size"] == total and entry["meta"]["n_params"] == whole.n_params
            r = http.post("/api/generate", json={"model": entry["id"], "prompt": "Hi", "stream": False,
                                                 "options": {"num_predict": 2}})
            assert r.status_code == 200, r.text
            ps = http.get("/api/ps").json()["models"]
            assert ps[0]["localrun"]["memory"]["weights_bytes"] == whole.tensor_bytes
            assert ps[0]["size"] >= whole.tensor_bytes
    finally:
        srv.stop()
        reg.close()
