"""What a new user trips over at the command line (issue 11): wrapped errors, folders as MODEL, sizes without
a unit, short flags that mean something else than in llama.cpp, lost exit codes, and one display name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import localrun_inprocess

from localrun.errors import AmbiguousModelError, ConfigError, ModelNotFoundError


def run(*args, stdin=None, env=None, timeout=300):
    e = dict(os.environ)
    e.pop("COLUMNS", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "localrun", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=e)


# --- 11.5: errors are one line each off a terminal ------------------------------------------------

def test_error_and_hint_are_one_unwrapped_line_each_when_piped(tmp_path):
    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "another-folder-with-a-long-name"
    deep.mkdir(parents=True)
    path = deep / "my-model-Q4_K_M.gguf"
    r = run("chat", str(path), "-p", "hi")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), lines
    assert str(path) in lines[0] and str(deep) in lines[1]  # whole, though far wider than 80 columns
    assert len(lines[0]) > 80


def test_tables_are_not_cut_to_80_columns_when_piped(smollm_path):
    r = run("ls")  # the embedded model is listed, and its ref and path come out whole
    assert r.returncode == 0, r.stderr
    assert "smollm2-135m-instruct:Q4_1" in r.stdout and str(smollm_path) in r.stdout and "embedded" in r.stdout


# --- 12.6: typer.Exit's code survives cli.main ------------------------------------------------------

def test_main_keeps_typer_exit_code():
    import typer

    from localrun.cli import app, main

    @app.command("exit-test-only", hidden=True)
    def _exit_test(code: int = 0) -> None:
        raise typer.Exit(code)

    try:
        with pytest.raises(SystemExit) as e:
            main(["exit-test-only", "--code", "3"])
        assert e.value.code == 3
        main(["exit-test-only", "--code", "0"])  # 0: returns normally, no SystemExit
    finally:
        app.registered_commands[:] = [c for c in app.registered_commands if c.name != "exit-test-only"]


# --- 11.7: a folder as MODEL, resolved the same way everywhere -------------------------------------

def _link(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(src, dst)
    return dst


def test_resolve_folder_rules(tmp_path, smollm_path):
    from localrun.store.resolve import resolve_model

    one = tmp_path / "one"
    f = _link(smollm_path, one / "SmolLM2-135M-Instruct.Q4_1.gguf")
    (one / "mmproj-SmolLM2-f16.gguf").write_bytes(b"x")  # a projector is not a model
    assert resolve_model(str(one)) == f

    split = tmp_path / "split"
    first = _link(smollm_path, split / "m-Q4_1-00001-of-00002.gguf")
    _link(smollm_path, split / "m-Q4_1-00002-of-00002.gguf")
    assert resolve_model(str(split)) == first  # one model in two parts

    nested = tmp_path / "nested"  # the store's NAME/FILE layout
    g = _link(smollm_path, nested / "smollm" / "x.gguf")
    assert resolve_model(str(nested)) == g

    two = tmp_path / "two"
    _link(smollm_path, two / "a-Q4_1.gguf")
    _link(smollm_path, two / "b-Q8_0.gguf")
    with pytest.raises(AmbiguousModelError) as e:
        resolve_model(str(two))
    assert e.value.exit_code == 2 and isinstance(e.value, ModelNotFoundError)
    assert e.value.candidates == ["a-Q4_1.gguf", "b-Q8_0.gguf"]
    assert str(two / "a-Q4_1.gguf") in e.value.hint

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no model here")
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model(str(empty))
    assert "no model in the folder" in e.value.message and ".gguf" in e.value.hint

    (empty / "x.gguf.partial").write_bytes(b"half")
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model(str(empty))
    assert "unfinished download" in e.value.hint

    mlx = tmp_path / "mlx"  # config.json + safetensors: a model folder for the MLX backend, kept as is
    mlx.mkdir()
    (mlx / "config.json").write_text("{}")
    (mlx / "model.safetensors").write_bytes(b"")
    assert resolve_model(str(mlx)) == mlx


def test_folder_message_is_the_same_for_every_command(tmp_path, smollm_path):
    two = tmp_path / "two"
    _link(smollm_path, two / "a-Q4_1.gguf")
    _link(smollm_path, two / "b-Q8_0.gguf")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    errors = set()
    for args in (["chat", str(two), "-p", "hi"], ["serve", str(two), "--port", port], ["inspect", str(two)],
                 ["fit", str(two)], ["bench", str(two)]):
        r = localrun_inprocess(*args)  # cli.main's error path, as in a process of its own (no model loads)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr
        errors.add(r.stderr)
    assert len(errors) == 1, errors
    (msg,) = errors
    assert "holds 2 models: a-Q4_1.gguf, b-Q8_0.gguf" in msg and "hint: pick one by its path" in msg


def test_folder_with_one_gguf_works_in_inspect_and_fit(tmp_path, smollm_path):
    one = tmp_path / "one"
    _link(smollm_path, one / smollm_path.name)
    r = localrun_inprocess("inspect", str(one), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_layer"] == 30
    r = localrun_inprocess("fit", str(one), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["quant"] == "Q4_1"


# --- 11.8: sizes need a unit --------------------------------------------------------------------------

@pytest.mark.parametrize("text,expect", [("24GiB", 24 << 30), ("24GB", 24 << 30), ("24G", 24 << 30),
                                         ("24 gib", 24 << 30), ("512MiB", 512 << 20), ("512M", 512 << 20),
                                         ("1.5T", int(1.5 * (1 << 40))), ("64KiB", 64 << 10),
                                         ("25769803776", 24 << 30), ("100B", 100)])
def test_parse_bytes_accepts(text, expect):
    from localrun.units import parse_bytes

    assert parse_bytes(text) == expect


@pytest.mark.parametrize("text", ["24", "16384", "0", "lots", "24 XB", ""])
def test_parse_bytes_refuses_with_a_hint(text):
    from localrun.units import parse_bytes

    with pytest.raises(ConfigError) as e:
        parse_bytes(text, flag="--vram")
    assert e.value.message.startswith("--vram") and e.value.hint
    assert isinstance(e.value, ValueError)  # callers that catch ValueError keep working
    if text == "16384":
        assert "did you mean 16384MiB?" in e.value.hint  # a bare number ≥ 1024 reads as MiB, not GiB


def test_units_and_hardware_share_the_formatter():
    from localrun import units
    from localrun.machine import hardware

    assert hardware.fmt_bytes is units.fmt_bytes and hardware.parse_bytes is units.parse_bytes
    assert units.fmt_bytes(1536) == "1.5 KiB" and units.fmt_bytes(24 << 30) == "24.0 GiB"


def test_fit_vram_without_unit_is_refused():
    r = localrun_inprocess("fit", "--vram", "24")
    assert r.returncode == 9, r.stderr
    assert "'24' has no unit" in r.stderr and "did you mean 24GiB?" in r.stderr and "Traceback" not in r.stderr
    r = localrun_inprocess("fit", "--vram", "24GiB", "--json")
    assert r.returncode in (0, 1), r.stderr
    assert "24GiB" in json.loads(r.stdout)["machine"]


# --- 11.10: short flags mean what they mean in llama.cpp ------------------------------------------

LLAMA_CPP_SHORT = {"-t": "--threads", "-c": "--ctx-size", "-n": "--n-predict", "-p": "--prompt", "-s": "--seed",
                   "-ngl": "--n-gpu-layers", "-np": "--parallel", "-fa": "--flash-attn"}


def _options(command: str) -> dict[str, set[str]]:
    """short flag → every name of that option, for one command."""
    import typer

    from localrun.cli import app

    cmd = typer.main.get_command(app).commands[command]
    out = {}
    for p in cmd.params:
        names = set(getattr(p, "opts", [])) | set(getattr(p, "secondary_opts", []))
        for n in names:
            if not n.startswith("--"):
                out[n] = names
    return out


@pytest.mark.parametrize("command", ["chat", "run", "serve", "bench", "fit"])
def test_short_flags_follow_llama_cpp(command):
    for short, names in _options(command).items():
        if short in LLAMA_CPP_SHORT:
            assert LLAMA_CPP_SHORT[short] in names, (command, short, names)
    opts = _options(command)
    if command in ("chat", "run"):
        assert {"-t", "-c", "-n", "-p", "-s", "-ngl", "-fa"} <= set(opts)
        chat = typer_option_names(command)
        assert {"--temp", "--temperature"} <= chat and "--threads" in chat


def typer_option_names(command: str) -> set[str]:
    import typer

    from localrun.cli import app

    cmd = typer.main.get_command(app).commands[command]
    return {n for p in cmd.params for n in getattr(p, "opts", [])}


@pytest.mark.parametrize("value", ["0", "0.7"])
def test_old_chat_t_points_to_temp(value):
    r = localrun_inprocess("chat", "-t", value, "-p", "hi")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"--temp {value}" in r.stderr and "threads" in r.stderr


def test_old_bench_c_points_to_concurrency():
    r = localrun_inprocess("bench", "-c", "1,4")
    assert r.returncode == 2 and "--concurrency 1,4" in r.stderr and "Traceback" not in r.stderr


# --- 11.16: one display name -----------------------------------------------------------------------

def test_display_name_is_the_file_or_tag(smollm_path, tmp_path):
    from localrun.model.gguf_info import read_gguf
    from localrun.store.resolve import display_name

    assert display_name(smollm_path) == "SmolLM2-135M-Instruct.Q4_1"
    assert read_gguf(smollm_path).name != display_name(smollm_path)  # general.name is a training-run label
    assert display_name(tmp_path / "Qwen3-8B-Q4_K_M-00001-of-00003.gguf") == "Qwen3-8B-Q4_K_M"
    # an Ollama blob shows its tag, as `ollama list` does
    root = tmp_path / "ollama"
    blob = root / "blobs" / ("sha256-" + "ab" * 32)
    blob.parent.mkdir(parents=True)
    shutil.copyfile(smollm_path, blob)
    man = root / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    man.parent.mkdir(parents=True)
    man.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                           "digest": "sha256:" + "ab" * 32}]}))
    assert display_name(blob) == "smollm2:135m"


def test_fit_and_inspect_show_the_display_name(smollm_path):
    r = localrun_inprocess("fit", str(smollm_path))  # cli.main as the console script runs it (no model loads)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("SmolLM2-135M-Instruct.Q4_1 on ")
    r = localrun_inprocess("inspect", str(smollm_path), env={"COLUMNS": "200"})
    assert "SmolLM2-135M-Instruct.Q4_1" in r.stdout and "Smollm2 135M" not in r.stdout


def test_serve_and_ps_show_the_same_name_as_fit(tmp_path, smollm_path):
    """A folder holding SmolLM2 served: /v1/models, /api/ps and `localrun ps` all say the file's name, as
    `fit` does for the same folder."""
    import socket
    import time

    import httpx

    one = tmp_path / "one"
    _link(smollm_path, one / smollm_path.name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "localrun", "serve", str(one), "--port", str(port),
                             "--parallel", "1", "--ctx", "256", "--threads", "1"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240  # an upper bound for loading on a busy 2-core box, not a speed assert
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            assert time.time() < deadline, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        fit_title = localrun_inprocess("fit", str(one)).stdout.split(" on ", 1)[0]
        assert fit_title == "SmolLM2-135M-Instruct.Q4_1"
        cards = httpx.get(url + "/v1/models").json()["data"]  # the loaded model first, then what can load
        assert [m["id"] for m in cards if m["meta"]["loaded"]] == [fit_title] and cards[0]["id"] == fit_title
        ps = localrun_inprocess("ps", "--json", "--port", str(port))
        assert [m["name"] for m in json.loads(ps.stdout)["models"]] == [fit_title], ps.stdout
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
