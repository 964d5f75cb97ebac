"""Pure converters between Ollama's wire format (``schemas.py``) and the engine's data (``backends/base.py``).

No I/O, no engine, no globals: /api/chat messages, ``options`` and ``format`` → message dicts and
``SamplingParams``; ``Stats`` → Ollama's closing fields; a model's facts → ``details`` and ``/api/tags``
entries. Durations are nanoseconds, times RFC 3339 (Ollama api/types.go). What these share with OpenAI's
converters is in ``server/wire.py``.
"""

from __future__ import annotations

from datetime import datetime, timezone

from localrun.backends.base import Constraint, SamplingParams, Stats
from localrun.server.errors import RequestError
from localrun.server.wire import finish_reason, message_dict, set_sampling_fields, speculative_usage

# ---------------------------------------------------------------------------------------------- requests


def messages_from_ollama(msgs) -> list[dict]:
    """Ollama /api/chat messages → the chat template's message dicts (``wire.message_dict``; ``thinking`` is
    the earlier turn's thinking). They take everything the OpenAI route takes; missing content is empty text,
    as in Ollama."""
    return [message_dict(m, i) for i, m in enumerate(msgs)]


def format_constraint(fmt) -> Constraint | None:
    """Ollama's ``format``: ``"json"`` (any JSON object) or a JSON Schema → a checked ``Constraint``; ""
    or None → None. Raises ConstraintError for what cannot be enforced."""
    from localrun.constrain import check

    if fmt == "json":
        c = Constraint("json_object", param="format")
    elif isinstance(fmt, dict):
        c = Constraint("json_schema", fmt, param="format")
    else:
        return None
    check(c)
    return c


def sampling_from_ollama(opts, fmt, *, stop_loops: bool = False) -> SamplingParams:
    """Ollama ``options`` + ``format`` → ``SamplingParams`` (``num_predict`` -1/-2/None = unlimited;
    ``format`` → ``constraint``, see ``format_constraint``)."""
    p = SamplingParams(stop_loops=stop_loops)
    if opts is not None:
        set_sampling_fields(p, opts)
        if opts.num_predict is not None and opts.num_predict > 0:
            p.max_tokens = opts.num_predict
        elif opts.num_predict == 0:
            raise RequestError("options.num_predict must be > 0 (or -1 for unlimited)", param="options.num_predict")
        p.stop = [s for s in (opts.stop or []) if s]
    p.constraint = format_constraint(fmt)
    return p


# ---------------------------------------------------------------------------------------------- replies


def ollama_now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def ollama_final_fields(stats: Stats | None, finish: str | None, t_total_s: float) -> dict:
    """Ollama's closing fields; durations are nanoseconds (api/types.go ``Metrics``). ``prompt_eval_count``
    is the prompt's length in tokens, cached or not (as OpenAI's ``prompt_tokens``); the part whose KV came
    from the prefix cache is localrun's extension ``prompt_cached_count`` (Ollama's format has no such
    figure; OpenAI's is ``prompt_tokens_details.cached_tokens``)."""
    s = stats or Stats()
    ns = lambda x: int(x * 1e9)  # noqa: E731
    out = {"done": True, "done_reason": finish_reason(finish) or "stop", "total_duration": ns(t_total_s),
           "load_duration": 0, "prompt_eval_count": s.prompt_tokens, "prompt_cached_count": s.cached_tokens,
           "prompt_eval_duration": ns(s.prefill_s), "eval_count": s.completion_tokens,
           "eval_duration": ns(s.decode_s)}
    if s.draft_tokens:  # localrun's extension, as OpenAI's ``usage.speculative``
        out["speculative"] = speculative_usage(s)
    return out


def ollama_details(spec) -> dict:
    """Ollama's ``details`` object for a GGUF ``spec`` or a ``FolderFacts`` (an MLX folder)."""
    n = spec.n_params
    size = "" if not n else f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
    fmt = getattr(spec, "format", "gguf")
    return {"parent_model": "", "format": fmt, "family": spec.arch, "families": [spec.arch],
            "parameter_size": size, "quantization_level": spec.file_type}


def ollama_model_entry(name: str, spec, path: str, mtime_s: float) -> dict:
    return {"name": name, "model": name,
            "modified_at": datetime.fromtimestamp(mtime_s, timezone.utc).isoformat().replace("+00:00", "Z"),
            "size": spec.file_bytes, "digest": _digest(path, spec.file_bytes), "details": ollama_details(spec)}


def _digest(path: str, size: int) -> str:
    import hashlib

    return hashlib.sha256(f"{path}:{size}".encode()).hexdigest()
