"""`localrun hw`: what this machine has."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("hw")
    def hw(json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
        """Show CPU, RAM, GPUs (VRAM, Apple unified memory) and the model disk."""
        from localrun.hardware import probe_hardware
        from localrun.render import print_json, stdout

        prof = probe_hardware()
        if json_out:
            print_json(prof.to_dict())
        else:
            stdout().print(prof)
