"""What `localrun fit`, `show` and `ps` report about a model: MODEL → the planner's candidates and plans on
a machine (``plan_model_here``, the one planning path of `fit` and `show`); catalog facts + file header + a
fit summary (``show_info``); and what a running `localrun serve` has loaded (its ``GET /api/ps``, Ollama's
format plus localrun fields)."""

from __future__ import annotations

import json
from dataclasses import asdict

from localrun.errors import ConfigError, ModelNotFoundError


def show_info(model: str, hardware=None) -> dict:
    """``{"name", "catalog", "file", "fit", "summary"}`` for MODEL, plus ``capabilities`` when the file is on
    disk (``model.capabilities.Capabilities.to_dict``: from its header and its own chat template).

    ``catalog``: the models.toml entry; ``file``: the GGUF header summary when the model is on disk
    (pulled, found in another tool's folder, or a path), with ``complete`` False when its tensor data is
    cut short; ``fit``: the planner's answer for this machine — the same plans, sizes and speeds as
    `localrun fit` (``plan_model_here`` with ``measurements.planner_measurement``), one
    row per quantization, and the quantization `localrun pull` would choose; ``summary``: the readable
    rows `localrun show` prints, ``[[label, text], …]``. ``hardware`` None = this machine (measured
    speeds apply); a given profile describes another machine. Raises ModelNotFoundError when MODEL is
    none of these.
    """
    from localrun.machine.measurements import planner_measurement
    from localrun.model.catalog import get_entry
    from localrun.store.resolve import resolve_model

    entry = get_entry(model) if "/" not in model and not model.endswith(".gguf") else None
    path = None
    try:
        path = resolve_model(model)
    except ModelNotFoundError:
        if entry is None:
            raise
    info: dict = {"name": entry.name if entry else model, "catalog": None, "file": None, "fit": None}
    if entry:
        info["catalog"] = {k: v for k, v in asdict(entry).items() if k != "sources"}
        info["catalog"]["sources"] = {q: (s.get("repo", "") + ("/" + s["file"] if "file" in s else ""))
                                      for q, s in entry.sources.items()}
    spec = None
    if path is not None and path.is_file():
        from localrun.model.gguf_info import read_gguf

        spec = read_gguf(path)
        s = spec.summary()
        info["file"] = {"path": str(path), "quant": spec.file_type, "size_bytes": spec.file_bytes,
                        "complete": not spec.truncated, "expected_bytes": spec.expected_file_bytes,
                        **{k: s[k] for k in ("architecture", "n_params", "n_layer", "n_ctx_train") if k in s}}
        from localrun.model.capabilities import capabilities

        info["capabilities"] = capabilities(spec, spec.chat_template).to_dict()
    meas = planner_measurement("llamacpp") if hardware is None else None
    if hardware is None:
        from localrun.machine.hardware import probe_hardware

        hardware = probe_hardware()
    _, chosen, plans = plan_model_here(str(path) if spec is not None else entry.name, hardware, measurement=meas)
    info["fit"] = _fit_info(chosen, plans, hardware)
    if entry and entry.quants:
        info["fit"].update(_pull_choice(entry, hardware, meas))
    info["summary"] = summary_rows(info, spec, entry)
    return info


def candidates(model):
    """MODEL → (title, [Candidate]) — the file first (source "file"), or a catalog entry's quant ladder.
    Raises ModelNotFoundError / ModelFormatError."""
    from pathlib import Path

    from localrun.errors import ModelNotFoundError
    from localrun.model.catalog import get_entry
    from localrun.model.gguf_info import read_gguf
    from localrun.model.synthetic import requantize, spec_from_entry, supported_quants
    from localrun.offload.choose import DEFAULT_LADDER, Candidate
    from localrun.store.resolve import resolve_model

    entry = None
    path = None
    try:
        path = resolve_model(model)
    except ModelNotFoundError:
        entry = get_entry(model) if model else None
        if entry is None:
            raise
    if path is not None and Path(path).is_file():
        spec = read_gguf(path)
        out = [Candidate(spec.file_type, spec, "file")]
        for q in DEFAULT_LADDER:
            if q != spec.file_type:
                out.append(Candidate(q, requantize(spec, q), "other quantization (not downloaded)"))
        from localrun.store.resolve import display_name

        return display_name(path), out
    if path is not None:
        raise ModelNotFoundError(str(path), hint="`localrun fit` plans GGUF files and models.toml names")
    want = model.split(":", 1)[1].upper() if ":" in model else None
    quants = [q for q in entry.quants if q.upper() in supported_quants()] or DEFAULT_LADDER
    if want:
        if want not in supported_quants():
            raise ModelNotFoundError(model, hint=f"{entry.name} quantizations: {', '.join(quants)}")
        quants = [want]
    return entry.name, [Candidate(q, spec_from_entry(entry, q), "catalog") for q in quants]


def plan_model_here(model, hw, *, n_ctx=None, n_parallel=1, kv_type=None, flash_attn=None, goal="balanced",
                    measurement=None):
    """(title, chosen Plan or None, every Plan) for MODEL on ``hw``: what `fit` prints and `show` sums up.

    A file is planned as it is (its quantization), with the other quantizations as alternatives; a
    catalog name chooses among its quantizations. Raises ModelNotFoundError / ModelFormatError /
    ConfigError."""
    from localrun.offload.choose import choose

    title, cands = candidates(model)
    kw = dict(n_parallel=n_parallel, kv_type=kv_type, flash_attn=flash_attn, measurement=measurement)
    file_cands = [c for c in cands if c.source == "file"]
    if file_cands:
        chosen, plans = choose(file_cands, hw, goal=goal, n_ctx=n_ctx, **kw)
        _, others = choose([c for c in cands if c.source != "file"], hw, goal=goal, n_ctx=n_ctx, **kw)
        plans += others
        if chosen is not None:  # a given file has one quantization: say so, and what a download would give
            chosen.reasons[0] = (f"{chosen.quant} (KL-divergence ≈ {chosen.quality_kld:g}): the quantization of "
                                 "this file")
            better = [p for p in others if p.fits and p.quality_kld < chosen.quality_kld
                      and not p.disk_backed_bytes and p.decode_tok_s >= 5]
            if better:
                b = better[0]
                chosen.reasons.insert(1, f"{b.quant} would also fit here, with better quality "
                                         f"(≈ {b.decode_tok_s:.0f} tok/s): another file to download")
    else:
        chosen, plans = choose(cands, hw, goal=goal, n_ctx=n_ctx, **kw)
    return title, chosen, plans


def _fit_info(chosen, plans, hardware) -> dict:
    best = chosen or plans[0]
    keys = ("quant", "n_ctx", "n_gpu_layers", "kv_type", "weights_bytes", "vram_bytes", "ram_bytes",
            "disk_backed_bytes", "decode_tok_s", "prefill_tok_s", "speed_source", "reasons", "warnings")
    return {"machine": hardware.label or "this machine", "fits": chosen is not None,
            **{k: getattr(best, k) for k in keys},
            "quants": {p.quant: {"weights_bytes": p.weights_bytes, "fits": p.fits, "decode_tok_s": p.decode_tok_s,
                                 "source": p.source} for p in plans}}


def _pull_choice(entry, hardware, meas) -> dict:
    """What `localrun pull NAME` would download here: the planner's choice among the catalog quants."""
    from localrun.model.synthetic import spec_from_entry, supported_quants
    from localrun.offload.choose import Candidate, choose

    ok = set(supported_quants())
    cands = [Candidate(q, spec_from_entry(entry, q), "catalog") for q in entry.quants if q.upper() in ok]
    chosen, _ = choose(cands, hardware, measurement=meas) if cands else (None, [])
    if chosen is None:
        return {"pull_would_choose": None, "reason": "no quantization fits this machine"}
    return {"pull_would_choose": chosen.quant, "reason": chosen.reasons[0]}


def summary_rows(info: dict, spec=None, entry=None) -> list[list[str]]:
    """The readable `localrun show` table: [[label, text], …] (sizes and speeds as `fit` prints them)."""
    from localrun.machine.hardware import fmt_bytes

    rows: list[list[str]] = []
    src = spec or entry
    if src is not None:
        arch = spec.arch if spec else entry.arch
        n_params = spec.n_params if spec else entry.params_total
        trained = spec.n_ctx_train if spec else entry.n_ctx_train
        rows.append(["model", f"{info['name']}: {arch}, {n_params / 1e9:.2f}B parameters, "
                              f"{spec.n_layer if spec else entry.n_layer} layers, trained for {trained:,} tokens"])
    f = info.get("file")
    if f:
        state = ("complete" if f["complete"] else
                 f"INCOMPLETE: {fmt_bytes(f['size_bytes'])} of {fmt_bytes(f['expected_bytes'])} "
                 f"({f['size_bytes'] / f['expected_bytes']:.0%}); it cannot be loaded until the download completes")
        rows.append(["file", f"{f['path']} ({f['quant']}, {fmt_bytes(f['size_bytes'])}, {state})"])
    if spec is not None:
        from localrun.model.capabilities import capabilities

        rows.append(["capabilities", capabilities(spec, spec.chat_template).line()])
    c = info.get("catalog")
    if c:
        rows.append(["catalog", f"{c.get('family', '')} · license {c.get('license', '?')} · quantizations "
                                f"{' '.join(entry.quants if entry else [])}"])
    fit = info["fit"]
    where = fit["machine"]
    if fit["fits"]:
        place = (f"{fit['n_gpu_layers']} GPU layers, VRAM {fmt_bytes(fit['vram_bytes'])}, " if fit["vram_bytes"]
                 else "CPU, ")
        paged = (f", {fmt_bytes(fit['disk_backed_bytes'])} of weights read from disk every token"
                 if fit["disk_backed_bytes"] else "")
        rows.append([f"on {where}", f"{fit['quant']} fits: {fit['n_ctx']:,}-token context, {place}RAM "
                     f"{fmt_bytes(fit['ram_bytes'])}{paged}; decode ≈ {_rate(fit['decode_tok_s'])} tok/s, prefill ≈ "
                     f"{_rate(fit['prefill_tok_s'])} tok/s ({fit['speed_source'] or 'table'} speeds)"])
    else:
        rows.append([f"on {where}", f"{fit['quant']} does not fit: " + "; ".join(
            r for r in fit["reasons"] if r.startswith("does not fit")).removeprefix("does not fit: ")])
    for w in fit["warnings"]:
        rows.append(["warning", w])
    rows.append(["quantizations", "  ".join(
        f"{q} {fmt_bytes(x['weights_bytes'])} " + (f"{_rate(x['decode_tok_s'])} tok/s" if x["fits"] else "too big")
        for q, x in fit["quants"].items())])
    if fit.get("pull_would_choose"):
        rows.append(["pull would choose", fit["reason"]])
    return rows


def _rate(tok_s: float) -> str:
    """A speed as `fit` prints it, with enough digits for a slow one (0.04, 1.3, 22)."""
    return f"{tok_s:.2f}" if tok_s < 1 else (f"{tok_s:.1f}" if tok_s < 10 else f"{tok_s:.0f}")


def server_ps(host: str | None = None, port: int | None = None, timeout_s: float = 3.0,
              api_key: str | None = None) -> dict:
    """``{"running": bool, "url": str, "models": [...]}`` from ``GET /api/ps`` of a localrun server.

    ``running`` is False (no exception) when nothing listens at host:port. Raises ConfigError when the
    server refuses the API key (401/403).
    """
    import urllib.error
    import urllib.request

    from localrun.config import get_settings

    st = get_settings()
    host = host or st.host
    port = port or st.port
    url = f"http://{host}:{port}"
    req = urllib.request.Request(url + "/api/ps")
    key = api_key or st.api_key
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            data = json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise ConfigError(f"the server at {url} refused the request ({e.code})",
                              hint="pass --api-key (or set LOCALRUN_API_KEY) with the key the server was "
                              "started with") from None
        if e.code == 404:
            raise ConfigError(f"the server at {url} has no /api/ps: is it a localrun server?",
                              hint="point --host/--port (or LOCALRUN_PORT) at `localrun serve`") from None
        raise ConfigError(f"the server at {url} answered {e.code} to /api/ps") from None
    except (urllib.error.URLError, OSError, ValueError):
        return {"running": False, "url": url, "models": []}
    return {"running": True, "url": url, "models": data.get("models", []),
            **{k: v for k, v in data.items() if k != "models"}}
