"""The real client programs the client tests run, installed pinned into a cache folder by the tests' setup.

npm packages go to ``<cache>/npm/<name>@<version>/node_modules`` (``npm install --prefix``), once per version;
the cache is ``$LOCALRUN_TEST_CLIENTS``, else ``~/.cache/localrun-test-clients`` of the real home (the
suite's HOME is a scratch folder, see tests/conftest.py). A client that cannot be installed fails the test
(CI has node and npm): it is never a skip. Python clients (openai, anthropic, ollama, openai-agents) are
pinned in pyproject's ``test`` extra and installed by the README's test command.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

# pinned versions of the npm clients (what the tests and the README's "Use it with…" table name)
CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.332")
CODEX = ("@openai/codex", "0.171.0")
QWEN_CODE = ("@qwen-code/qwen-code", "0.24.4")  # an OpenAI-compatible coding CLI (chat completions)
# older versions users still run, which send something the pinned one does not (the as-installed tests run both):
# Claude Code 2.1.197's TaskCreate has `propertyNames`; Codex 0.169.0 sends its own tool list and web_search
CLAUDE_CODE_OLD = ("@anthropic-ai/claude-code", "2.1.197")
CODEX_OLD = ("@openai/codex", "0.169.0")


def cache_dir() -> Path:
    real_home = Path(os.environ.get("LOCALRUN_TEST_REAL_HOME") or Path.home())
    return Path(os.environ.get("LOCALRUN_TEST_CLIENTS") or real_home / ".cache" / "localrun-test-clients")


def npm_package(name: str, version: str) -> Path:
    """``node_modules`` holding ``name@version`` (and its platform packages), installed on first use.
    Fails the test when node/npm are missing or npm cannot install it."""
    npm = shutil.which("npm")
    if not shutil.which("node") or not npm:
        pytest.fail("node and npm are needed for the client tests: apt-get install nodejs npm")
    prefix = cache_dir() / "npm" / f"{name.replace('/', '+')}@{version}"
    prefix.mkdir(parents=True, exist_ok=True)
    done = prefix / ".installed"
    with open(prefix / ".lock", "w") as lock:  # two test processes installing at once wait for each other
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            r = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                                "--loglevel=error", f"{name}@{version}"],
                               capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                pytest.fail(f"npm could not install {name}@{version}:\n{r.stderr[-2000:]}")
            done.write_text(version)
    return prefix / "node_modules"


def claude_binary(version: str = CLAUDE_CODE[1]) -> Path:
    """Claude Code's native binary (the ``-linux-x64`` package npm installs beside the launcher)."""
    mods = npm_package(CLAUDE_CODE[0], version)
    for cand in (mods / "@anthropic-ai" / "claude-code-linux-x64" / "claude",
                 mods / "@anthropic-ai" / "claude-code" / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64"
                 / "claude",
                 mods / ".bin" / "claude"):
        if cand.exists():
            return cand
    pytest.fail(f"Claude Code's binary is not under {mods}")


def codex_binary(version: str = CODEX[1]) -> Path:
    return _launcher(CODEX[0], version, "codex")


def qwen_binary(version: str = QWEN_CODE[1]) -> Path:
    return _launcher(QWEN_CODE[0], version, "qwen")


def _launcher(package: str, version: str, name: str) -> Path:
    """``node_modules/.bin/NAME`` of ``package@version`` (installed on first use); fails the test if absent."""
    mods = npm_package(package, version)
    cand = mods / ".bin" / name
    if not cand.exists():
        pytest.fail(f"{name}'s launcher is not under {mods}")
    return cand
