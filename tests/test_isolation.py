"""The suite never touches the user's own state: LOCALRUN_HOME and HOME point into the session's scratch
folder (tests/conftest.py), for this process and for what it starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import REAL_HOME


def test_homes_are_scratch_folders(isolated_home):
    from localrun.config import get_settings

    assert Path(os.environ["HOME"]).resolve() != REAL_HOME
    assert Path.home().resolve() != REAL_HOME
    home = Path(get_settings().home).resolve()
    assert home == isolated_home.resolve()
    assert REAL_HOME / ".localrun" not in home.parents and home != REAL_HOME / ".localrun"


def test_a_localrun_subprocess_writes_only_under_the_scratch_home(isolated_home, deepseek_header_path, tmp_path):
    """``localrun inspect`` caches the GGUF header it reads under LOCALRUN_HOME: there, not in ~/.localrun.

    The check is on what this test's own process wrote, not on the whole machine's ~/.localrun (another
    localrun run with the real home during the suite changes that, and failed this test): the model is a
    link under a name only this test uses, so the header cache entry it causes is named by that path alone
    (``model/header_cache.py``: the sha256 of the absolute path), and its JSON records that path."""
    unique = tmp_path / f"isolation-{os.getpid()}-{time.monotonic_ns()}.gguf"
    unique.symlink_to(deepseek_header_path)
    env = {k: v for k, v in os.environ.items() if k != "LOCALRUN_HOME"}  # a process that only knows its HOME
    for e in (dict(os.environ), env):
        r = subprocess.run([sys.executable, "-m", "localrun", "inspect", str(unique)], capture_output=True,
                           text=True, timeout=300, env=e)
        assert r.returncode == 0, r.stderr
    mine = [p for p in isolated_home.rglob("*.json") if str(unique) in p.read_text(errors="replace")]
    assert mine, "the header cache should have been written under the test's home"
    scratch_default = Path(os.environ["HOME"]) / ".localrun"  # where HOME alone puts it: the scratch home
    assert any(str(unique) in p.read_text(errors="replace") for p in scratch_default.rglob("*.json"))
    real = REAL_HOME / ".localrun"
    leaked = [p for p in (real.rglob("*.json") if real.is_dir() else [])
              if str(unique) in p.read_text(errors="replace")]
    assert leaked == [], f"this test's localrun wrote under the real home: {leaked}"
