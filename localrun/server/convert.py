"""Pure converters between the wire formats (``schemas.py``) and the engine's data (``backends/base.py``).

No I/O, no engine, no globals: request → (message dicts, ``SamplingParams``, grammar), and engine
``Chunk``/``Stats`` → OpenAI / Ollama response dicts. Durations in Ollama's format are nanoseconds.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from localrun.backends.base import Constraint, SamplingParams, Stats, TokenLogprob
from localrun.server.errors import RequestError

# ---------------------------------------------------------------------------------------------- requests


def _content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text for p in content)


def messages_from_openai(msgs) -> list[dict]:
    """OpenAI messages → the chat template's message dicts: role (``developer`` → ``system``), content (text
    parts joined; null → ""), and where present name, tool_calls (arguments as sent: string or object),
    tool_call_id and reasoning_content (an earlier turn's thinking: ``reasoning_content`` or ``reasoning``).

    Raises RequestError on an empty list or a user/system message without content.
    """
    if not msgs:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    for i, m in enumerate(msgs):
        if m.content is None and m.role in ("system", "developer", "user"):
            raise RequestError(f"messages[{i}] ({m.role}) has no content", param=f"messages.{i}.content")
    return [_message_dict(m) for m in msgs]


def messages_from_ollama(msgs) -> list[dict]:
    """Ollama /api/chat messages → message dicts (as ``messages_from_openai``; ``thinking`` is the earlier
    turn's thinking). They take everything the OpenAI route takes; missing content is empty text, as in
    Ollama."""
    return [_message_dict(m) for m in msgs]


def _message_dict(m) -> dict:
    d: dict = {"role": "system" if m.role == "developer" else m.role, "content": _content_text(m.content)}
    if m.name:
        d["name"] = m.name
    if m.tool_calls:
        d["tool_calls"] = m.tool_calls
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    thinking = m.reasoning_content or m.reasoning or getattr(m, "thinking", None)
    if thinking:
        d["reasoning_content"] = thinking
    return d


def constraint_for(req) -> tuple[Constraint | None, str | None]:
    """A request's structured-output fields → (``Constraint`` for llguidance, or None; GBNF for llama.cpp's
    own grammar sampler, or None). At most one of: OpenAI ``response_format`` (``json_object``,
    ``json_schema`` with ``strict``, llama-server's ``{"type": "json_object", "schema": ...}``), llama-server's
    ``json_schema`` and ``grammar`` (GBNF, converted to llguidance's Lark; one llguidance cannot take goes to
    llama.cpp's grammar sampler, llama.cpp backend only), localrun's ``regex``. Checked here, so what cannot
    be enforced is a 400 before anything runs (``ConstraintError``: keyword and JSON Pointer).

    ``strict`` does not change enforcement: a schema is always enforced exactly or refused.
    Raises RequestError when two are given or a json_schema has no schema, ConstraintError."""
    from localrun.constrain import check, gbnf_to_lark
    from localrun.errors import ConstraintError

    rf = getattr(req, "response_format", None)
    given = [(name, v) for name, v in (("response_format", rf if rf is not None and rf.type != "text" else None),
                                       ("json_schema", getattr(req, "json_schema", None)),
                                       ("grammar", getattr(req, "grammar", None) or None),
                                       ("regex", getattr(req, "regex", None) or None)) if v is not None]
    if len(given) > 1:
        raise RequestError(f"{given[0][0]} and {given[1][0]} both constrain the output: send one",
                           param=given[1][0])
    if not given:
        return None, None
    field, value = given[0]
    if field == "response_format":
        c = _response_format_constraint(value)
    elif field == "json_schema":
        c = Constraint("json_schema", value, param="json_schema")
    elif field == "regex":
        c = Constraint("regex", value, param="regex")
    else:
        try:
            c = Constraint("lark", gbnf_to_lark(value, param="grammar"), param="grammar")
            check(c)
        except ConstraintError:
            return None, value  # llama.cpp's grammar sampler reads it (or says it does not parse)
        return c, None
    check(c)
    return c, None


def _response_format_constraint(rf) -> Constraint:
    if rf.type == "json_object":
        if rf.schema_ is not None:  # llama-server: {"type": "json_object", "schema": {...}}
            return Constraint("json_schema", rf.schema_, param="response_format.schema")
        return Constraint("json_object", param="response_format")
    js = rf.json_schema
    if js is None or js.schema_ is None:
        raise RequestError("response_format json_schema needs json_schema.schema",
                           param="response_format.json_schema",
                           hint='send {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}')
    return Constraint("json_schema", js.schema_, param="response_format.json_schema.schema")


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


def _logit_bias(raw: dict | None) -> dict[int, float]:
    out = {}
    for k, v in (raw or {}).items():
        try:
            out[int(k)] = max(-100.0, min(100.0, float(v)))
        except (TypeError, ValueError):
            raise RequestError(f"logit_bias key {k!r} is not a token id", param="logit_bias") from None
    return out


_PENALTY_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                   "repeat_penalty", "repeat_last_n", "dry_multiplier", "dry_base", "dry_allowed_length",
                   "dry_penalty_last_n", "stop_loops")


def sampling_from_openai(req, *, max_tokens: int | None, logprobs: int | None,
                         stop_loops: bool = False) -> SamplingParams:
    """OpenAI sampling fields → ``SamplingParams``; unset fields keep llama.cpp's defaults (no DRY, no
    repeat penalty) and ``stop_loops`` (``serve --stop-loops``) unless the request sets it. The
    structured-output fields become ``constraint`` / ``grammar`` (``constraint_for``)."""
    if req.n != 1:
        raise RequestError("n > 1 is not supported: send separate requests (they are batched together)",
                           param="n", code="unsupported_value")
    constraint, grammar = constraint_for(req)
    p = SamplingParams(max_tokens=max_tokens, stop=list(req.stop or []), logprobs=logprobs, grammar=grammar,
                       logit_bias=_logit_bias(req.logit_bias), ignore_eos=bool(req.ignore_eos),
                       stop_loops=stop_loops, constraint=constraint)
    for f in _PENALTY_FIELDS:
        v = getattr(req, f)
        if v is not None:
            setattr(p, f, v)
    return p


def sampling_from_ollama(opts, fmt, *, stop_loops: bool = False) -> SamplingParams:
    """Ollama ``options`` + ``format`` → ``SamplingParams`` (``num_predict`` -1/-2/None = unlimited;
    ``format`` → ``constraint``, see ``format_constraint``)."""
    p = SamplingParams(stop_loops=stop_loops)
    if opts is not None:
        for f in _PENALTY_FIELDS:
            v = getattr(opts, f)
            if v is not None:
                setattr(p, f, v)
        if opts.num_predict is not None and opts.num_predict > 0:
            p.max_tokens = opts.num_predict
        elif opts.num_predict == 0:
            raise RequestError("options.num_predict must be > 0 (or -1 for unlimited)", param="options.num_predict")
        p.stop = [s for s in (opts.stop or []) if s]
    p.constraint = format_constraint(fmt)
    return p


# ---------------------------------------------------------------------------------------------- OpenAI out


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(stats: Stats | None, reasoning_tokens: int = 0) -> dict:
    """OpenAI ``usage``; ``reasoning_tokens`` (completion tokens spent thinking) are part of
    ``completion_tokens``, as in OpenAI's ``completion_tokens_details``."""
    s = stats or Stats()
    out = {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
           "total_tokens": s.prompt_tokens + s.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
           "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}}
    if s.draft_tokens:  # localrun's extension: speculative decoding's drafted / accepted tokens
        out["speculative"] = {"draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
                              "acceptance_rate": s.acceptance_rate}
    return out


def chat_logprobs(lps: Sequence[TokenLogprob]) -> dict:
    """Engine logprobs → OpenAI chat ``choices[].logprobs`` (``{"content": [...]}``)."""
    return {"content": [
        {"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
         "top_logprobs": [{"token": s, "logprob": v, "bytes": list(s.encode())} for s, v in t.top]}
        for t in lps]}


def completion_logprobs(lps: Sequence[TokenLogprob], text_offset0: int = 0) -> dict:
    """Engine logprobs → legacy completions ``logprobs`` (parallel lists)."""
    offsets, off = [], text_offset0
    for t in lps:
        offsets.append(off)
        off += len(t.token)
    return {"tokens": [t.token for t in lps], "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [dict(t.top) for t in lps], "text_offset": offsets}


def chat_response(rid: str, created: int, model: str, text: str, finish: str, stats: Stats | None,
                  logprobs: list[TokenLogprob] | None = None, tool_calls: list[dict] | None = None, *,
                  thinking: str = "", reasoning_tokens: int = 0) -> dict:
    """A ``chat.completion``. ``thinking`` goes to ``message.reasoning_content`` (llama-server's name) and
    ``message.reasoning`` (Ollama's OpenAI route's), never into ``content``; ``tool_calls`` in OpenAI's
    shape (``openai_tool_call``) set finish_reason ``tool_calls``."""
    msg: dict = {"role": "assistant", "content": text if (text or not tool_calls) else None}
    if thinking:
        msg["reasoning_content"] = msg["reasoning"] = thinking
    if tool_calls:
        msg["tool_calls"] = tool_calls
        finish = "tool_calls"
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": msg, "finish_reason": _finish(finish),
                         "logprobs": chat_logprobs(logprobs) if logprobs is not None else None}],
            "usage": usage(stats, reasoning_tokens)}


def openai_tool_call(call_id: str, name: str, arguments: str) -> dict:
    """One entry of OpenAI's ``message.tool_calls``: ``arguments`` is the JSON **string**."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_chunk(rid: str, created: int, model: str, delta: dict, finish: str | None = None,
               logprobs: list[TokenLogprob] | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": _finish(finish),
                         "logprobs": chat_logprobs(logprobs) if logprobs else None}]}


def usage_chunk(rid: str, created: int, model: str, stats: Stats | None, obj: str, reasoning_tokens: int = 0) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(stats, reasoning_tokens)}


def completion_response(rid: str, created: int, model: str, text: str, finish: str | None,
                        stats: Stats | None, logprobs: dict | None = None, *, obj: str = "text_completion") -> dict:
    d = {"id": rid, "object": obj, "created": created, "model": model,
         "choices": [{"index": 0, "text": text, "finish_reason": _finish(finish), "logprobs": logprobs}]}
    if stats is not None:
        d["usage"] = usage(stats)
    return d


def _finish(reason: str | None) -> str | None:
    """localrun's finish reasons on OpenAI's wire: a cancelled or loop-stopped generation is "stop" (the
    loop shows in the log and in /metrics' finish_reason label)."""
    return "stop" if reason in ("cancelled", "loop") else reason


def sse(obj) -> str:
    """One Server-Sent Event carrying ``obj`` as JSON (OpenAI's stream framing)."""
    return "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n"


# ---------------------------------------------------------------------------------------------- Ollama out


def ollama_now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def ollama_final_fields(stats: Stats | None, finish: str | None, t_total_s: float) -> dict:
    """Ollama's closing fields; durations are nanoseconds (api/types.go ``Metrics``)."""
    s = stats or Stats()
    ns = lambda x: int(x * 1e9)  # noqa: E731
    out = {"done": True, "done_reason": _finish(finish) or "stop", "total_duration": ns(t_total_s),
           "load_duration": 0, "prompt_eval_count": s.prompt_tokens - s.cached_tokens,
           "prompt_eval_duration": ns(s.prefill_s), "eval_count": s.completion_tokens,
           "eval_duration": ns(s.decode_s)}
    if s.draft_tokens:  # localrun's extension, as in OpenAI ``usage.speculative``
        out["speculative"] = usage(s)["speculative"]
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


@dataclass
class FolderFacts:
    """What the Ollama routes show of a model that has no GGUF header: an MLX folder (config.json +
    *.safetensors, the mlx-community layout). Sizes in bytes, lengths in tokens; 0 where unknown."""

    arch: str = "unknown"
    name: str = ""
    n_params: int = 0
    file_type: str = ""
    file_bytes: int = 0
    n_ctx_train: int = 0
    n_layer: int = 0
    n_embd: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    format: str = "mlx"


def folder_facts(path: str) -> FolderFacts:
    """``FolderFacts`` from an MLX folder's config.json (Hugging Face config names); never raises."""
    p = Path(path)
    try:
        cfg = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    if not isinstance(cfg, dict):
        cfg = {}
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    q = cfg.get("quantization") or cfg.get("quantization_config") or {}
    bits = q.get("bits") if isinstance(q, dict) else None
    try:
        size = sum(f.stat().st_size for f in p.glob("*.safetensors"))
    except OSError:
        size = 0

    def num(key: str) -> int:
        v = text.get(key, cfg.get(key))
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    return FolderFacts(arch=str(text.get("model_type") or cfg.get("model_type") or "unknown"), name=p.name,
                       file_type=f"{bits}-bit" if bits else str(cfg.get("torch_dtype") or ""), file_bytes=size,
                       n_ctx_train=num("max_position_embeddings"), n_layer=num("num_hidden_layers"),
                       n_embd=num("hidden_size"), n_head=num("num_attention_heads"),
                       n_head_kv=num("num_key_value_heads") or num("num_attention_heads"))


def _digest(path: str, size: int) -> str:
    import hashlib

    return hashlib.sha256(f"{path}:{size}".encode()).hexdigest()


def now_s() -> int:
    return int(time.time())
