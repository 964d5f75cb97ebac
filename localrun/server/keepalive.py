"""Keep-alive, Ollama's semantics, and the request fields that steer residency: ``keep_alive`` (Ollama's, also
read on the OpenAI routes), ``ttl`` (LM Studio's) and ``options.num_ctx`` (Ollama's). Split from
``server/models.py``, which applies them."""

from __future__ import annotations

import math
import re
from typing import Any

from localrun.server.errors import RequestError

FOREVER = math.inf
DEFAULT_KEEP_ALIVE_S = 300.0  # Ollama's default: 5 minutes
_GO_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+")
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any, param: str = "keep_alive") -> float | None:
    """Ollama's ``keep_alive`` → seconds (``FOREVER`` for a negative value; None when absent).

    A number is seconds; a string is a Go duration (``"5m"``, ``"1h30m"``, ``"300ms"``, ``"-1m"``,
    ``"0"``) or a number of seconds (``"300"``). api/types.go ``Duration.UnmarshalJSON`` is the source.
    Raises RequestError naming ``param`` for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise RequestError(f"'{param}' must be a duration such as \"5m\" or a number of seconds", param=param)
    if isinstance(value, (int, float)):
        secs = float(value)
    elif isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            secs = float(text)
        except ValueError:
            if not _GO_DURATION.fullmatch(body):
                raise RequestError(f"'{param}': cannot read {value!r} as a duration",
                                   param=param, hint='use e.g. "5m", "1h", "30s", 0 (unload now) or -1 (never)'
                                   ) from None
            secs = sign * sum(float(n) * _GO_UNIT_S[u] for n, u in _GO_PART.findall(body))
    else:
        raise RequestError(f"'{param}' must be a duration such as \"5m\" or a number of seconds", param=param)
    if not math.isfinite(secs) and secs > 0:
        return FOREVER
    return FOREVER if secs < 0 else secs


def request_keep_alive(req) -> float | None:
    """A request body's keep-alive, seconds: ``keep_alive`` (Ollama's, also read on the OpenAI routes as an
    extension), else ``ttl`` (LM Studio's, seconds on its OpenAI routes; ``-1``: never). None: neither.
    Raises RequestError naming the field."""
    keep = parse_keep_alive(getattr(req, "keep_alive", None))
    if keep is None:
        ttl = getattr(req, "ttl", None)
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))):
            raise RequestError("'ttl' must be a number of seconds", param="ttl",
                               hint="e.g. 300 (five minutes), 0 (unload when the request ends), -1 (never)")
        keep = parse_keep_alive(ttl, "ttl")
    return keep


def request_n_ctx(req) -> int | None:
    """The context a request body asks for: Ollama's ``options.num_ctx`` (tokens per sequence), else None."""
    opts = getattr(req, "options", None)
    return getattr(opts, "num_ctx", None) if opts is not None else None


def fmt_keep_alive(secs: float) -> str:
    return "forever" if secs == FOREVER else f"{secs:g}s"
