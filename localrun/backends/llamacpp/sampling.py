"""llama.cpp's own sampler chain (``llama_sampler_chain_*``) built from ``SamplingParams``."""

from __future__ import annotations

from typing import Sequence

from localrun.backends.base import SamplingParams
from localrun.backends.dry import DRY_SEQUENCE_BREAKERS
from localrun.errors import LocalrunError

__all__ = ["DRY_SEQUENCE_BREAKERS", "dry_sampler", "last_n", "make_sampler", "plain_greedy"]


def last_n(n: int, n_ctx: int) -> int:
    """A penalty window in tokens: -1 means the whole context (llama.cpp common/arg.cpp), 0 off."""
    return n_ctx if n < 0 else n


def plain_greedy(p: SamplingParams) -> bool:
    """True when ``make_sampler``'s chain for ``p`` is llama.cpp's greedy sampler alone (temperature ≤ 0, no
    logit bias or banned end-of-generation tokens, no penalties, no DRY, no grammar): its token is the first
    index of the largest logit (src/llama-sampling.cpp ``llama_sampler_greedy_apply``) and it keeps no state,
    so the engine takes ``argmax`` of the logits row itself (``batch._sample``: a token-control mask is
    already written into the row) instead of the chain's copy of the whole vocabulary into a candidates
    array (≈ 0.18 ms a token for a 49k vocabulary on this 2-core Xeon, measured; a step of 16 streams pays it
    16 times)."""
    return (p.temperature <= 0 and not p.logit_bias and not p.ignore_eos and p.repeat_penalty == 1.0
            and not p.frequency_penalty and not p.presence_penalty and p.dry_multiplier <= 0 and not p.grammar)


def make_sampler(C, vocab, n_vocab: int, p: SamplingParams, eog: tuple[int, ...] = (), *, n_ctx: int = 4096,
                 dry_cache: dict | None = None, history: Sequence[int] = ()):
    """A ``llama_sampler`` chain for ``p``; the caller frees it with ``llama_sampler_free``.

    Order as llama.cpp's common/sampling.cpp: logit bias, penalties, DRY, grammar, then greedy when
    ``temperature <= 0``, else top-k, top-p, min-p, temperature, dist(seed). ``eog``: the vocabulary's
    end-of-generation token ids, banned when ``p.ignore_eos``. ``n_ctx``: the sequence's context
    (tokens), the window of a penalty whose ``*_last_n`` is -1. ``dry_cache``: the engine's prototype
    DRY samplers by setting (building one scans the whole vocabulary for sequence breakers, ≈ 50 ms for
    a 50k vocabulary; a request gets a ``llama_sampler_clone``), freed by the engine. Raises
    LocalrunError for a grammar that does not parse. ``history``: the prompt's tokens; the repeat penalty
    sees its last ``repeat_last_n`` tokens first, as llama-cli and llama-server feed the prompt to
    ``common_sampler_accept``. DRY is not primed: it penalises repeats within the answer (a loop), not an
    answer that quotes the conversation (a second answer to the same question, code being edited); the
    MLX port (backends/dry.py) does the same. A constraint's mask is written into the logits before this
    chain runs (``batch._apply_mask``), so penalties and DRY rank only the tokens the grammar allows, as
    ``common_sampler_sample`` does when it resamples with the grammar first (docs/architecture.md §2).
    """
    chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())

    def add(s) -> None:
        C.llama_sampler_chain_add(chain, s)

    bias: dict[int, float] = dict(p.logit_bias)
    if p.ignore_eos:  # as llama-server: -inf on every end-of-generation token (common/sampling.cpp)
        bias.update((t, float("-inf")) for t in eog)
    if bias:
        n = len(bias)
        arr = (C.llama_logit_bias * n)()
        for i, (tok, b) in enumerate(bias.items()):
            arr[i].token, arr[i].bias = int(tok), float(b)
        add(C.llama_sampler_init_logit_bias(n_vocab, n, arr))
    if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
        # llama.h (this llama.cpp): llama_sampler_init_penalties(n_vocab, last_n, repeat, freq, present)
        window = last_n(p.repeat_last_n, n_ctx)
        pen = C.llama_sampler_init_penalties(n_vocab, window, p.repeat_penalty, p.frequency_penalty,
                                             p.presence_penalty)
        _prime(C, pen, history, window)
        add(pen)
    if p.dry_multiplier > 0:
        key = (
            float(p.dry_multiplier),
            float(p.dry_base),
            int(p.dry_allowed_length),
            last_n(p.dry_penalty_last_n, n_ctx),
        )
        cache = dry_cache if dry_cache is not None else {}
        if key not in cache:
            cache[key] = dry_sampler(C, vocab, *key)
        add(C.llama_sampler_clone(cache[key]))  # not primed: DRY fights repeats within the answer only
        if dry_cache is None:
            C.llama_sampler_free(cache[key])
    if p.grammar:
        g = C.llama_sampler_init_grammar(vocab, p.grammar.encode(), b"root")
        if not g:
            C.llama_sampler_free(chain)
            raise LocalrunError("the grammar does not parse", hint="check the GBNF (llama.cpp grammars/README.md)")
        add(g)
    if p.temperature <= 0:
        add(C.llama_sampler_init_greedy())
    else:
        if p.top_k > 0:
            add(C.llama_sampler_init_top_k(int(p.top_k)))
        if 0 < p.top_p < 1:
            add(C.llama_sampler_init_top_p(float(p.top_p), 1))
        if p.min_p > 0:
            add(C.llama_sampler_init_min_p(float(p.min_p), 1))
        add(C.llama_sampler_init_temp(float(p.temperature)))
        seed = C.LLAMA_DEFAULT_SEED if p.seed is None else int(p.seed) & 0xFFFFFFFF
        add(C.llama_sampler_init_dist(seed))
    return chain


def dry_sampler(C, vocab, multiplier: float, base: float, allowed_length: int, last_n_tokens: int):
    """llama.cpp's DRY sampler with its default sequence breakers (the caller frees it)."""
    import ctypes

    arr = (ctypes.c_char_p * len(DRY_SEQUENCE_BREAKERS))(*(b.encode() for b in DRY_SEQUENCE_BREAKERS))
    return C.llama_sampler_init_dry(
        vocab, multiplier, base, allowed_length, last_n_tokens, arr, len(DRY_SEQUENCE_BREAKERS)
    )


def _prime(C, sampler, history: Sequence[int], window: int) -> None:
    """Feed the last ``window`` tokens of ``history`` to ``sampler`` (its penalty history)."""
    for t in list(history)[-window:] if window > 0 else ():
        C.llama_sampler_accept(sampler, int(t))
