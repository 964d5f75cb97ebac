"""Small rendering helpers shared by the commands (Rich consoles, JSON).

Off a terminal (a pipe, a log file, a test's captured output) Rich would hard-wrap every printed line at
80 columns, cutting paths and hints in the middle of a name. These consoles soft-wrap instead: one
logical line stays one line. Tables still lay out at the console's width (soft wrap would cut
their cells short), which off a terminal is 200 columns unless COLUMNS says otherwise.
"""

from __future__ import annotations

import functools
import json
import os
import sys


@functools.cache
def _console_class():
    from rich.console import Console
    from rich.text import Text

    class LineConsole(Console):
        """A Console whose ``print`` of plain text soft-wraps when not writing to a terminal."""

        def print(self, *objects, soft_wrap=None, **kwargs):
            if soft_wrap is None and not self.is_terminal and all(isinstance(o, (str, Text)) for o in objects):
                soft_wrap = True
            super().print(*objects, soft_wrap=soft_wrap, **kwargs)

    return LineConsole


PIPE_WIDTH = 200  # columns for tables off a terminal (Rich's default, 80, cuts names and paths short)


def _console(**kwargs):
    con = _console_class()(highlight=False, **kwargs)
    if not con.is_terminal and not os.environ.get("COLUMNS"):
        con.width = PIPE_WIDTH  # tables take only the width they need; COLUMNS still wins
    return con


def stdout():
    return _console()


def stderr():
    return _console(stderr=True)


def print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()
