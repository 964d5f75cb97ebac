"""Names: a request's ``model`` field → the key (the resolved path) of the model it names.

Anything ``localrun ls`` finds (catalog name, pulled ``name:QUANT``, a path, Ollama's ``name:tag``, a Hugging
Face or LM Studio repo: ``store.resolve.resolve_model``), a resident's id, its file name or ``id:latest``. No
name (or ``default``) is the default model: the first one named at start-up, else the embedded SmolLM2. A
name that resolves to nothing is a 404 (``ModelNotFoundError``), unless the server was started with a model:
then it answers with that one (llama-server's behaviour, so clients that send any name keep working).
Names resolved before are remembered (and names that resolved to nothing) until the store changes
(``forget``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from localrun.errors import ModelNotFoundError
from localrun.server.residency import Resident, path_key

log = logging.getLogger("localrun.server")


class ModelNames:
    """Resolves names for one registry: ``residents`` is its ``Residency.residents`` (key → ``Resident``),
    ``settings.models_dir`` the model store; ``default_key`` the default model's key (None: none yet)."""

    def __init__(self, settings, residents: dict[str, Resident]) -> None:
        self.settings = settings
        self.residents = residents
        self.default_key: str | None = None  # the first model named at start-up
        self._names: dict[str, str] = {}  # name → key (resolved before)
        self._missing: set[str] = set()
        self._fallback_logged: set[str] = set()
        self._aliases: dict[str, str] = {}  # `serve --alias NAME` → key, known while the model is unloaded too

    def alias(self, name: str, key: str) -> None:
        """``name`` (``serve --alias``) names ``key`` from now on, loaded or not (``/api/show`` as ``/api/chat``)."""
        self._aliases[name] = self._aliases[f"{name}:latest"] = key

    async def resolve(self, name: str | None) -> str:
        """``name`` → the key (path) of the model it names (module docstring). Raises ModelNotFoundError."""
        key = self.known(name)
        if key is not None:
            return key
        from starlette.concurrency import run_in_threadpool

        try:
            return await run_in_threadpool(self.resolve_sync, name)
        except ModelNotFoundError:
            if self.default_key is None:
                raise
            if name not in self._fallback_logged and len(self._fallback_logged) < 1000:
                self._fallback_logged.add(name)
                log.info("model %r is not on this machine: answering with %s", name,
                         self.residents[self.default_key].model_id if self.default_key in self.residents
                         else self.default_key)
            return self.default_key

    async def resolve_strict(self, name: str) -> str:
        """``name`` → key, with no fallback to the default model. Raises ModelNotFoundError."""
        key = self.known(name)
        if key is not None:
            return key
        from starlette.concurrency import run_in_threadpool

        return await run_in_threadpool(self.resolve_sync, name)

    def known(self, name: str | None) -> str | None:
        """The key of ``name`` without looking on disk: the default, a resident's name, a name resolved
        before; None otherwise."""
        if not name or name == "default":
            return self.default_key or self._names.get("")
        for r in self.residents.values():
            if name in r.names():
                return r.key
        return self._aliases.get(name) or self._names.get(name)

    def resolve_sync(self, name: str | None) -> str:
        """``resolve`` without the fallback, on this thread (it may read the disk). Raises
        ModelNotFoundError."""
        key = self.known(name)
        if key is not None:
            return key
        if name in self._missing:
            raise ModelNotFoundError(name, hint="GET /api/tags lists the models this server can load; "
                                     "`localrun pull NAME` (or POST /api/pull) fetches one")
        from localrun.store.resolve import resolve_model

        try:
            key = path_key(resolve_model(name or None, self.settings.models_dir))
        except ModelNotFoundError:
            if name and len(self._missing) < 10_000:
                self._missing.add(name)
            raise
        self._names[name or ""] = key
        return key

    def remember(self, names: set[str], key: str) -> None:
        """A model leaves memory (keep-alive, eviction): the names it answered to keep naming ``key``, so the
        next request for it reloads it instead of falling back to the default model."""
        for n in names:
            self._names[n] = key

    def forget(self) -> None:
        """The store changed (pull, copy, delete): names resolve again."""
        self._names.clear()
        self._missing.clear()


def model_id_for(name: str | None, path: str) -> str:
    """What the API calls a model loaded by ``name``: the name itself, unless it is a path or absent (then
    the file's display name, as `fit` prints it)."""
    from localrun.store.resolve import display_name, looks_like_path

    if name and name != "default" and not looks_like_path(name) and not Path(name).exists():
        return name
    return display_name(path)
