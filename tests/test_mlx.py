"""The MLX backend on real models through mlx[cpu]: SmolLM2's GGUF (native Q4_1/Q8_0 path), Gemma-3's
K-quant GGUF (dequantize + re-quantize path), agreement with llama.cpp on the same file, and an MLX
folder written from a GGUF reloading through mlx_lm.

The engines are loaded once per module (loading costs seconds on this 2-core box)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model  # every test here loads a real model

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from localrun.backends.base import Message, SamplingParams  # noqa: E402
from localrun.errors import BackendUnavailableError, ContextOverflowError  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=24)
SYSTEM = Message("system", "You are a helpful assistant.")
JAPAN = Message("user", "What is the capital of Japan?")  # a wide-margin answer (checked below)
TEXT_64 = (
    "The river flows through the old town, past the market square where farmers sell apples, bread and "
    "cheese every Saturday morning. Children run between the stalls while their parents talk about the "
    "weather, the harvest and the price of milk. In the afternoon the square is quiet again, and the "
    "only sound is the water under the stone bridge."
)


@pytest.fixture(scope="module")
def mlx_home(tmp_path_factory):
    """A LOCALRUN_HOME for module-scoped engines (the tokenizer cache lands here)."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("mlx_home")
        mp.setenv("LOCALRUN_HOME", str(home))
        yield home


def _mlx_plan(path, n_ctx=2048):
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(path), n_ctx=n_ctx)
    plan.backend = "mlx"
    return plan


@pytest.fixture(scope="module")
def mlx_smollm(smollm_path, mlx_home):
    from localrun.backends import load_engine

    eng = load_engine(smollm_path, _mlx_plan(smollm_path))
    yield eng
    eng.close()


def _text(chunks) -> str:
    return "".join(c.text for c in chunks)


# ------------------------------------------------------------------ the "done means" items
def test_smollm_gguf_answers_tokyo(mlx_smollm):
    assert mlx_smollm.backend == "mlx"
    assert "natively" in mlx_smollm.conversion_note
    from helpers import assert_robust_greedy

    assert_robust_greedy(mlx_smollm, [SYSTEM, JAPAN], "Tokyo")  # the answer wins by a wide margin on MLX too
    chunks = list(mlx_smollm.chat([SYSTEM, JAPAN], GREEDY))
    assert "Tokyo" in _text(chunks)
    last = chunks[-1]
    assert last.finish_reason == "stop" and last.stats.completion_tokens > 0
    assert last.stats.prompt_tokens > 0 and last.stats.n_ctx == 2048


def _llamacpp_teacher_forced_argmax(eng, tokens: list[int]) -> list[int]:
    """llama.cpp's greedy next token at every position of ``tokens``: one llama_decode with logits for
    all positions on slot 0, whose KV is cleared before and after."""
    import numpy as np

    C, batch = eng.C, eng._batch
    slot = eng.slots[0]
    C.llama_memory_seq_rm(eng.mem, slot.seq_id, 0, -1)
    slot.tokens.clear()
    for i, t in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, i, 1
        batch.seq_id[i][0], batch.logits[i] = slot.seq_id, 1
    batch.n_tokens = len(tokens)
    assert C.llama_decode(eng.ctx, batch) == 0
    out = []
    for i in range(len(tokens)):
        logits = np.ctypeslib.as_array(C.llama_get_logits_ith(eng.ctx, i), shape=(eng.n_vocab,))
        out.append(int(logits.argmax()))
    C.llama_memory_seq_rm(eng.mem, slot.seq_id, 0, -1)
    return out


def test_greedy_agrees_with_llamacpp_teacher_forced(mlx_smollm, smollm_engine):
    """Same file, same 64 tokens: MLX's argmax matches llama.cpp's at >= 95% of positions."""
    tokens = smollm_engine.tokenize(TEXT_64, add_special=True)[:64]
    assert len(tokens) == 64
    assert mlx_smollm.tokenize(TEXT_64, add_special=True)[:64] == tokens  # same tokenizer from the GGUF
    ref = _llamacpp_teacher_forced_argmax(smollm_engine, tokens)
    ours = [int(t) for t in mlx_smollm.logits(tokens).argmax(axis=-1).tolist()]
    agree = sum(a == b for a, b in zip(ref, ours)) / len(tokens)
    print(f"MLX vs llama.cpp greedy agreement: {agree:.3f}")
    assert agree >= 0.95


def test_gemma_kquant_loads_through_dequantize_path(gemma_path, mlx_home):
    from localrun.backends import load_engine

    eng = load_engine(gemma_path, _mlx_plan(gemma_path, n_ctx=1024))
    try:
        assert "re-quantized" in eng.conversion_note and "Q4_K" in eng.conversion_note
        assert not eng.has_chat_template
        # 3 tokens: a generation that runs and stops at max_tokens is what this checks (each Gemma token
        # costs its 262k-row output layer in float32)
        chunks = list(eng.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=3)))
        text = _text(chunks)
        assert len(text.strip()) > 0 and chunks[-1].stats.completion_tokens == 3
        assert chunks[-1].finish_reason == "length"
    finally:
        eng.close()


@pytest.fixture(scope="module")
def smollm_folder(smollm_path, mlx_home, tmp_path_factory):
    """SmolLM2's GGUF written once as an MLX folder (``write_mlx_folder``): (its parent, the folder)."""
    from localrun.backends.mlx.gguf import write_mlx_folder

    parent = tmp_path_factory.mktemp("mlx_folder")
    return parent, write_mlx_folder(str(smollm_path), parent / "smollm-mlx")


def test_mlx_folder_from_gguf_reloads_with_same_greedy_tokens(smollm_path, smollm_folder):
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    from localrun.backends.mlx.gguf import load_gguf

    parent, out = smollm_folder
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert (out / "tokenizer.json").is_file()
    assert not list(parent.glob(".partial-*"))  # written atomically

    def greedy(model, ids, n=6):  # mlx-lm's own KV cache: the prompt once, then one token a step
        cache = make_prompt_cache(model)
        out_ids, feed = [], ids
        for _ in range(n):
            nxt = int(mx.argmax(model(mx.array([feed]), cache=cache)[0, -1]))
            out_ids.append(nxt)
            feed = [nxt]
        return out_ids

    direct, conv = load_gguf(str(smollm_path))
    reloaded, tok = mlx_lm.load(str(out))
    ids = conv.tokenizer.encode("The capital of France is", add_special_tokens=False)
    assert tok.encode("The capital of France is", add_special_tokens=False) == ids
    assert greedy(reloaded, ids) == greedy(direct, ids)


def test_engine_loads_mlx_folder(smollm_path, smollm_folder):
    from localrun.backends import load_engine
    from localrun.backends.choice import choose_backend
    from localrun.store.resolve import is_mlx_folder

    out = smollm_folder[1]
    assert is_mlx_folder(out)
    assert choose_backend(out, None, None, None)[0] == "mlx"
    eng = load_engine(out, _mlx_plan(smollm_path))
    try:
        assert eng.conversion_note == "MLX folder" and eng.has_chat_template
        assert "Tokyo" in _text(eng.chat([SYSTEM, JAPAN], GREEDY))
    finally:
        eng.close()


# ------------------------------------------------------------------ engine behaviour
def test_prompt_cache_is_reused_across_turns_and_gives_the_same_answer(mlx_smollm):
    first = _text(mlx_smollm.chat([SYSTEM, JAPAN], GREEDY))
    turn2 = [SYSTEM, JAPAN, Message("assistant", first), Message("user", "What is the population of that city?")]
    short = SamplingParams(temperature=0, max_tokens=8)  # a wrongly reused cache parts from cold at once
    chunks = list(mlx_smollm.chat(turn2, short))
    st = chunks[-1].stats
    assert st.cached_tokens > 20  # the first turn was not prefilled again
    mlx_smollm.reset_cache()
    fresh = list(mlx_smollm.chat(turn2, short))
    assert fresh[-1].stats.cached_tokens == 0
    assert _text(fresh) == _text(chunks)


def test_seeded_sampling_is_reproducible(mlx_smollm):
    p = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=1234, max_tokens=8)
    a = _text(mlx_smollm.generate("Once upon a time", p))
    b = _text(mlx_smollm.generate("Once upon a time", p))
    assert a == b and a


def test_stop_string_and_max_tokens(mlx_smollm):
    chunks = list(mlx_smollm.chat([SYSTEM, JAPAN], SamplingParams(temperature=0, stop=["Tokyo"])))
    assert "Tokyo" not in _text(chunks) and chunks[-1].finish_reason == "stop"
    chunks = list(mlx_smollm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=5)))
    assert chunks[-1].finish_reason == "length" and chunks[-1].stats.completion_tokens == 5


def test_ignore_eos_runs_to_max_tokens(mlx_smollm):
    yes = Message("user", "Reply with the single word: yes")
    short = list(mlx_smollm.chat([SYSTEM, yes], SamplingParams(temperature=0, max_tokens=40)))
    n = short[-1].stats.completion_tokens
    assert short[-1].finish_reason == "stop" and n < 40
    # past the end of generation it stopped at, to max_tokens
    full = list(mlx_smollm.chat([SYSTEM, yes], SamplingParams(temperature=0, max_tokens=n + 4, ignore_eos=True)))
    assert full[-1].finish_reason == "length" and full[-1].stats.completion_tokens == n + 4


def test_closing_early_leaves_the_engine_usable(mlx_smollm):
    gen = mlx_smollm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=50))
    next(gen)
    next(gen)
    gen.close()  # a client disconnect / Ctrl-C
    cached = mlx_smollm.cached_tokens
    assert all(c.offset == len(cached) for c in mlx_smollm._cache)
    # a generation left open is closed when the next one starts
    dangling = mlx_smollm.generate("Hello", SamplingParams(temperature=0, max_tokens=50))
    next(dangling)
    assert "Tokyo" in _text(mlx_smollm.chat([SYSTEM, JAPAN], GREEDY))


def test_context_overflow_and_grammar_are_clear_errors(mlx_smollm):
    with pytest.raises(ContextOverflowError):
        mlx_smollm.generate(list(range(100, 2200)), GREEDY)
    with pytest.raises(BackendUnavailableError):
        mlx_smollm.generate("x", SamplingParams(grammar='root ::= "a"'))


def test_tokenizer_matches_llamacpp(mlx_smollm, smollm_engine):
    for text, special in [("Hello world, café 😀 3+4=7", False),
                          ("<|im_start|>user\nHi<|im_end|>\n", True),
                          ("<|im_start|>user", False)]:
        assert mlx_smollm.tokenize(text, parse_special=special) == smollm_engine.tokenize(text, parse_special=special)
    ids = smollm_engine.tokenize("naïve café 😀 résumé", add_special=False)
    assert mlx_smollm.detokenize(ids) == smollm_engine.detokenize(ids)


def test_logprobs(mlx_smollm):
    p = SamplingParams(temperature=0, max_tokens=3, logprobs=2)
    chunks = list(mlx_smollm.generate("The capital of France is", p))
    lp = chunks[0].logprobs[0]
    assert lp.logprob <= 0 and len(lp.top) == 2 and lp.top[0][1] >= lp.top[1][1]
