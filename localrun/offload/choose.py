"""Choosing among quantizations: plan every candidate, rank by published quality loss, apply the goal.

Quality loss is the mean KL-divergence of each llama.cpp quantization against the F16 model, from the
tables llama.cpp publishes with ``llama-perplexity --kl-divergence`` (LLaMA-3-8B, wikitext; e.g. the
k-quant and i-quant PR threads #5076, #5747 and the discussion #5962). Values are approximate and model
dependent; only their ORDER is used to choose.
"""

from __future__ import annotations

from dataclasses import dataclass

from localrun.offload.plan import Plan
from localrun.offload.search import plan_model

KLD = {"F32": 0.0, "F16": 0.0, "BF16": 0.0, "Q8_0": 0.001, "Q6_K": 0.004, "Q5_K_M": 0.008, "Q5_1": 0.010,
       "Q5_K_S": 0.011, "Q5_0": 0.015, "Q4_K_M": 0.025, "IQ4_XS": 0.035, "IQ4_NL": 0.035, "Q4_K_S": 0.040,
       "Q4_1": 0.055, "Q4_0": 0.065, "Q3_K_L": 0.075, "Q3_K_M": 0.10, "IQ3_M": 0.11, "Q3_K_S": 0.20,
       "IQ3_XXS": 0.22, "Q2_K": 0.40, "IQ2_M": 0.45, "IQ2_XS": 0.60, "IQ1_M": 1.2}
DEFAULT_LADDER = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K"]
MIN_DECODE_TOK_S = 5.0  # "balanced": the best quality that still reads at this speed
GOALS = ("balanced", "quality", "speed", "context")


@dataclass
class Candidate:
    quant: str
    spec: object  # ModelSpec (a real file or a synthetic one)
    source: str  # "file" | "catalog" | "other quantization (not downloaded)"


def kld(quant: str) -> float:
    return KLD.get(quant.upper(), 1.0)


def _ctx_ladder(spec, start: int) -> list[int]:
    top = spec.n_ctx_train or start
    out, c = [], max(start, 2048)
    while c < top:
        out.append(c)
        c *= 2
    out.append(top)
    return sorted(set(out), reverse=True)


BALANCED_SPEED_FRACTION = 0.5


def choose(cands: list[Candidate], hw, *, goal: str = "balanced", n_ctx: int | None = None,
           **kw) -> tuple[Plan | None, list[Plan]]:
    """(chosen plan or None when nothing fits, one plan per candidate in quality order).

    goal: ``quality`` = lowest KL-divergence that fits in memory (disk-backed pages avoided when any
    candidate can); ``speed`` = fastest decode among those within Q4_K_M's quality (else fastest);
    ``context`` = the longest context (up to the training context) that fits, best quality among ties;
    ``balanced`` (default) = the best quality that fits and decodes at ≥ half the fastest fitting plan's
    rate (and ≥ 5 tok/s), else the fastest that fits.
    """
    if goal not in GOALS:
        from localrun.errors import ConfigError

        raise ConfigError(f"unknown goal {goal!r}", hint=f"use one of {', '.join(GOALS)}")
    cands = sorted(cands, key=lambda c: kld(c.quant))
    plans = []
    for c in cands:
        ctx = n_ctx
        if goal == "context" and n_ctx is None:
            for ctx_try in _ctx_ladder(c.spec, 4096):
                p = plan_model(c.spec, hw, n_ctx=ctx_try, **kw)
                if p.fits and not p.disk_backed_bytes and (not hw or not hw.gpus or p.n_gpu_layers > c.spec.n_layer):
                    break
        else:
            p = plan_model(c.spec, hw, n_ctx=ctx, **kw)
        p.quant = c.quant
        p.source = c.source
        p.quality_kld = kld(c.quant)
        plans.append(p)
    fit = [p for p in plans if p.fits]
    if not fit:
        return None, plans
    ram_ok = [p for p in fit if not p.disk_backed_bytes] or fit
    if goal == "quality":
        chosen = ram_ok[0]
        why = "best quality that fits"
    elif goal == "speed":
        good = [p for p in ram_ok if p.quality_kld <= KLD["Q4_K_M"]] or ram_ok
        chosen = max(good, key=lambda p: p.decode_tok_s)
        why = "fastest decode within Q4_K_M's quality"
    elif goal == "context":
        chosen = max(ram_ok, key=lambda p: (p.n_ctx, -p.quality_kld))
        why = f"longest context that fits ({chosen.n_ctx} tokens)"
    else:
        # balanced: the best quality among the plans at least half as fast as the fastest one that fits
        # (and ≥ MIN_DECODE_TOK_S), so a slightly better quant never costs a partial offload that halves speed
        top = max(p.decode_tok_s for p in ram_ok)
        floor = max(MIN_DECODE_TOK_S, top * BALANCED_SPEED_FRACTION)
        fast = [p for p in ram_ok if p.decode_tok_s >= floor]
        chosen = fast[0] if fast else max(ram_ok, key=lambda p: p.decode_tok_s)
        why = (f"best quality that fits and decodes ≥ {floor:.0f} tok/s (half the fastest plan's "
               f"{top:.0f}, at least {MIN_DECODE_TOK_S:g})" if fast
               else f"nothing reaches {MIN_DECODE_TOK_S:g} tok/s here: the fastest that fits")
    chosen.reasons.insert(0, f"{chosen.quant} (KL-divergence ≈ {chosen.quality_kld:g}): {why}")
    _compare_with_local(chosen, cands, hw, n_ctx, kw)
    return chosen, plans


def _compare_with_local(chosen: Plan, cands: list[Candidate], hw, n_ctx, kw) -> None:
    """A plan that uses RPC workers: plan every candidate on this machine alone, and say so in the reasons
    when one of them (a smaller quantization) decodes faster than the split (``links.slower_than_one_machine``)."""
    if hw is None or not any(d.get("backend") == "rpc" and d.get("n_layers") for d in chosen.devices):
        return
    import dataclasses

    from localrun.offload.links import slower_than_one_machine

    local = dataclasses.replace(hw, gpus=[g for g in hw.gpus if g.backend != "rpc"])
    alts = []
    for c in cands:
        p = plan_model(c.spec, local, n_ctx=n_ctx, **kw)
        if p.fits and not p.disk_backed_bytes:
            alts.append((f"{c.quant} on this machine alone", p.decode_tok_s))
    why = slower_than_one_machine(chosen.decode_tok_s, alts)
    if why:
        chosen.reasons.insert(1, why)
