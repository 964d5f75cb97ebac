"""Embeddings on MLX (issue 27 item 6; ``backends/mlx/embed.py``): the mean-pooled, L2-normalized last hidden
state, the vector llama.cpp's embedding context gives (``backends/llamacpp/embed.py``) for the same tokens of
the same file — SmolLM2's Q4_1 GGUF, which MLX loads natively — up to the two backends' float rounding."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.model  # loads a real model in both backends

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

TEXTS = ["a cat", "The giant panda is a bear species endemic to China.", "Hello, world! 🦙"]


@pytest.fixture(scope="module")
def engines(smollm_path):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    spec = read_gguf(smollm_path)
    lp = simple_plan(spec, n_ctx=256)
    lp.n_threads = lp.n_threads_batch = 1
    mp = simple_plan(spec, n_ctx=256)
    mp.backend = "mlx"
    lc, mx = load_engine(smollm_path, lp), load_engine(smollm_path, mp)
    yield lc, mx
    lc.close()
    mx.close()


def test_mlx_embeddings_match_llamacpp(engines):
    from localrun.backends import as_batch_engine, embedder_for

    lc, mx = engines
    el = embedder_for(lc)
    em = embedder_for(as_batch_engine(mx))  # as the server holds it: the serial wrapper
    for text in TEXTS:
        toks = lc.tokenize(text, add_special=True)
        assert toks == mx.tokenize(text, add_special=True)
        a, b = el.embed(toks), em.embed(toks)
        assert len(a) == len(b) == 576
        assert abs(math.sqrt(sum(v * v for v in b)) - 1) < 1e-4
        assert sum(x * y for x, y in zip(a, b)) > 0.999, text  # cosine similarity
    near = [em.embed(mx.tokenize(t, add_special=True)) for t in ("a cat", "a kitten", "tax law")]
    cos = [sum(x * y for x, y in zip(near[0], v)) for v in near[1:]]
    assert cos[0] > cos[1]  # the vectors mean something: cat ~ kitten more than cat ~ tax law
    el.close()


def test_mlx_embedding_context_overflow(engines):
    from localrun.backends import embedder_for
    from localrun.errors import ContextOverflowError

    _, mx = engines
    em = embedder_for(mx, n_ctx=8)
    with pytest.raises(ContextOverflowError):
        em.embed(list(range(1, 20)))
    assert len(em.embed([])) == 576  # an empty input embeds BOS, as llama.cpp's embedder does
