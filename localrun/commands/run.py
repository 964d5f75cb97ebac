"""`localrun run [MODEL]`: Ollama's habit — chat with MODEL, pulling it first when it is not on this machine.

Every option of `chat` works the same way here (the command is built from chat's own parameters), plus
``--yes/-y``. The download asks first on a terminal (y/N, after showing the file and its size); off a
terminal it needs ``--yes``, so a script never starts a multi-gigabyte download by accident.
"""

from __future__ import annotations

import inspect
import sys
import typing

import typer

YES = typer.Option(False, "--yes", "-y", help="Download MODEL without asking when it is not here yet.")


def register(app: typer.Typer) -> None:
    chat = next(c.callback for c in app.registered_commands if c.name == "chat")
    hints = typing.get_type_hints(chat)
    params = [p.replace(annotation=hints[p.name]) for p in inspect.signature(chat).parameters.values()]
    params.append(inspect.Parameter("yes", inspect.Parameter.KEYWORD_ONLY, default=YES, annotation=bool))

    def run(**kwargs) -> None:
        yes = kwargs.pop("yes")
        kwargs["model"] = ensure_local(kwargs["model"], yes=yes)
        chat(**kwargs)

    run.__signature__ = inspect.Signature(params)
    run.__annotations__ = {p.name: p.annotation for p in params}
    run.__doc__ = ("Chat with MODEL, downloading it first if it is not on this machine (asks first; "
                   "--yes to skip). Options as in `chat`.")
    app.command("run")(run)


def ensure_local(model: str | None, *, yes: bool) -> str | None:
    """MODEL if it resolves on this machine; else pull it (a catalog name or hub reference) and return the
    downloaded file's path. Asks on a terminal unless ``yes``; off a terminal without ``yes`` raises
    ModelNotFoundError with the command to run. Other errors (a missing path, a folder of several models,
    a name nothing matches) are ``resolve_model``'s, unchanged."""
    from localrun.errors import ModelNotFoundError
    from localrun.store.resolve import looks_like_path, resolve_model

    try:
        resolve_model(model)
        return model
    except ModelNotFoundError:
        if model is None or looks_like_path(model) or not _pullable(model):
            raise
    if not yes and not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise ModelNotFoundError(model, message=f"{model} is not on this machine",
                                 hint=f"`localrun run {model} --yes` downloads it first (or `localrun pull "
                                 f"{model}`, then run)") from None
    from localrun.commands.models import pull_with_progress

    return pull_with_progress(model, confirm=None if yes else _ask).path


def _pullable(model: str) -> bool:
    from localrun.errors import LocalrunError
    from localrun.store.pull import parse_ref

    try:
        parse_ref(model)
    except LocalrunError:
        return False
    return True


def _ask(_file) -> None:
    if not typer.confirm("download it now?", default=False, err=True):
        from localrun.render import stderr

        stderr().print("nothing downloaded")
        raise typer.Exit(1)
