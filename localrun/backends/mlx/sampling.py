"""Sampling pieces of the MLX engine: the sampler (llama.cpp's chain order on mlx-lm's filters), the logits
processors (bias, penalties, DRY) and the token → bytes table the text pipeline writes with.

Order as llama.cpp's chain (common/sampling.cpp): logit bias and penalties (processors), then top-k, top-p,
min-p on the untempered distribution, temperature, and a categorical draw keyed by the request's seed
(greedy when temperature <= 0)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localrun.backends.base import SamplingParams


def make_sampler(mx, p: SamplingParams):
    """``sample(logprobs [1, vocab], key) -> token [1]`` in llama.cpp's order (top-k, top-p, min-p on the
    untempered distribution, then temperature; mlx_lm.sample_utils filters). ``mx``: ``mlx.core``."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    if p.temperature <= 0:
        return lambda lp, key: mx.argmax(lp, axis=-1)
    inv_t = 1.0 / float(p.temperature)

    def sample(lp, key):
        if p.top_k > 0:
            lp = apply_top_k(lp, int(p.top_k))
        if 0 < p.top_p < 1:
            lp = apply_top_p(lp, float(p.top_p))
        if p.min_p > 0:
            lp = apply_min_p(lp, float(p.min_p))
        return mx.random.categorical(lp * inv_t, key=key)

    return sample


def make_processors(engine, p: SamplingParams) -> list:
    """mlx-lm logits processors ``(history, logits) → logits`` for logit bias (and ``ignore_eos``), the
    repetition/presence/frequency penalties over the last ``repeat_last_n`` tokens (-1: the context,
    ``engine.n_ctx``), and DRY (``dry.DrySampler``). ``engine``: gives ``eog_ids``, ``n_ctx``,
    ``dry_breakers()``. A constraint's mask is applied to their output before the draw (-inf stays -inf
    under every penalty), so they rank only the tokens the grammar allows (docs/architecture.md §2)."""
    from mlx_lm.sample_utils import make_logits_processors

    bias = {int(k): float(v) for k, v in p.logit_bias.items()}
    if p.ignore_eos:
        bias.update((t, float("-inf")) for t in engine.eog_ids)
    n = engine.n_ctx if p.repeat_last_n < 0 else p.repeat_last_n  # -1: the whole context, as llama.cpp
    procs = make_logits_processors(
        logit_bias=bias or None,
        repetition_penalty=p.repeat_penalty if p.repeat_penalty != 1.0 and n else None,
        repetition_context_size=n,
        presence_penalty=p.presence_penalty or None, presence_context_size=n,
        frequency_penalty=p.frequency_penalty or None, frequency_context_size=n)
    if p.dry_multiplier > 0:
        from localrun.backends.dry import DrySampler

        procs.append(DrySampler(engine, p))
    return procs


def piece_table(tokenizer, special_ids: set[int]) -> list[bytes]:
    """Bytes of every token of a transformers fast ``tokenizer``, as llama.cpp's
    ``token_to_piece(special=False)`` writes them: byte-level BPE letters mapped back to bytes,
    SentencePiece ``▁`` → space and ``<0xNN>`` → the byte, control tokens (``special_ids``) → nothing."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    hf = tokenizer
    toks = hf.convert_ids_to_tokens(list(range(len(hf))))
    dec = json.dumps(json.loads(hf.backend_tokenizer.to_str()).get("decoder") or {})
    byte_level = "ByteLevel" in dec
    inv = {c: b for b, c in bytes_to_unicode().items()}
    out: list[bytes] = []
    for i, t in enumerate(toks):
        if t is None or i in special_ids:
            out.append(b"")
        elif byte_level:
            out.append(bytes(inv[c] for c in t) if all(c in inv for c in t) else t.encode())
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            out.append(bytes([int(t[3:5], 16)]))
        else:
            out.append(t.replace("\u2581", " ").encode())
    return out
