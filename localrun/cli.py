"""The ``localrun`` command line: a thin Typer app. Parse → call the library → render.

``main()`` turns every ``LocalrunError`` into ``error: …`` plus a hint and the error's exit code;
a traceback appears only with ``LOCALRUN_DEBUG=1``.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

app = typer.Typer(
    name="localrun",
    help="Run large language models on the hardware you already own.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# one module per command; each has register(app)
COMMAND_MODULES = [
    "localrun.commands.chat",
    "localrun.commands.run",  # after chat: built from chat's options
    "localrun.commands.hw",
    "localrun.commands.inspect",
    "localrun.commands.serve",
    "localrun.commands.fit",
    "localrun.commands.models",
    "localrun.commands.bench",
    "localrun.commands.worker",
    "localrun.commands.launch",
]

for _mod in COMMAND_MODULES:
    importlib.import_module(_mod).register(app)


@app.callback(invoke_without_command=True)
def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit.")) -> None:
    if version:
        from localrun import __version__

        typer.echo(f"localrun {__version__}")
        raise typer.Exit()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point. Exits with the command's status: ``typer.Exit(code)`` (which click
    returns rather than raises when ``standalone_mode=False``), a ``LocalrunError``'s ``exit_code``, 2 for
    a usage error, 130 for Ctrl-C."""
    from localrun.errors import LocalrunError

    try:
        rc = app(args=argv, standalone_mode=False)
    except LocalrunError as e:
        if os.environ.get("LOCALRUN_DEBUG"):
            raise
        print_error(e)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(1)
    except Exception as e:  # usage errors (bad option, value out of range) arrive here with standalone_mode=False
        if _is_usage_error(e):
            e.show()
            sys.exit(2)
        raise
    if isinstance(rc, int) and not isinstance(rc, bool) and rc:
        sys.exit(rc)


def print_error(e) -> None:
    """``error: MESSAGE`` and ``hint: HINT`` on stderr. Off a terminal each is one line, never wrapped at
    80 columns (a path stays whole for grep and log files); on a terminal Rich wraps at its width."""
    from rich.markup import escape

    from localrun.render import stderr

    err = stderr()
    err.print(f"[bold red]error:[/] {escape(e.message)}")
    if e.hint:
        err.print(f"[yellow]hint:[/] {escape(e.hint)}")


def _is_usage_error(e: Exception) -> bool:
    """click's and typer's own (vendored, since typer 0.20) ClickException: a user's bad flag or value."""
    classes = []
    try:
        from typer._click.exceptions import ClickException as TyperClickException

        classes.append(TyperClickException)
    except ImportError:
        pass
    try:
        import click

        classes.append(click.ClickException)
    except ImportError:
        pass
    return isinstance(e, tuple(classes))
