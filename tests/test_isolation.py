"""The suite never touches the user's own state: LOCALRUN_HOME and HOME point into the session's scratch
folder (tests/conftest.py), for this process and for what it starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REAL_HOME, real_localrun_changes


def test_homes_are_scratch_folders(isolated_home):
    from localrun.config import get_settings

    assert Path(os.environ["HOME"]).resolve() != REAL_HOME
    assert Path.home().resolve() != REAL_HOME
    home = Path(get_settings().home).resolve()
    assert home == isolated_home.resolve()
    assert REAL_HOME / ".localrun" not in home.parents and home != REAL_HOME / ".localrun"


def test_a_localrun_subprocess_writes_only_under_the_scratch_home(isolated_home, deepseek_header_path):
    """``localrun inspect`` caches the GGUF header it reads under LOCALRUN_HOME: there, not in ~/.localrun."""
    r = subprocess.run([sys.executable, "-m", "localrun", "inspect", str(deepseek_header_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert any(isolated_home.rglob("*")), "the header cache should have been written under the test's home"
    assert real_localrun_changes() == []
