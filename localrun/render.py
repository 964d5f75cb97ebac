"""Small rendering helpers shared by the commands (Rich consoles, JSON)."""

from __future__ import annotations

import json
import sys


def stdout():
    from rich.console import Console

    return Console(highlight=False)


def stderr():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()
