"""The decode-to-text pipeline both backends share (backends/text.py), the loop guard, and DRY: the MLX
port of llama.cpp's DRY sampler gives llama.cpp's own penalties."""

from __future__ import annotations

import random

import pytest

from localrun.backends.base import Message, SamplingParams, TokenLogprob
from localrun.backends.dry import breaker_ids, dry_penalties
from localrun.backends.text import LogprobRelease, LoopDetector, TextStream


def _push_all(stream: TextStream, pieces, eog_last: bool = False):
    out, finish = [], None
    for i, piece in enumerate(pieces):
        eog = eog_last and i == len(pieces) - 1
        text, finish = stream.push(i, piece, eog=eog, n_ctx_used=i)
        out.append(text)
        if finish:
            break
    return out, finish


def test_stop_string_split_over_tokens_is_held_back_and_cut():
    s = TextStream(SamplingParams(stop=["END"]), n_ctx=100)
    out, finish = _push_all(s, [b"Hello ", b"E", b"N", b"D", b" more"])
    assert out == ["Hello ", "", "", ""] and finish == "stop" and s.text == "Hello "


def test_held_back_prefix_is_released_when_it_does_not_become_the_stop():
    s = TextStream(SamplingParams(stop=["END"]), n_ctx=100)
    out, finish = _push_all(s, [b"a E", b"N", b"x"], eog_last=False)
    assert "".join(out) == "a ENx" and finish is None


def test_utf8_character_split_over_tokens_is_emitted_once_whole():
    s = TextStream(SamplingParams(), n_ctx=100)
    snow = "☃".encode()
    out, _ = _push_all(s, [snow[:1], snow[1:2], snow[2:], b"!"])
    assert out == ["", "", "☃", "!"]


def test_finish_reasons_eog_max_tokens_context():
    s = TextStream(SamplingParams(), n_ctx=100)
    assert _push_all(s, [b"a", b"b", b"<eos>"], eog_last=True) == (["a", "b", ""], "stop")
    assert "<eos>" not in s.text
    s = TextStream(SamplingParams(max_tokens=2), n_ctx=100)
    assert _push_all(s, [b"a", b"b", b"c"])[1] == "length" and s.text == "ab"
    s = TextStream(SamplingParams(), n_ctx=100)
    assert s.push(7, b"x", eog=False, n_ctx_used=99) == ("x", "length")


# a thinking reply as a QwQ-style template gets it: the prompt opened the block, the budget's forced close
THOUGHT = [b"The", b" first", b" idea", b"\n</", b"think", b">\n\n", b"The", b" first", b" answer"]
IN_THINKING = {"think_open": "<think>", "think_close": "</think>", "starts_in_thinking": True}


def test_stop_strings_apply_to_the_answer_only():
    """A stop string neither cuts the thinking nor matches the close marker (or the blank space after it) that
    the engine writes itself; in the answer it cuts as always."""
    for stop in (["first"], ["</think>"], ["</"], ["think>"], ["\n"]):
        s = TextStream(SamplingParams(stop=stop, **IN_THINKING), n_ctx=100)
        out, finish = _push_all(s, THOUGHT)
        if stop == ["first"]:
            assert finish == "stop" and s.text == "The first idea\n</think>\n\nThe ", s.text
        else:
            assert finish is None and "".join(out) == b"".join(THOUGHT).decode(), stop
    plain = TextStream(SamplingParams(stop=["first"]), n_ctx=100)  # no thinking: the whole text is the answer
    assert _push_all(plain, THOUGHT)[1] == "stop" and plain.text == "The "


def test_a_block_the_model_opens_itself_is_not_searched_either():
    params = SamplingParams(stop=["<", "x"], think_open="<think>", think_close="</think>")
    s = TextStream(params, n_ctx=100)
    out, finish = _push_all(s, [b"\n", b"<th", b"ink>", b"x<y", b"</think>", b"\n", b"ax", b"b"])
    assert finish == "stop" and s.text == "\n<think>x<y</think>\na"
    s = TextStream(params, n_ctx=100)  # no block: the reply is the answer from its first character
    out, finish = _push_all(s, [b"\n", b"<b", b">x"])
    assert out == ["", "\n"] and finish == "stop" and s.text == "\n"  # "<" was held, never shown


def _entries(pieces):
    return [TokenLogprob(token=p.decode("utf-8", errors="replace"), logprob=-1.0, bytes=list(p)) for p in pieces]


def test_logprobs_come_with_the_text_they_belong_to():
    """Each chunk carries the entries of the tokens whose text it shows: while a stop string holds text back
    its tokens wait, a token partly shown at the end comes with the last chunk, a matched stop string's own
    tokens are dropped; so the entries are in order and spell the reply."""
    pieces = [b" The", b" capital", b" is", b" P", b"ar", b"is", b" city"]
    s, release, chunks = TextStream(SamplingParams(stop=["Paris", "ci"]), n_ctx=100), LogprobRelease(), []
    for i, (piece, entry) in enumerate(zip(pieces, _entries(pieces))):
        text, finish = s.push(i, piece, eog=False, n_ctx_used=i)
        chunks.append((text, [e.token for e in release.push(text, [entry], final=finish is not None)]))
        if finish:
            break
    assert chunks == [(" The", [" The"]), (" capital", [" capital"]), (" is", [" is"]), (" ", []), ("", []),
                      ("", [" P"])] and s.text == " The capital is "
    snow = "☃".encode()  # a character split over two tokens: both entries come with it
    release, s = LogprobRelease(), TextStream(SamplingParams(), n_ctx=100)
    got = [release.push(s.push(i, p, eog=False, n_ctx_used=i)[0], _entries([p])) for i, p in
           enumerate([b"a", snow[:2], snow[2:]])]
    assert [[e.bytes for e in g] for g in got] == [[[97]], [list(snow[:2])], [list(snow[2:])]]


def test_loop_detector_needs_three_copies_and_a_minimum_span():
    d = LoopDetector(min_span=64)
    cycle = list(range(10, 35))  # a 25-token sentence
    hits = [d.push(t) for t in cycle * 3]
    assert not any(hits[:-1]) and hits[-1] and d.period == 25  # fires on the last token of the 3rd copy
    d = LoopDetector(min_span=64)
    assert not any(d.push(t) for t in [5, 6] * 31)  # a short item repeated (62 tokens): left alone
    assert not d.push(5)
    assert d.push(6) and d.period == 2  # 64 tokens of it: a loop
    d = LoopDetector()
    rng = random.Random(0)
    assert not any(d.push(rng.randrange(1000)) for _ in range(3000))  # varied text never trips it


def test_loop_guard_ends_a_looping_generation(smollm_engine):
    """A raw prompt that is one phrase repeated makes the model continue the cycle with a huge margin (the
    margin is checked, so this holds on every CPU); the guard ends it with finish reason 'loop'."""
    from helpers import assert_robust_greedy

    prompt = "The cat sat on the mat. " * 12
    assert_robust_greedy(smollm_engine, prompt, "The cat sat on the mat. The cat sat on the mat.", max_tokens=20,
                         min_margin=1.0)
    cap = 96  # above the guard's latest stop (80 below): free runs to the cap, guarded ends before it
    p = SamplingParams(temperature=0, max_tokens=cap)
    free = list(smollm_engine.generate(prompt, p))
    guarded = list(smollm_engine.generate(prompt, SamplingParams(temperature=0, max_tokens=cap, stop_loops=True)))
    assert free[-1].finish_reason == "length" and free[-1].stats.completion_tokens == cap
    assert guarded[-1].finish_reason == "loop"
    n = guarded[-1].stats.completion_tokens
    assert 24 <= n <= 80, n  # 3 copies of an 8-token cycle, at least 64 tokens: stopped at the first moment
    text = "".join(c.text for c in guarded)
    assert "".join(c.text for c in free).startswith(text)  # the same text, only shorter


def _llama_cpp_dry(engine, history, multiplier, base, allowed, last_n):
    """Penalties llama.cpp's own DRY sampler applies after ``history``: apply it to all-zero logits."""
    import ctypes

    from localrun.backends.llamacpp.sampling import dry_sampler

    C = engine.C
    s = dry_sampler(C, engine.vocab, multiplier, base, allowed, last_n)
    try:
        for t in history:
            C.llama_sampler_accept(s, t)
        n = engine.n_vocab
        data = (C.llama_token_data * n)()
        for i in range(n):
            data[i].id, data[i].logit, data[i].p = i, 0.0, 0.0
        arr = C.llama_token_data_array(data=ctypes.cast(data, ctypes.POINTER(C.llama_token_data)), size=n,
                                       selected=-1, sorted=False)
        C.llama_sampler_apply(s, ctypes.byref(arr))
        return {i: -data[i].logit for i in range(n) if data[i].logit != 0.0}
    finally:
        C.llama_sampler_free(s)


def test_dry_port_gives_llama_cpps_penalties(smollm_engine):
    """The MLX backend's DRY (a Python port) against llama.cpp's sampler, on token histories with
    repeats, sequence breakers and a window shorter than the history."""
    from localrun.backends.llamacpp.sampling import DRY_SEQUENCE_BREAKERS

    eng = smollm_engine
    breakers = breaker_ids(((t, eng.detokenize([t])) for t in range(eng.n_vocab)), DRY_SEQUENCE_BREAKERS)
    newline = eng.tokenize("\n", add_special=False)[0]
    assert newline in breakers
    words = eng.tokenize(" the cat sat on a mat and then it ran away fast", add_special=False)
    rng = random.Random(1)
    histories = [words * 3, words + [newline] + words[:5], (words[:4] * 6)[:-1]]
    histories += [[rng.choice(words[:6]) for _ in range(60)] for _ in range(3)]
    penalised = 0
    for hist in histories:
        for mult, base, allowed, last_n in [(0.8, 1.75, 2, 64), (0.8, 1.75, 2, 20), (1.5, 2.0, 3, 1000)]:
            want = _llama_cpp_dry(eng, hist, mult, base, allowed, last_n)
            got = dry_penalties(hist, multiplier=mult, base=base, allowed_length=allowed, last_n=last_n,
                                breakers=breakers)
            penalised += bool(want)
            assert got.keys() == want.keys(), (hist, mult, base, allowed, last_n)
            assert all(abs(got[k] - want[k]) <= 1e-4 * max(1.0, want[k]) for k in want)
    assert penalised >= 12  # most of the 18 cases penalise something: the comparison is not vacuous


def test_chat_defaults_keep_the_first_answer_and_stop_loops(smollm_engine):
    """chat's default sampling (DRY 0.8, loop guard) answers the README's first question like plain greedy,
    with a wide margin on every token (so on every CPU)."""
    from helpers import assert_robust_greedy

    chat_defaults = SamplingParams(dry_multiplier=0.8, stop_loops=True)
    msgs = [Message("system", "You are a helpful assistant."), Message("user", "What is the capital of Japan?")]
    text = assert_robust_greedy(smollm_engine, msgs, "Tokyo", params=chat_defaults)
    assert text == assert_robust_greedy(smollm_engine, msgs, "Tokyo")


@pytest.mark.parametrize("params", [SamplingParams(temperature=0, max_tokens=40, stop=["Paris"]),
                                    SamplingParams(temperature=0, max_tokens=7)])
def test_stop_and_length_on_the_engine(smollm_engine, params):
    msgs = [Message("system", "You are a helpful assistant."), Message("user", "Tell me about France.")]
    chunks = list(smollm_engine.chat(msgs, params))
    text = "".join(c.text for c in chunks)
    if params.stop:
        assert "Paris" not in text
    else:
        assert chunks[-1].finish_reason == "length" and chunks[-1].stats.completion_tokens == 7
