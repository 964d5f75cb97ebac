"""llama.cpp's own sampler chain (``llama_sampler_chain_*``) built from ``SamplingParams``."""

from __future__ import annotations

from localrun.backends.base import SamplingParams
from localrun.errors import LocalrunError


def make_sampler(C, vocab, n_vocab: int, p: SamplingParams, eog: tuple[int, ...] = ()):
    """A ``llama_sampler`` chain for ``p``; the caller frees it with ``llama_sampler_free``.

    Order as llama.cpp's common/sampling.cpp: logit bias, penalties, grammar, then greedy when
    ``temperature <= 0``, else top-k, top-p, min-p, temperature, dist(seed). ``eog``: the vocabulary's
    end-of-generation token ids, banned when ``p.ignore_eos``. Raises LocalrunError for a grammar that
    does not parse.
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
        add(C.llama_sampler_init_penalties(n_vocab, p.repeat_last_n, p.repeat_penalty,
                                           p.frequency_penalty, p.presence_penalty))
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
