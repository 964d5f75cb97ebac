"""Run a bench: load (or reach) the model, run every concurrency level, assemble the report dict.

The report (``--json``) has a stable schema, ``SCHEMA`` = "localrun.bench/1"::

    {"schema", "mode": "in-process"|"http", "target": {model, path|url, backend, endpoint},
     "workload": Workload.to_dict(), "hardware": HardwareProfile.to_dict(), "plan": Plan.to_dict()|null,
     "slo": {ttft_s, tpot_s}, "levels": [summarize_level(...) + {peak_rss_bytes, peak_vram_bytes, energy}],
     "predicted_vs_measured": {prefill_tok_s|decode_tok_s|ram_bytes|vram_bytes: {predicted, measured, ratio}}
                              | null (HTTP), "calibration": {...}|null, "started": ISO-8601 UTC}
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from localrun.bench.metrics import ratio, summarize_level
from localrun.bench.monitor import Monitor, energy_summary, server_pid
from localrun.bench.workload import Workload, iter_requests

SCHEMA = "localrun.bench/1"


@dataclass
class BenchOptions:
    """Everything but the workload. ``url`` set = HTTP mode; else in-process on ``model``."""

    model: str | None = None
    url: str | None = None
    model_name: str | None = None
    api_key: str | None = None
    endpoint: str = "completions"
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    price_kwh: float | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    calibrate: bool = False
    warmup: bool = True
    server_pid: int | None = None
    spec_mode: str = "off"  # speculative decoding in-process (llama.cpp): auto | ngram | draft | off (not exact yet)
    draft_model: str | None = None
    draft_max: int | None = None
    rpc: str | None = None  # RPC workers host:port,… for the in-process engine (backends/llamacpp/rpc.py)


def needed_ctx(w: Workload) -> int:
    """Per-sequence context for the workload: prompt + output + a little, rounded up to 256 tokens."""
    n = w.prompt_tokens + w.max_tokens + 16
    return (n + 255) // 256 * 256


def run_bench(w: Workload, opts: BenchOptions, *, on_level_start: Callable | None = None,
              on_result: Callable | None = None) -> dict:
    """Run ``w`` and return the report dict. Raises LocalrunError for bad input or an unreachable server.

    ``on_level_start(concurrency, n_requests | None)`` and ``on_result(RequestResult)`` feed a progress display.
    """
    from localrun.machine.hardware import probe_hardware

    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    from localrun.backends import hardware_for

    hw = (hardware_for(opts.rpc) if opts.rpc and not opts.url else None) or probe_hardware()
    engine = plan = spec = None
    if opts.url:
        from localrun.bench.clients import HttpClient

        client = HttpClient(opts.url, model=opts.model_name, api_key=opts.api_key, endpoint=opts.endpoint)
        target = {"url": client.base, "model": client.model, "endpoint": opts.endpoint, "backend": None}
        pid = opts.server_pid or server_pid(opts.url)
        target["server_on_this_machine"] = _is_loopback(client.base)  # else "hardware" is the client's
        mode = "http"
    else:
        from localrun.bench.clients import EngineClient
        from localrun.loading import load_model
        from localrun.store.resolve import display_name

        loaded = load_model(opts.model, backend="llamacpp", n_ctx=max(opts.n_ctx or 0, needed_ctx(w)),
                            n_parallel=max(w.concurrency), n_threads=opts.n_threads, spec_mode=opts.spec_mode,
                            draft_model=opts.draft_model, draft_max=opts.draft_max,
                            hardware=hw if opts.rpc else None)
        engine, plan, spec = loaded.engine, loaded.plan, loaded.spec
        client = EngineClient(engine)
        target = {"path": engine.model_path, "model": display_name(engine.model_path), "backend": plan.backend,
                  "endpoint": None}
        pid, mode = None, "in-process"
    try:
        if opts.warmup:
            client.warmup(w)
        levels = []
        for li, c in enumerate(w.concurrency):
            if on_level_start:
                on_level_start(c, None if w.duration_s else w.requests_for(c))
            reqs = iter_requests(w, c, li, tokenizer=client.tokenize if engine is not None else None)
            with Monitor(pid=pid) as mon:
                results, t0, t1 = client.run_level(reqs, c, w, on_result)
            level = summarize_level(results, c, t0, t1, slo_ttft_s=opts.slo_ttft_s, slo_tpot_s=opts.slo_tpot_s)
            res = mon.result()
            level["peak_rss_bytes"] = res["peak_rss_bytes"] if pid or engine is not None else None
            level["peak_vram_bytes"] = res["peak_vram_bytes"]
            level["rss_of"] = "this process" if engine is not None else (f"server pid {pid}" if pid else None)
            level["energy"] = energy_summary(res["energy_j"], level["completion_tokens"], opts.price_kwh,
                                             res["energy_source"], res["energy_note"])
            levels.append(level)
        report = {"schema": SCHEMA, "mode": mode, "target": target, "workload": w.to_dict(),
                  "hardware": hw.to_dict(), "plan": plan.to_dict() if plan is not None else None,
                  "slo": {"ttft_s": opts.slo_ttft_s, "tpot_s": opts.slo_tpot_s}, "levels": levels,
                  "predicted_vs_measured": None, "calibration": None, "started": started}
        specu = getattr(engine, "speculation", None)
        report["speculation"] = specu.totals() if specu is not None else None  # drafted/accepted, in-process
        if plan is not None:
            report["predicted_vs_measured"] = predicted_vs_measured(plan, levels)
            if opts.calibrate:
                report["calibration"] = calibrate(spec, plan, hw, w, levels)
        return report
    finally:
        if engine is not None:
            engine.close()


def _single_stream(levels: list[dict]) -> dict:
    """The level closest to one stream (concurrency 1 when it ran): the planner predicts one stream."""
    return min(levels, key=lambda lv: lv["concurrency"])


def predicted_vs_measured(plan, levels: list[dict]) -> dict:
    lv = _single_stream(levels)
    peak_rss = max((x["peak_rss_bytes"] or 0 for x in levels), default=0) or None
    vram = [x["peak_vram_bytes"] for x in levels if x["peak_vram_bytes"] is not None]
    return {
        "concurrency": lv["concurrency"],
        "prefill_tok_s": ratio(plan.prefill_tok_s or None, lv["prefill_tok_s"]),
        "decode_tok_s": ratio(plan.decode_tok_s or None, lv["decode_tok_s"]),
        "ram_bytes": ratio(plan.ram_bytes or None, peak_rss),
        "vram_bytes": ratio(plan.vram_bytes or None, max(vram) if vram else None),
    }


def calibrate(spec, plan, hw, w: Workload, levels: list[dict]) -> dict:
    """Store effective bandwidth/compute from the single-stream level (see ``calibrate.py``)."""
    from localrun.bench.calibrate import calibration_values, device_of, save_calibration

    lv = _single_stream(levels)
    # the median request's decode rate (1 / P50 TPOT): a stall caused by another process on a shared
    # machine moves the mean, not the median
    tpot50 = lv["tpot_s"]["p50"]
    decode = 1.0 / tpot50 if tpot50 else lv["decode_tok_s"]
    values = calibration_values(spec, plan, decode_tok_s=decode, prefill_tok_s=lv["prefill_tok_s"])
    entry = save_calibration(plan, values, spec.name, hw)
    return {**values, "key": f"{plan.backend}/{device_of(plan, hw)}", "stored": entry, "decode_tok_s": decode,
            "from_concurrency": lv["concurrency"]}


def _is_loopback(url: str) -> bool:
    from urllib.parse import urlparse

    return urlparse(url).hostname in ("127.0.0.1", "localhost", "::1")
