"""What `localrun show` and `localrun ps` report: catalog facts + file header + a fit summary, and what a
running `localrun serve` has loaded (its ``GET /api/ps``, Ollama's format plus localrun fields)."""

from __future__ import annotations

import json
from dataclasses import asdict

from localrun.errors import ConfigError, ModelNotFoundError


def show_info(model: str, hardware=None) -> dict:
    """``{"name", "catalog": {...} | None, "file": {...} | None, "fit": {...}}`` for MODEL.

    ``catalog``: the models.toml entry; ``file``: the GGUF header summary when the model is on disk
    (pulled, found in another tool's folder, or a path); ``fit``: per catalog quantization, its size
    (hub-free estimate: params × bits-per-weight) and whether size + 20% fits this machine's VRAM or RAM,
    and the quantization `localrun pull` would choose. Raises ModelNotFoundError when MODEL is none of these.
    """
    from localrun.catalog import estimate_file_bytes, get_entry
    from localrun.store import resolve_model

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
    if path is not None and path.is_file():
        from localrun.gguf_info import read_gguf

        spec = read_gguf(path)
        s = spec.summary()
        info["file"] = {"path": str(path), "quant": spec.file_type, "size_bytes": spec.file_bytes,
                        "complete": not spec.truncated,
                        **{k: s[k] for k in ("arch", "n_params", "n_layer", "n_ctx_train") if k in s}}
    if hardware is None:
        from localrun.hardware import probe_hardware

        hardware = probe_hardware()
    from localrun.hardware import fmt_bytes
    from localrun.pull import FIT_MARGIN, RemoteFile, choose_quant, memory_budget_bytes

    budget, where = memory_budget_bytes(hardware)
    fit: dict = {"budget_bytes": budget, "budget_in": where, "quants": {}}
    if entry and entry.quants:
        files = []
        for q in entry.quants:
            size = estimate_file_bytes(entry, q)
            fit["quants"][q] = {"est_bytes": size, "fits": size * FIT_MARGIN <= budget}
            files.append(RemoteFile(entry.sources[q]["repo"], entry.sources[q]["file"], q, estimated_bytes=size))
        best, why = choose_quant(files, hardware, entry)
        fit["pull_would_choose"] = best.quant
        fit["reason"] = why
    if info["file"]:
        size = info["file"]["size_bytes"]
        fit["file_fits"] = size * FIT_MARGIN <= budget
        fit["summary"] = (f"{fmt_bytes(size)} + 20% {'fits' if fit['file_fits'] else 'does not fit'} the "
                          f"{fmt_bytes(budget)} of {where} available")
    info["fit"] = fit
    return info


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
