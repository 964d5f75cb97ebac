"""What docs/chat.md (*Not exact*) says about speculative decoding's verify steps on llama.cpp's CPU backend,
checked on SmolLM2 (benches/spec_exactness.py measures the sizes):

- with flash attention, the logits of a token decoded inside a verify batch (2 or 5 tokens) equal, bit for
  bit, those of the same token decoded alone: SmolLM2's Q4_1 weights take ggml's ``vec_dot`` either way and
  the attention runs per query row;
- without it (the CPU default), verify batches of 2 and of 5 tokens give each other's logits bit for bit:
  llamafile's GEMM adds each element in the same order whatever the batch width, so what differs is the
  one-token step (``vec_dot``), the cause the docs name. (That the one-token rows differ is CPU-dependent and
  not asserted: the bench prints it.)
- ``--spec``'s help says what a user gives up, on both commands.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

PROMPT = "The lighthouse keeper opened the bottle and read the message. It said"
N_TOKENS = 10


def _decode(eng, tokens: list[int], pos0: int) -> np.ndarray:
    """``tokens`` at pos0… on sequence 0 in one ``llama_decode``, every row's logits → [len, n_vocab]."""
    C, b = eng.C, eng._batch
    for i, t in enumerate(tokens):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos0 + i, 1, 1
        b.seq_id[i][0] = 0
    b.n_tokens = len(tokens)
    assert C.llama_decode(eng.ctx, b) == 0
    rows = [np.ctypeslib.as_array(ctypes.cast(C.llama_get_logits_ith(eng.ctx, i), ctypes.POINTER(ctypes.c_float)),
                                  shape=(eng.n_vocab,)).copy() for i in range(len(tokens))]
    return np.array(rows)


def _rows(smollm_path, flash_attn: bool) -> dict[int, np.ndarray]:
    """{batch size: logits rows of the same N_TOKENS greedy tokens decoded that many at a time}."""
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(smollm_path), n_ctx=256)
    plan.flash_attn = flash_attn
    plan.n_threads = plan.n_threads_batch = 1
    eng = load_engine(smollm_path, plan)
    try:
        prompt = eng.tokenize(PROMPT)
        tok = int(_decode(eng, prompt, 0)[-1].argmax())
        toks, out = [], {}
        for size in (1, 2, 5):
            eng.C.llama_memory_seq_rm(eng.mem, 0, len(prompt), -1)
            if size == 1:  # plain decoding picks the tokens the verify batches then replay
                rows = []
                for i in range(N_TOKENS):
                    toks.append(tok)
                    rows.append(_decode(eng, [tok], len(prompt) + i)[0])
                    tok = int(rows[-1].argmax())
                out[1] = np.array(rows)
            else:
                out[size] = np.concatenate([_decode(eng, toks[i:i + size], len(prompt) + i)
                                            for i in range(0, N_TOKENS, size)])
        return out
    finally:
        eng.close()


@pytest.mark.model
def test_with_flash_attention_a_verify_step_gives_plain_decodings_logits(smollm_path):
    rows = _rows(smollm_path, flash_attn=True)
    assert np.array_equal(rows[2], rows[1]) and np.array_equal(rows[5], rows[1])


@pytest.mark.model
def test_without_flash_attention_verify_batches_agree_with_each_other(smollm_path):
    rows = _rows(smollm_path, flash_attn=False)
    assert np.array_equal(rows[2], rows[5])


def test_spec_help_says_what_speculation_gives_up():
    import typer

    from localrun.cli import app

    cmds = typer.main.get_command(app).commands
    for name in ("chat", "serve"):
        opt = next(p for p in cmds[name].params if p.name == "spec_mode")
        assert "not lossless" in opt.help and "0.3 nat" in opt.help, (name, opt.help)
