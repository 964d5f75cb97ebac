"""DRY ("Don't Repeat Yourself", p-e-w, text-generation-webui PR 5677) for backends without llama.cpp's
own sampler: a port of ``llama_sampler_dry_apply`` (llama.cpp src/llama-sampler.cpp, itself ported from
koboldcpp PR 982), so both backends penalise repetition with the same numbers.

A token that would extend a run of n ≥ ``allowed_length`` tokens that already occurred earlier in the
window gets ``multiplier × base^(n - allowed_length)`` subtracted from its logit. A sequence breaker (a
token whose text contains "\\n", ":", '"' or "*") ends every run: matches never reach back past the last
one, and a breaker token itself is never penalised.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

FLOAT_MAX_LOG = 88.7228391  # log(FLT_MAX): llama.cpp clamps the exponent with it
DRY_SEQUENCE_BREAKERS = ("\n", ":", "\"", "*")  # llama.cpp common/common.h dry_sequence_breakers (both backends)


def breaker_ids(token_texts: Iterable[tuple[int, str]], breakers: Sequence[str]) -> frozenset[int]:
    """Token ids whose text contains one of the (single-character) ``breakers``.

    llama.cpp also treats multi-token tails of longer breakers; with the default one-character breakers
    (common/common.h) a token either contains one or it does not, which is all this handles."""
    return frozenset(t for t, text in token_texts if any(b in text for b in breakers))


def dry_penalties(tokens: Sequence[int], *, multiplier: float, base: float, allowed_length: int,
                  last_n: int, breakers: frozenset[int]) -> dict[int, float]:
    """Token id → penalty (to subtract from its logit) after the generated ``tokens``.

    ``last_n``: the window, in tokens (0 = off). Linear in the window (a reversed Z-algorithm, as in
    llama.cpp)."""
    if multiplier == 0 or base < 1 or last_n == 0:
        return {}
    window = list(tokens[-last_n:])
    n = len(window)
    if n <= allowed_length:
        return {}
    rev = window[::-1]  # rev[i] = llama.cpp's last_tokens.rat(i)
    rep_limit = n
    for i, tok in enumerate(rev):
        if tok in breakers:
            rep_limit = i
            break
    if rep_limit < allowed_length:
        return {}
    z = _z_array(rev)
    max_repeat: dict[int, int] = {}
    for k in range(1, n):
        length = min(z[k], rep_limit)
        if length >= allowed_length:
            tok = rev[k - 1]  # the token that followed that earlier occurrence
            if max_repeat.get(tok, -1) < length:
                max_repeat[tok] = length
    max_exp = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    out = {}
    for tok, length in max_repeat.items():
        if tok in breakers:
            continue
        e = length - allowed_length
        if max_exp > 0 and e > max_exp:
            e = max_exp
        out[tok] = multiplier * base ** e
    return out


def _z_array(s: Sequence[int]) -> list[int]:
    """z[k] = length of the longest common prefix of ``s`` and ``s[k:]`` (z[0] = len(s))."""
    n = len(s)
    z = [0] * n
    if n:
        z[0] = n
    lt = rt = 0
    for k in range(1, n):
        if k < rt:
            z[k] = min(rt - k, z[k - lt])
        while k + z[k] < n and s[z[k]] == s[k + z[k]]:
            z[k] += 1
        if k + z[k] > rt:
            lt, rt = k, k + z[k]
    return z


class DrySampler:
    """An mlx-lm logits processor ``(history, logits) → logits`` applying DRY to the generated tokens only
    (llama.cpp's sampler sees accepted tokens, not the prompt). ``engine`` gives ``n_ctx`` and
    ``dry_breakers()``; ``p`` is the request's ``SamplingParams``."""

    def __init__(self, engine, p) -> None:
        self.multiplier, self.base, self.allowed = float(p.dry_multiplier), float(p.dry_base), int(p.dry_allowed_length)
        self.last_n = engine.n_ctx if p.dry_penalty_last_n < 0 else int(p.dry_penalty_last_n)
        self.breakers = engine.dry_breakers()
        self.start: int | None = None  # where the generated tokens begin in the history

    def __call__(self, history, logits):
        import mlx.core as mx

        n = int(history.shape[0])
        if self.start is None:  # the first call comes after the prompt: nothing generated yet
            self.start = n
            return logits
        gen = history[max(self.start, n - self.last_n):].tolist()
        pen = dry_penalties(gen, multiplier=self.multiplier, base=self.base, allowed_length=self.allowed,
                            last_n=self.last_n, breakers=self.breakers)
        if not pen:
            return logits
        idx = mx.array(list(pen.keys()))
        return logits.at[..., idx].subtract(mx.array(list(pen.values()), dtype=logits.dtype))
