"""`localrun chat [MODEL]` (filled in below)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
