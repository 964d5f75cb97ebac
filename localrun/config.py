"""Settings: flags > ``LOCALRUN_*`` environment > config file > defaults, read at call time (never cached
at import), so tests can point ``LOCALRUN_HOME`` at a temporary directory.

Files (all under ``home``, default ``~/.localrun``):
    config.toml     optional; keys as in ``Settings`` (``models_dir = "/data/models"``)
    models/         the model store (``LOCALRUN_MODELS`` overrides)
    history         chat input history
    measurements.json  `localrun hw --measure` and `bench --calibrate` results
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from localrun.errors import ConfigError

DEFAULT_PORT = 11500  # clashes with neither Ollama (11434) nor llama-server (8080)


@dataclass(frozen=True)
class Settings:
    home: Path
    models_dir: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    backend: str | None = None  # llamacpp | mlx | None (planner chooses)

    @property
    def history_file(self) -> Path:
        return self.home / "history"

    @property
    def measurements_file(self) -> Path:
        return self.home / "measurements.json"


def env_threads() -> int | None:
    """CPU threads for llama.cpp where no ``--threads`` was given: ``LOCALRUN_THREADS`` (an integer ≥ 1, the
    counterpart of llama-server's ``LLAMA_ARG_THREADS``), or None when it is unset (the caller's default, the
    physical cores, applies). Several processes sharing a machine (test workers, two servers) set it so that
    their threads together do not exceed the cores: ggml's threads wait for each other at every graph node,
    and an oversubscribed core stalls all of them. Raises ConfigError for a value that is not an integer ≥ 1."""
    raw = (os.environ.get("LOCALRUN_THREADS") or "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"LOCALRUN_THREADS={raw!r} is not a thread count",
                          hint="set it to an integer ≥ 1 (CPU threads for llama.cpp), or unset it for the physical "
                               "cores")
    return n


def get_settings(**overrides) -> Settings:
    """Resolve settings now. ``overrides`` are flag values (None = not given).

    Raises ConfigError when the config file is not valid TOML or has an unknown key.
    """
    home = Path(os.environ.get("LOCALRUN_HOME") or Path.home() / ".localrun").expanduser()
    values: dict = {}
    cfg = home / "config.toml"
    if cfg.is_file():
        try:
            values.update(tomllib.loads(cfg.read_text()))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{cfg}: not valid TOML ({e})", hint=f"fix or delete {cfg}") from None
        known = {f.name for f in fields(Settings)}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"{cfg}: unknown key(s) {sorted(unknown)}", hint=f"known keys: {sorted(known)}")
    env = {
        "models_dir": os.environ.get("LOCALRUN_MODELS"),
        "host": os.environ.get("LOCALRUN_HOST"),
        "port": os.environ.get("LOCALRUN_PORT"),
        "api_key": os.environ.get("LOCALRUN_API_KEY"),
        "backend": os.environ.get("LOCALRUN_BACKEND"),
    }
    values.update({k: v for k, v in env.items() if v})
    values.update({k: v for k, v in overrides.items() if v is not None})
    values["home"] = home
    values["models_dir"] = Path(values.get("models_dir") or home / "models").expanduser()
    if "port" in values:
        try:
            values["port"] = int(values["port"])
        except ValueError:
            raise ConfigError(f"port must be a number, got {values['port']!r}") from None
    return Settings(**values)
