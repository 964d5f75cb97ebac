"""`localrun pull` against a loopback stand-in for the Hugging Face Hub (HF_ENDPOINT) serving SmolLM2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_pull_fakehub import FakeHub, sha256_file

from localrun.errors import DownloadError, ModelNotFoundError
from localrun.machine.hardware import CpuInfo, DiskInfo, GpuInfo, HardwareProfile

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
FILE = "smollm2-135m-instruct-q4_1.gguf"
GiB = 1 << 30


@pytest.fixture(scope="session")
def smollm_sha(smollm_path) -> str:
    return sha256_file(smollm_path)


@pytest.fixture
def hub(smollm_path, smollm_sha, monkeypatch, tmp_path):
    # a second "quant" (a copy of the same bytes under the Q8_0 name) so the quant choice has two sizes
    big = tmp_path / "q8.gguf"
    with open(big, "wb") as f, open(smollm_path, "rb") as src:
        shutil.copyfileobj(src, f)
        f.write(b"\0" * (1 << 20))  # a bigger file: 1 MiB more
    h = FakeHub({REPO: {FILE: smollm_path, "smollm2-135m-instruct-q8_0.gguf": big},
                 "google/gated-GGUF": {"m-Q4_K_M.gguf": smollm_path}}, shas={smollm_path: smollm_sha})
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    yield h
    h.close()


def _hw(ram_gib: float, vram_gib: float = 0) -> HardwareProfile:
    gpus = [GpuInfo("RTX", "nvidia", "cuda", int(vram_gib * GiB), int(vram_gib * GiB))] if vram_gib else []
    return HardwareProfile(CpuInfo("cpu", "x86_64", 8, 16), int(ram_gib * GiB), int(ram_gib * GiB), gpus,
                           DiskInfo("/", 1 << 40, 1 << 40))


def test_parse_ref_forms():
    from localrun.store.pull import parse_ref

    r = parse_ref("smollm2-135m-instruct:q8_0")
    assert (r.name, r.quant, r.entry.name) == ("smollm2-135m-instruct", "Q8_0", "smollm2-135m-instruct")
    r = parse_ref("hf.co/bartowski/Qwen_Qwen3-8B-GGUF:Q4_K_M")
    assert (r.repo, r.quant, r.file, r.name) == ("bartowski/Qwen_Qwen3-8B-GGUF", "Q4_K_M", None,
                                                   "bartowski--Qwen_Qwen3-8B-GGUF")
    r = parse_ref("https://huggingface.co/unsloth/gemma-3-1b-it-GGUF/blob/main/gemma-3-1b-it-Q8_0.gguf")
    assert (r.repo, r.file, r.quant) == ("unsloth/gemma-3-1b-it-GGUF", "gemma-3-1b-it-Q8_0.gguf", "Q8_0")
    with pytest.raises(ModelNotFoundError) as e:  # exit 2, as the README says for a name that is nothing
        parse_ref("no-such-model")
    assert "catalog" in e.value.message and e.value.hint and e.value.exit_code == 2
    with pytest.raises(ModelNotFoundError) as e:
        parse_ref("qwen3-8:Q4_K_M")
    assert e.value.hint.startswith("did you mean qwen3-8b:Q4_K_M")
    with pytest.raises(ModelNotFoundError):
        parse_ref("smollm2-135m-instruct:Q2_K")


def test_pull_completes_verifies_and_chats(hub, smollm_path, smollm_sha, isolated_home):
    from localrun.backends import load_engine
    from localrun.backends.base import Message, SamplingParams
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.store.pull import pull
    from localrun.store.resolve import resolve_model

    seen = []
    res = pull("smollm2-135m-instruct:Q4_1", on_progress=lambda d, t: seen.append((d, t)))
    path = Path(res.path)
    assert res.status == "downloaded" and res.sha256 == smollm_sha
    assert path == isolated_home / "models" / "smollm2-135m-instruct" / FILE
    assert path.stat().st_size == smollm_path.stat().st_size and sha256_file(path) == smollm_sha
    assert seen[-1] == (path.stat().st_size, path.stat().st_size)
    assert not list(path.parent.glob("*.partial*"))
    side = json.loads(path.with_name(path.name + ".localrun.json").read_text())
    assert side["sha256"] == smollm_sha and side["quant"] == "Q4_1" and side["commit"]
    # the pulled model resolves by catalog name:QUANT and chats
    assert resolve_model("smollm2-135m-instruct:Q4_1") == path
    eng = load_engine(path, simple_plan(read_gguf(path), n_ctx=256))
    try:
        text = "".join(c.text for c in eng.chat([Message("user", "Say hello.")],
                                                 SamplingParams(temperature=0, max_tokens=6)))
    finally:
        eng.close()
    assert text.strip()
    # a second pull is a no-op
    n = len(hub.requests)
    again = pull("smollm2-135m-instruct:Q4_1")
    assert again.status == "up-to-date"
    assert not [r for r in hub.requests[n:] if r[0] == "GET" and "/resolve/" in r[1]]


def test_interrupted_pull_resumes_byte_identical(hub, smollm_path, smollm_sha, isolated_home):
    from localrun.store.pull import pull

    def interrupt(done, total):
        if done >= 20 << 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pull(f"hf.co/{REPO}:Q4_1", on_progress=interrupt)
    folder = isolated_home / "models" / "HuggingFaceTB--SmolLM2-135M-Instruct-GGUF"
    partial = folder / (FILE + ".partial")
    assert partial.stat().st_size >= 20 << 20 and not (folder / FILE).exists()
    kept = partial.stat().st_size
    res = pull(f"hf.co/{REPO}:Q4_1")
    assert res.status == "resumed" and res.resumed_from_bytes == kept
    gets = [r for r in hub.requests if r[0] == "GET" and r[1].endswith(FILE)]
    assert gets[-1][2] == f"bytes={kept}-"
    assert Path(res.path).read_bytes() == smollm_path.read_bytes()
    assert not partial.exists()


def test_dropped_connection_is_resumed_in_process(hub, smollm_path, smollm_sha):
    from localrun.store.pull import pull

    hub.drop_after = 5 << 20
    res = pull(f"hf.co/{REPO}/{FILE}")
    assert sha256_file(Path(res.path)) == smollm_sha
    ranges = [r[2] for r in hub.requests if r[0] == "GET" and r[1].endswith(FILE)]
    assert ranges[0] is None and ranges[1] and ranges[1].startswith("bytes=")


def test_checksum_mismatch_rejected_previous_file_untouched(hub, smollm_path, smollm_sha):
    from localrun.store.pull import pull

    good = Path(pull("smollm2-135m-instruct:Q4_1").path)
    before = good.stat().st_mtime_ns
    hub.sha_override[FILE] = "f" * 64  # the hub now advertises a new version; the bytes do not match it
    with pytest.raises(DownloadError) as e:
        pull("smollm2-135m-instruct:Q4_1")
    assert "sha256 mismatch" in e.value.message and "left as it was" in e.value.message
    assert good.stat().st_mtime_ns == before and sha256_file(good) == smollm_sha
    assert not list(good.parent.glob("*.partial*"))


def test_not_enough_disk_refused_before_download(hub):
    from localrun.store.pull import pull

    with pytest.raises(DownloadError) as e:
        pull("smollm2-135m-instruct:Q4_1", disk_free=lambda p: 10 << 20)
    assert "not enough disk space" in e.value.message and "LOCALRUN_MODELS" in e.value.hint
    assert not [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]


def test_gated_repo_message(hub, monkeypatch):
    from localrun.store.pull import pull

    hub.gated.add("google/gated-GGUF")
    with pytest.raises(DownloadError) as e:
        pull("hf.co/google/gated-GGUF/m-Q4_K_M.gguf")
    assert "gated" in e.value.message and "no HF_TOKEN" in e.value.message and "HF_TOKEN" in e.value.hint
    monkeypatch.setenv("HF_TOKEN", hub.good_token)
    res = pull("hf.co/google/gated-GGUF/m-Q4_K_M.gguf")
    assert res.status == "downloaded"


def test_no_quant_chooses_for_the_machine(hub):
    from localrun.store.pull import candidates, choose_quant, parse_ref

    files = candidates(parse_ref("smollm2-135m-instruct"))
    assert {f.quant for f in files} == {"Q4_1", "Q8_0"} and all(f.size_bytes and f.sha256 for f in files)
    big, why = choose_quant(files, _hw(ram_gib=16))
    assert big.quant == "Q8_0" and "fits" in why
    small_budget = int(min(f.size_bytes for f in files) * 1.2) + (512 << 10)  # fits Q4_1 + 20%, not Q8_0
    small, why = choose_quant(files, _hw(ram_gib=small_budget / GiB))
    assert small.quant == "Q4_1"


def test_cli_pull_json(hub, isolated_home):
    from typer.testing import CliRunner

    from localrun.cli import app

    r = CliRunner().invoke(app, ["pull", "smollm2-135m-instruct:Q4_1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["status"] == "downloaded" and out["quant"] == "Q4_1" and Path(out["path"]).is_file()


def test_split_gguf_pulls_every_part(smollm_path, monkeypatch, tmp_path):
    from localrun.store.pull import pull

    data = smollm_path.read_bytes()
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(data[: len(data) // 2])
    b.write_bytes(data[len(data) // 2:])
    h = FakeHub({"o/big-GGUF": {"big-Q4_K_M-00001-of-00002.gguf": a, "big-Q4_K_M-00002-of-00002.gguf": b}})
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    try:
        with pytest.raises(DownloadError) as e:  # the parts together do not fit: refused before any byte
            pull("hf.co/o/big-GGUF:Q4_K_M", disk_free=lambda p: len(data) * 3 // 4)
        assert "2 parts" in e.value.message
        res = pull("hf.co/o/big-GGUF:Q4_K_M")
        folder = Path(res.path).parent
        assert res.size_bytes == len(data)
        assert (folder / "big-Q4_K_M-00001-of-00002.gguf").read_bytes() + \
            (folder / "big-Q4_K_M-00002-of-00002.gguf").read_bytes() == data
    finally:
        h.close()


# --- the CLI: tidy errors (issue 11.14) and `localrun run` (11.13) --------------------------------------

def _cli(*args, timeout=300):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "localrun", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def _downloads(hub) -> list:
    return [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]


@pytest.mark.parametrize("ref,code,needle", [
    ("no-such-model", 2, "not in the catalog"),                         # README: 2 = model not found
    ("qwen3-8:Q4_K_M", 2, "did you mean qwen3-8b:Q4_K_M"),
    ("hf.co/nobody/nothing-GGUF", 2, "repository nobody/nothing-GGUF not found"),
    (f"hf.co/{REPO}:Q2_K", 2, "has no Q2_K file"),
])
def test_cli_pull_errors_are_one_message_and_the_readme_exit_code(hub, ref, code, needle):
    r = _cli("pull", ref)
    assert r.returncode == code, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: "), lines  # no empty progress bar first
    assert len(lines) == 2 and needle in r.stderr
    assert not _downloads(hub)


def test_cli_pull_progress_then_result(hub, isolated_home):
    r = _cli("pull", f"hf.co/{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"pulling {REPO}/{FILE}") and "downloaded and verified" in r.stderr
    assert lines[-1].startswith("run it: localrun chat ")


def test_run_off_a_terminal_needs_yes(hub, isolated_home):
    r = _cli("run", f"hf.co/{REPO}:Q4_1", "-p", "hi")
    assert r.returncode == 2, r.stderr
    assert "is not on this machine" in r.stderr and "--yes" in r.stderr and "Traceback" not in r.stderr
    assert not _downloads(hub) and not list((isolated_home / "models").rglob("*.gguf"))


def test_run_asks_on_a_terminal_and_no_downloads_nothing(hub, isolated_home):
    import sys

    import pexpect

    child = pexpect.spawn(sys.executable, ["-m", "localrun", "run", f"hf.co/{REPO}:Q4_1"], encoding="utf-8",
                          timeout=120, dimensions=(40, 200))
    child.expect(r"pulling .*smollm2-135m-instruct-q4_1\.gguf")
    child.expect(r"download it now\? \[y/N\]")
    child.sendline("n")
    child.expect("nothing downloaded")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert not _downloads(hub) and not list((isolated_home / "models").rglob("*.gguf"))


def test_run_yes_pulls_once_then_chats(hub, isolated_home, smollm_sha):
    ref = f"hf.co/{REPO}:Q4_1"
    r = _cli("run", ref, "--yes", "-p", "What is the capital of France?", "--temp", "0", "-n", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "downloaded and verified" not in r.stdout  # stdout: only the answer
    pulled = list((isolated_home / "models").rglob("*.gguf"))
    assert len(pulled) == 1 and sha256_file(pulled[0]) == smollm_sha
    n = len(_downloads(hub))
    again = _cli("run", ref, "-p", "What is the capital of France?", "--temp", "0", "-n", "4")  # no --yes needed
    assert again.returncode == 0, again.stderr
    assert len(_downloads(hub)) == n and again.stdout == r.stdout


# --- a multimodal catalog entry: its projector comes beside the model -------------------------------------

@pytest.fixture
def vision_hub(smollm_path, smollm_sha, monkeypatch, tmp_path):
    """gemma-3-4b-it's catalog files on the fake hub: SmolLM2's bytes under the model's name (only the names
    matter to pull) and the tests' tiny real Gemma-3 projector under ggml-org's projector name; and
    qwen2.5-vl-3b-instruct's model and projector (which pull must leave on the hub)."""
    from mmproj_tiny import write_tiny_mmproj

    proj = write_tiny_mmproj(tmp_path / "tiny-mmproj.gguf")
    h = FakeHub({"unsloth/gemma-3-4b-it-GGUF": {"gemma-3-4b-it-Q4_K_M.gguf": smollm_path},
                 "ggml-org/gemma-3-4b-it-GGUF": {"mmproj-model-f16.gguf": proj},
                 "ggml-org/Qwen2.5-VL-3B-Instruct-GGUF": {"Qwen2.5-VL-3B-Instruct-Q4_K_M.gguf": smollm_path,
                                                          "mmproj-Qwen2.5-VL-3B-Instruct-Q8_0.gguf": proj}},
                shas={smollm_path: smollm_sha})
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    yield h, proj
    h.close()


def test_pull_fetches_the_projector_beside_the_model(vision_hub, isolated_home):
    from localrun.commands.fit import run_fit
    from localrun.loading import find_mmproj, plan_load
    from localrun.model.gguf_info import read_gguf
    from localrun.store.pull import pull
    from localrun.store.resolve import list_local_models, remove_pulled

    hub, proj = vision_hub
    res = pull("gemma-3-4b-it:Q4_K_M")
    folder = isolated_home / "models" / "gemma-3-4b-it"
    assert Path(res.path) == folder / "gemma-3-4b-it-Q4_K_M.gguf" and res.status == "downloaded"
    assert Path(res.mmproj) == folder / "mmproj-model-f16.gguf" and not res.note
    assert sha256_file(Path(res.mmproj)) == sha256_file(proj)  # verified like the model
    side = json.loads((folder / "mmproj-model-f16.gguf.localrun.json").read_text())
    assert side["role"] == "mmproj" and side["sha256"] == sha256_file(proj)
    # what loads with the model: the projector beside it, planned with its compute buffer and image tokens
    assert find_mmproj(res.path) == Path(res.mmproj)
    prep = plan_load(res.path, backend="llamacpp", warn=False)
    assert prep.mmproj_path == Path(res.mmproj) and prep.plan.mmproj_bytes == read_gguf(proj).tensor_bytes
    assert prep.plan.vision["image_tokens"] == 16 and prep.plan.vision["compute_bytes"] > 0
    assert [m.name for m in list_local_models(external=False)] == ["gemma-3-4b-it"]  # the projector is no model
    assert run_fit("gemma-3-4b-it:Q4_K_M", preset="nvidia-24gb") == 0  # the file's plan, its projector counted
    # a second pull fetches neither file again
    n = len([r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]])
    again = pull("gemma-3-4b-it:Q4_K_M")
    assert again.status == "up-to-date" and again.mmproj == res.mmproj
    assert len([r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]) == n
    # removing the model takes its projector with it
    assert remove_pulled("gemma-3-4b-it") == [res.path, res.mmproj] and not folder.exists()


def test_pull_leaves_a_refused_projector_on_the_hub_and_says_why(vision_hub, isolated_home):
    from typer.testing import CliRunner

    from localrun.cli import app

    hub, _ = vision_hub
    r = CliRunner().invoke(app, ["pull", "qwen2.5-vl-3b-instruct:Q4_K_M", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["status"] == "downloaded" and out["mmproj"] is None
    assert "M-RoPE" in out["note"] and "mmproj-Qwen2.5-VL-3B-Instruct-Q8_0.gguf" in out["note"]
    assert not [r for r in hub.requests if "mmproj" in r[1]]
    assert not list((isolated_home / "models").rglob("mmproj*"))
