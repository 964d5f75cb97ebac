"""Per-level metrics from ``RequestResult``s: the field's serving numbers, as vLLM's
``benchmarks/benchmark_serving.py`` and the DistServe paper (goodput) define them.

* TTFT — arrival → first token (s). ITL — gap between successive tokens of one stream (s).
  TPOT — (last token − first token) / (output tokens − 1) per request (s). E2E — arrival → last token.
* Throughput — requests/s and output tokens/s over the level's wall time (first arrival → last token);
  total tokens/s adds the prompt tokens.
* Prefill tok/s — Σ prompt tokens actually prefilled (not served from the prefix cache) / Σ (first token
  − taken); decode tok/s — per stream, Σ (output tokens − 1) / Σ (last − first token).
* Goodput — requests/s (and their output tokens/s) of the requests that met every SLO given
  (``ttft ≤ slo_ttft_s`` and ``tpot ≤ slo_tpot_s``); DistServe, Zhong et al., OSDI 2024. Never above
  the throughput, since it counts a subset of the same requests over the same time.
* Prefix-cache hit rate — Σ cached prompt tokens / Σ prompt tokens (None when the server does not say).

Percentiles are linear-interpolated (numpy's default, as vLLM reports them).
"""

from __future__ import annotations

from typing import Sequence

from localrun.bench.clients import RequestResult

PERCENTILES = (50, 95, 99)


def distribution(values: Sequence[float]) -> dict:
    """{'mean', 'min', 'max', 'p50', 'p95', 'p99', 'n'} of ``values``; every value None when empty."""
    vals = sorted(float(v) for v in values if v is not None)
    out: dict = {"n": len(vals)}
    if not vals:
        out.update({"mean": None, "min": None, "max": None, **{f"p{p}": None for p in PERCENTILES}})
        return out
    out["mean"] = sum(vals) / len(vals)
    out["min"], out["max"] = vals[0], vals[-1]
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(vals, p)
    return out


def percentile(sorted_vals: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy.percentile's 'linear' method)."""
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    k = (len(sorted_vals) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def meets_slo(r: RequestResult, slo_ttft_s: float | None, slo_tpot_s: float | None) -> bool:
    if not r.ok:
        return False
    if slo_ttft_s is not None and r.ttft_s > slo_ttft_s:
        return False
    tpot = r.tpot_s
    if slo_tpot_s is not None and tpot is not None and tpot > slo_tpot_s:
        return False
    return True


def summarize_level(results: Sequence[RequestResult], concurrency: int, t0: float, t1: float, *,
                    slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> dict:
    """The metrics of one concurrency level (the ``levels[]`` entries of the JSON report).

    ``t0``/``t1``: the level's start and end (perf_counter seconds).
    """
    ok = [r for r in results if r.ok]
    duration = max(t1 - t0, 1e-9)
    prompt = sum(r.prompt_tokens for r in ok)
    completion = sum(r.completion_tokens for r in ok)
    cached_known = [r for r in ok if r.cached_tokens is not None]
    cached = sum(r.cached_tokens for r in cached_known) if cached_known else None
    prefilled = sum(r.prompt_tokens - (r.cached_tokens or 0) for r in ok)
    prefill_time = sum(r.prefill_s for r in ok)
    decoded = sum(r.completion_tokens - 1 for r in ok if r.completion_tokens > 1 and r.token_times)
    decode_time = sum(r.token_times[-1] - r.t_first for r in ok if r.completion_tokens > 1 and r.token_times)
    good = [r for r in ok if meets_slo(r, slo_ttft_s, slo_tpot_s)]
    itl = [x for r in ok for x in r.itl_s]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_tokens": cached,
        "requests_per_s": len(ok) / duration,
        "output_tok_s": completion / duration,
        "total_tok_s": (prompt + completion) / duration,
        "prefill_tok_s": prefilled / prefill_time if prefill_time > 0 else None,
        "decode_tok_s": decoded / decode_time if decode_time > 0 else None,
        "ttft_s": distribution([r.ttft_s for r in ok]),
        "itl_s": distribution(itl),
        "tpot_s": distribution([r.tpot_s for r in ok]),
        "e2e_s": distribution([r.e2e_s for r in ok]),
        "queue_s": distribution([r.queue_s for r in ok]),
        "goodput": {
            "slo_ttft_s": slo_ttft_s,
            "slo_tpot_s": slo_tpot_s,
            "requests_ok": len(good),
            "fraction": len(good) / len(results) if results else 0.0,
            "requests_per_s": len(good) / duration,
            "output_tok_s": sum(r.completion_tokens for r in good) / duration,
        },
        "prefix_cache_hit_rate": (cached / sum(r.prompt_tokens for r in cached_known)
                                  if cached_known and sum(r.prompt_tokens for r in cached_known) else None),
        "samples": {"ttft_s": [r.ttft_s for r in ok], "tpot_s": [r.tpot_s for r in ok], "itl_s": itl},
        "per_request": [r.to_dict() for r in results],
    }


def ratio(predicted: float | None, measured: float | None) -> dict:
    """{'predicted', 'measured', 'ratio' = measured / predicted} (ratio None when either is missing)."""
    r = measured / predicted if predicted and measured is not None else None
    return {"predicted": predicted, "measured": measured, "ratio": r}
