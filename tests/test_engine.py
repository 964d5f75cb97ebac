"""The llama.cpp engine on the real SmolLM2 and Gemma-3 files: answers, history, stops, errors."""

import pytest
from helpers import assert_robust_greedy

from localrun.backends.base import Message, SamplingParams
from localrun.chat import ChatSession
from localrun.errors import ChatTemplateError, ContextOverflowError, TruncatedModelError

GREEDY = SamplingParams(temperature=0, max_tokens=40)
SYSTEM = "You are a helpful assistant."


def _text(stream):
    return "".join(c.text for c in stream)


JAPAN = "What is the capital of Japan?"  # SmolLM2 answers "The capital of Japan is Tokyo." by a wide margin


def test_capital_of_japan(smollm_engine):
    """The README's first question: every token of the answer wins by ≥ 1 logit (so on every CPU)."""
    text = assert_robust_greedy(smollm_engine, [Message("system", SYSTEM), Message("user", JAPAN)], "Tokyo")
    assert text.startswith("The capital of Japan is Tokyo")


def test_history_carries_across_turns(smollm_engine):
    s = ChatSession(smollm_engine, SamplingParams(temperature=0, max_tokens=30), system=SYSTEM)
    first = _text(s.send(JAPAN))
    assert "Tokyo" in first
    first_prompt = s.last_stats.prompt_tokens
    follow_up = "What is the population of that city?"
    # "that city" only resolves to Tokyo through the history (a wide-margin path, checked)
    assert_robust_greedy(smollm_engine, [Message("system", SYSTEM), Message("user", JAPAN),
                                         Message("assistant", first), Message("user", follow_up)], "Tokyo")
    second = _text(s.send(follow_up))
    assert "Tokyo" in second
    assert s.last_stats.prompt_tokens > first_prompt
    assert s.last_stats.cached_tokens >= first_prompt  # the earlier turn's KV was reused, not prefilled again
    assert [m.role for m in s.messages] == ["user", "assistant", "user", "assistant"]
    # without the history the same question does not mention Tokyo
    fresh = ChatSession(smollm_engine, SamplingParams(temperature=0, max_tokens=30), system=SYSTEM)
    assert "Tokyo" not in _text(fresh.send(follow_up))


def test_streaming_equals_whole_and_is_deterministic(smollm_engine):
    msgs = [Message("system", SYSTEM), Message("user", "Name three colors.")]
    chunks = list(smollm_engine.chat(msgs, GREEDY))
    assert len(chunks) > 3 and chunks[-1].finish_reason in ("stop", "length")
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == _text(smollm_engine.chat(msgs, GREEDY))
    st = chunks[-1].stats
    assert st.completion_tokens == len(chunks) and st.ttft_s > 0 and st.decode_tok_s > 0


def test_stop_strings_and_max_tokens(smollm_engine):
    full = _text(smollm_engine.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=20)))
    word = full.split()[5]
    cut = _text(smollm_engine.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=20, stop=[word])))
    assert word not in cut and full.startswith(cut)
    chunks = list(smollm_engine.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=5)))
    assert chunks[-1].finish_reason == "length" and chunks[-1].stats.completion_tokens == 5


def test_seeded_sampling_is_reproducible(smollm_engine):
    p = SamplingParams(temperature=1.0, seed=1234, max_tokens=20)
    assert _text(smollm_engine.generate("The weather today", p)) == _text(
        smollm_engine.generate("The weather today", p)
    )


def test_closing_the_stream_early_keeps_the_engine_usable(smollm_engine):
    stream = smollm_engine.generate("Write a long story about a dragon.", SamplingParams(temperature=0, max_tokens=200))
    next(stream)
    stream.close()  # what Ctrl-C does
    assert not smollm_engine.slots[0].busy
    assert "Tokyo" in _text(smollm_engine.chat([Message("system", SYSTEM), Message("user", JAPAN)], GREEDY))


def test_context_overflow_is_a_typed_error(smollm_engine):
    with pytest.raises(ContextOverflowError) as e:
        list(smollm_engine.generate("word " * 3000, GREEDY))
    assert e.value.n_ctx == smollm_engine.n_ctx


def test_context_policy_truncate_oldest(smollm_path):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    eng = load_engine(smollm_path, simple_plan(read_gguf(smollm_path), n_ctx=256))
    try:
        s = ChatSession(eng, SamplingParams(temperature=0, max_tokens=24), system=SYSTEM)
        turns = 6  # ≈ 45 tokens a turn: the 6th no longer fits the 232 left beside the answer's 24
        for i in range(turns):
            _text(s.send(f"Tell me a fact about the number {i}."))
        assert any("dropped" in n for n in s.notices) or len(s.messages) < 2 * turns
        assert s.prompt_tokens(s.conversation()) <= eng.n_ctx
        stop = ChatSession(
            eng,
            SamplingParams(temperature=0, max_tokens=24),
            system=SYSTEM,
            context_policy="stop",
            messages=list(s.messages),
        )
        before = list(stop.messages)
        with pytest.raises(ContextOverflowError):
            _text(stop.send("word " * 200))
        assert stop.messages == before  # nothing lost
    finally:
        eng.close()


def test_gemma_base_model_has_no_template_and_raw_works(gemma_path):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    eng = load_engine(gemma_path, simple_plan(read_gguf(gemma_path), n_ctx=1024))
    try:
        assert not eng.has_chat_template
        with pytest.raises(ChatTemplateError) as e:
            list(eng.chat([Message("user", "hi")], GREEDY))
        assert "--raw" in e.value.hint
        out = _text(eng.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=12)))
        assert len(out.split()) >= 3
    finally:
        eng.close()


def test_truncated_weights_refused_before_loading(deepseek_header_path):
    from localrun.backends import load_engine
    from localrun.offload.plan import Plan

    with pytest.raises(TruncatedModelError):
        load_engine(deepseek_header_path, Plan(n_ctx=512))


def test_moe_expert_overrides_reach_llama_cpp(smollm_path, monkeypatch):
    """plan.n_cpu_moe becomes llama.cpp tensor_buft_overrides (as --n-cpu-moe). SmolLM2 has no experts, so
    the same mechanism is checked with the dense-FFN regex (llama.cpp's LLM_FFN_DENSE_REGEX): llama.cpp
    logs each overridden tensor, and only layers below n_cpu_moe are affected."""
    from localrun.backends.llamacpp import lib as llamacpp_lib
    from localrun.backends.llamacpp.engine import LlamaCppEngine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    monkeypatch.setattr(llamacpp_lib, "FFN_EXPS_REGEX", r"\.ffn_(up|down|gate)\.")
    plan = simple_plan(read_gguf(smollm_path), n_ctx=256)
    plan.n_cpu_moe = 2
    eng = LlamaCppEngine(str(smollm_path), plan)
    try:
        hits = [ln for ln in eng.load_log if "buffer type overridden" in ln]
        assert sorted(ln.split()[1] for ln in hits) == sorted(
            f"blk.{i}.ffn_{w}.weight" for i in range(2) for w in ("up", "down", "gate")
        )
        assert "Tokyo" in _text(eng.chat([Message("system", SYSTEM), Message("user", JAPAN)], GREEDY))
    finally:
        eng.close()


def test_repack_patterns_name_the_cpu_layers_llama_cpp_would_repack():
    """CPU_REPACK (ggml-cpu/repack.cpp) takes Q4_0/Q4_K/IQ4_NL with AVX2 and Q2_K with AVX-512, 2-D, rows a
    multiple of 8; layers offloaded to a GPU (the last n_gpu_layers, the output past n_layer) are left out."""
    import re

    from localrun.backends.llamacpp.lib import repack_patterns
    from localrun.model.catalog import get_entry
    from localrun.model.synthetic import spec_from_entry

    spec = spec_from_entry(get_entry("llama-3.1-8b-instruct"), "Q4_K_M")  # 32 layers; Q4_K with Q6_K mixed in
    avx2 = {"avx2": True, "avx512": False}

    def matched(pats):
        rx = [re.compile(p) for p in pats]
        return {t.name for t in spec.tensors if any(r.search(t.name) for r in rx)}

    expect = {t.name for t in spec.tensors if t.type_name == "Q4_K" and t.name.startswith("blk.")}
    assert expect and matched(repack_patterns(spec, 0, avx2)) == expect | (
        {"output.weight"} if any(t.name == "output.weight" and t.type_name == "Q4_K" for t in spec.tensors) else set()
    )
    assert not any(t.type_name == "Q6_K" for t in spec.tensors if t.name in matched(repack_patterns(spec, 0, avx2)))
    on_cpu = matched(repack_patterns(spec, 12, avx2))  # layers 20..31 on the GPU
    assert on_cpu == {n for n in expect if int(n.split(".")[1]) < 20}
    assert matched(repack_patterns(spec, -1, avx2)) == set()  # everything offloaded
    assert repack_patterns(spec, 0, {"avx2": False, "avx512": False}) == []
    assert len(repack_patterns(spec, 0, avx2)) <= 8  # one pattern per weight kind, not per tensor


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"), reason="x86 repack kernels")
def test_gemma_q4_k_weights_are_repacked_without_amx(gemma_path, monkeypatch):
    """Where localrun keeps llama.cpp's extra buffer types off (a CPU that advertises AMX), it names the
    weights llama.cpp would repack for its AVX2 GEMM to the CPU_REPACK buffer type itself: llama.cpp
    reports a CPU_REPACK buffer the size of Gemma's Q4_K layer weights, and greedy text equals the
    unrepacked model's for 8 tokens (LOCALRUN_NO_REPACK=1; the GEMM sums in another order, so a long greedy
    run may part at a near-tie, as it does between llama.cpp builds)."""
    from localrun.backends.llamacpp import engine as llamacpp
    from localrun.backends.llamacpp import params as llamacpp_params
    from localrun.backends.llamacpp.lib import ggml_lib
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    if not ggml_lib("ggml-cpu").ggml_cpu_has_avx2():
        pytest.skip("no AVX2")
    monkeypatch.setattr(llamacpp_params, "cpu_advertises_amx", lambda: True)
    spec = read_gguf(gemma_path)
    texts = {}
    for mode in ("plain", "repack"):
        if mode == "plain":
            monkeypatch.setenv("LOCALRUN_NO_REPACK", "1")
        else:
            monkeypatch.delenv("LOCALRUN_NO_REPACK")
        eng = llamacpp.LlamaCppEngine(str(gemma_path), simple_plan(spec, n_ctx=256))
        try:
            sizes = [ln for ln in eng.load_log if "CPU_REPACK model buffer size" in ln]
            assert eng.repacked == (mode == "repack") and bool(sizes) == (mode == "repack")
            if sizes:
                mib = float(sizes[0].split("=")[1].split()[0])
                q4k = sum(t.n_bytes for t in spec.tensors if t.type_name == "Q4_K" and t.name.startswith("blk."))
                assert abs(mib * 2**20 - q4k) < 0.02 * q4k
            texts[mode] = _text(
                eng.generate(
                    "The river flows through the old town, past the market", SamplingParams(temperature=0, max_tokens=8)
                )
            )
        finally:
            eng.close()
    assert texts["plain"] == texts["repack"] and len(texts["plain"].split()) >= 3


def _two_slot_engine(smollm_path, n_batch: int):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(smollm_path), n_ctx=2048)
    plan.n_parallel, plan.n_batch, plan.n_ubatch = 2, n_batch, n_batch
    return load_engine(smollm_path, plan)


def _solo(eng, toks, p) -> list[int]:
    """Generated tokens of ``toks`` run alone on slot 0 (its KV freed afterwards)."""
    g = eng.start(toks, p, slot=eng.slots[0])
    _run_to_end(eng, [g])
    eng.release(g, keep_kv=False)
    return list(g.generated)


def _run_to_end(eng, gens) -> None:
    while not all(g.done for g in gens):
        eng.step([g for g in gens if not g.done])


def test_prefill_takes_waiting_prompts_in_turn(smollm_path):
    """A short prompt that arrives while a long one is being prefilled gets its first token after one
    step, not after all of the long prompt: it goes first, and the rest of the step's budget (n_batch, 128)
    takes the long prompt's remaining 113 tokens (6 + 113 ≤ 128); each prompt's output is still its solo
    output."""
    eng = _two_slot_engine(smollm_path, n_batch=128)
    try:
        long_p = eng.tokenize("The river flows through the old town. " * 30)  # 241 tokens: 2 chunks
        short_p = eng.tokenize("The capital of France is")
        p = SamplingParams(temperature=0, max_tokens=8)
        solo = {name: _solo(eng, toks, p) for name, toks in (("long", long_p), ("short", short_p))}
        long_g = eng.start(long_p, p, slot=eng.slots[0])
        eng.step([long_g])  # the first chunk of the long prompt
        short_g = eng.start(short_p, p, slot=eng.slots[1])
        gens, steps = [long_g, short_g], 0
        while not short_g.generated:
            eng.step(gens)
            steps += 1
        assert steps == 1  # the new prompt went first
        assert long_g.n_prompt_done == len(long_p) == 241  # and the long one finished in the same step
        _run_to_end(eng, gens)
        assert long_g.generated == solo["long"] and short_g.generated == solo["short"]
    finally:
        eng.close()


def test_prompt_chunks_shrink_while_others_decode(smollm_path):
    """On the CPU a long prompt is prefilled 128 tokens at a time while another sequence decodes (its
    stall per chunk stays short), with no remainder under 32 tokens; both outputs equal their solo ones.
    The prompt (276) is longer than n_batch (256): alone it would go in chunks of 256; 276 - 128 leaves 148,
    which a second 128 would cut to a 20-token sliver, so the tail is one chunk of 148."""
    eng = _two_slot_engine(smollm_path, n_batch=256)
    try:
        assert eng.prefill_chunk_decoding == 128
        long_p = eng.tokenize("The river flows through the old town. " * 40)[:276]
        short_p = eng.tokenize("Once upon a time")
        p = SamplingParams(temperature=0, max_tokens=24, logit_bias={2: -100.0})
        solo = {name: _solo(eng, toks, p) for name, toks in (("long", long_p), ("short", short_p))}
        short_g = eng.start(short_p, p, slot=eng.slots[1])
        eng.step([short_g])  # its prefill; it decodes from now on
        long_g = eng.start(long_p, p, slot=eng.slots[0])
        gens, chunks, done = [short_g, long_g], [], 0
        while long_g.prefilling:
            eng.step(gens)
            if long_g.n_prompt_done != done:
                chunks.append(long_g.n_prompt_done - done)
                done = long_g.n_prompt_done
        assert sum(chunks) == len(long_p) > 256 and all(c == 128 for c in chunks[:-1]), chunks
        assert 32 <= chunks[-1] < 128 + 32, chunks  # the tail is never a sliver
        _run_to_end(eng, gens)
        assert long_g.generated == solo["long"] and short_g.generated == solo["short"]
    finally:
        eng.close()


def test_plain_greedy_argmax_equals_llama_cpp_greedy_sampler(smollm_engine):
    """A greedy request with nothing else in its chain takes the logits row's argmax in Python
    (``sampling.plain_greedy``); a logit bias of 0.0 changes no logit but puts llama.cpp's own chain (bias,
    greedy) back in charge. The two paths pick the same 48 tokens, from the same logits."""
    from localrun.backends.llamacpp.sampling import plain_greedy

    eng = smollm_engine
    toks = eng.tokenize("Once upon a time, in a small village by the sea, there lived an old lighthouse keeper who")
    plain = SamplingParams(temperature=0, max_tokens=48)
    chain = SamplingParams(temperature=0, max_tokens=48, logit_bias={eng.tokenize("zebra", add_special=False)[0]: 0.0})
    assert plain_greedy(plain) and not plain_greedy(chain)
    out = {}
    for name, p in (("plain", plain), ("chain", chain)):
        g = eng.start(toks, p, slot=eng.slots[0])
        assert g.greedy == (name == "plain")
        _run_to_end(eng, [g])
        eng.release(g, keep_kv=False)
        out[name] = list(g.generated)
    assert len(out["plain"]) > 8 and out["plain"] == out["chain"]
