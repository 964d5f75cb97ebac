"""The llguidance tokenizer (``LLTokenizer``) for an engine's own vocabulary, built once per engine.

* llama.cpp: from the GGUF token pieces through ``llama_token_to_piece`` (``llguidance.llamacpp``:
  control tokens are marked special so a grammar never produces them as text), tokenizing with
  ``llama_tokenize`` itself;
* MLX: from the Hugging Face fast tokenizer the engine loaded (``llguidance.hf``).

End of generation: every token the engine treats as end of generation (EOS, end of turn), so a
grammar that is complete lets the model close its turn the way its template does. Building costs
≈ 0.6 s for SmolLM2's 49,152 tokens (one Python call per token on llama.cpp).
"""

from __future__ import annotations

import threading
import weakref

from localrun.constrain.grammar import llguidance

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def tokenizer_for(engine):
    """The ``LLTokenizer`` of ``engine`` (a loaded llama.cpp or MLX engine), cached per engine.

    Its size is the engine's ``n_vocab`` (token ids the model can sample). Raises
    BackendUnavailableError without llguidance, ValueError for an unknown backend."""
    with _LOCK:
        tok = _CACHE.get(engine)
        if tok is None:
            tok = _build(engine)
            _CACHE[engine] = tok
        return tok


def eog_tokens(engine) -> list[int]:
    """Every end-of-generation token id of ``engine`` (EOS, end of turn), ascending."""
    ids = getattr(engine, "eog_ids", None)
    if ids is not None:
        return sorted(int(t) for t in ids)
    return [t for t in range(engine.n_vocab) if engine.is_eog(t)]


def _build(engine):
    llguidance()
    eos = eog_tokens(engine)
    if engine.backend == "llamacpp":
        import warnings

        from llguidance.llamacpp import lltokenizer_from_vocab

        with warnings.catch_warnings():  # it calls llama_token_get_attr, deprecated in llama-cpp-python
            warnings.simplefilter("ignore", DeprecationWarning)
            return lltokenizer_from_vocab(engine.vocab, n_vocab=engine.n_vocab, eos_token=eos)
    if engine.backend == "mlx":
        from llguidance.hf import from_tokenizer

        return from_tokenizer(engine.tokenizer, n_vocab=engine.n_vocab, eos_token=eos)
    raise ValueError(f"no llguidance tokenizer for backend {engine.backend!r}")
