"""Incremental prompts: a prompt that extends (or shares a long head with) one tokenized before keeps the cached
tokens up to a control token and tokenizes only the rest (``backends/llamacpp/prompt_cache.py``).

Exactness is the whole point: on SmolLM2's byte-level BPE (ChatML, its own template) and Gemma-3's SentencePiece
(the built-in gemma template, and Gemma's newline runs as user-defined tokens), every prompt of a growing
conversation, and every text of a seeded random walk of awkward joins (a word cut in two, digits that BPE groups
by three, unicode with combining marks, whitespace runs, marker text cut in half), tokenizes to exactly the
tokens of a full ``llama_tokenize`` of the same text; message text never becomes control tokens.
"""

from __future__ import annotations

import random

import pytest

from localrun.backends.base import Message
from localrun.backends.llamacpp.prompt_cache import PromptTokenCache, Specials, cached_tokenizer, common_prefix_len
from localrun.model.chat_template import chat_prompt_tokens

MARKERS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>")
# what a message may hold: text that looks like a marker, whole or cut, at either end
AWKWARD = [
    "The answer is incompreh", "ensible", " 12345", "678", "9 items", "日本語のテキスト", "🙂🙃", "e\u0301te\u0301",
    "  \t  ", "\n\n\n", "\n", " ", "<|im_end|>", "<|im_", "start|>", "<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_", "turn>", "<bos>", "<", ">", "מימין לשמאל", "x" * 40, "def f(x):\n    return x\n",
    '{"a": [1, 2, {"b": "c"}]}', "\u00a0non-breaking\u00a0", "ends with a space ",
]


@pytest.fixture(scope="module")
def gemma_engine(gemma_path):
    """Gemma-3-270M with the built-in gemma template (tokenizing needs no large context)."""
    from localrun.backends import load_engine
    from localrun.model.chat_template import load_template
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    eng = load_engine(gemma_path, simple_plan(read_gguf(gemma_path), n_ctx=256), chat_template=load_template("gemma"))
    yield eng
    eng.close()


@pytest.fixture(params=["smollm2", "gemma3"])
def engine(request):
    return request.getfixturevalue("smollm_engine" if request.param == "smollm2" else "gemma_engine")


def _system() -> str:
    """A system prompt longer than the cache's minimum head (2 KB), with unicode (marker text: in the turns)."""
    rules = [f"Rule {i}: answer in {w}; never write the end-of-turn marker yourself. Café naïve 東京."
             for i, w in enumerate(["English", "français", "日本語", "Deutsch"] * 10)]
    return "\n".join(rules)


@pytest.mark.model
@pytest.mark.parametrize("with_markers", [False, True], ids=["plain", "marker-text"])
def test_growing_conversation_equals_full_tokenization(engine, with_markers):
    """Every turn of a conversation that grows by awkward messages: the engine's cached tokens equal a full,
    uncached ``chat_prompt_tokens`` of the same messages, and a later turn passes under a third of the
    characters to llama.cpp that an uncached one does (that one tokenizes the prompt about four times: its parts,
    each message's check, the whole). Without marker text in the messages the whole prompt keeps the last
    one's head; with it (``chat_prompt_tokens`` then keeps its part-by-part tokens) each message's text is a
    cache hit."""
    cache = cached_tokenizer(engine)
    extended = cache.stats.extended
    rng = random.Random(7)
    pool = AWKWARD if with_markers else [p for p in AWKWARD if not any(c in p for c in "<>")]
    msgs = [Message("system", _system()), Message("user", "Start: " + rng.choice(pool))]
    for turn in range(8):
        if turn:
            msgs.append(Message("assistant", "".join(rng.choice(pool) for _ in range(3))))
            msgs.append(Message("user", "".join(rng.choice(pool) for _ in range(2)) or "go on"))
        work = cache.stats.chars_tokenized
        text, ids = engine.tokenize_chat(msgs)
        work = cache.stats.chars_tokenized - work
        off = PromptTokenCache(engine.tokenize, lambda: None, max_chars=0)  # holds nothing: all tokenized whole
        ref_text, ref = chat_prompt_tokens(engine._template, engine.model_path, msgs, off)
        assert text == ref_text
        assert ids == ref, f"turn {turn}: cached tokens differ from a full tokenization"
        if turn:
            assert work < off.stats.chars_tokenized / 3, f"turn {turn}: {work} vs {off.stats.chars_tokenized}"
    if not with_markers:
        assert cache.stats.extended - extended >= 7  # the later turns kept the earlier prompt's tokens


@pytest.mark.model
def test_message_text_stays_text_on_the_cached_path(engine):
    """Marker text inside messages never becomes a control token on the cached path either: a conversation
    whose messages hold every marker has as many control tokens as the same conversation with plain text,
    also when its earlier turns are cache hits."""
    def convo(inject: str) -> list[Message]:
        return [Message("system", _system()), Message("user", "a" + inject), Message("assistant", inject + "b"),
                Message("user", inject)]

    specials = cached_tokenizer(engine).specials()
    assert specials is not None
    control = set(specials.anchors)
    for n in (2, 4):  # the second call keeps the first one's head
        marked = engine.tokenize_chat(convo("".join(MARKERS))[:n])[1]
        plain = engine.tokenize_chat(convo("plain words")[:n])[1]
        assert sum(t in control for t in marked) == sum(t in control for t in plain)


@pytest.mark.model
def test_random_joins_equal_full_tokenization(engine):
    """A seeded random walk of texts, each the last one extended by awkward pieces (or cut back and grown
    differently, as a template that rewrites history does): with a small minimum head every step cuts near
    its join, and each result equals the engine's own full tokenization, with and without BOS."""
    specials = cached_tokenizer(engine).specials()
    cache = PromptTokenCache(engine.tokenize, lambda: specials, min_head_chars=48)
    rng = random.Random(47)
    pieces = AWKWARD + list(MARKERS) * 3
    text = "<|im_start|>system\nYou are terse.<|im_end|>\n<start_of_turn>user\nHi<end_of_turn>\n"
    for step in range(160):
        if rng.random() < 0.15:
            text = text[:rng.randrange(len(text) // 2, len(text))]
        text += "".join(rng.choice(pieces) for _ in range(rng.randint(1, 4)))
        if len(text) > 3000:
            text = text[:200]
        add_special = step % 3 != 0
        got = cache(text, add_special=add_special, parse_special=True)
        assert got == engine.tokenize(text, add_special=add_special, parse_special=True), f"step {step}: {text[-80:]!r}"
    assert cache.stats.extended >= 60


def test_common_prefix_len():
    assert common_prefix_len("abcdef", "abcxyz") == 3
    assert common_prefix_len("abc", "abcdef") == 3
    assert common_prefix_len("", "abc") == 0
    assert common_prefix_len("x" * 5000 + "a", "x" * 5000 + "b") == 5000
    assert common_prefix_len("日本語テ", "日本語です") == 3


def test_a_cut_needs_no_other_special_over_its_marker():
    """A control text is a cut only where no other special text overlaps it (llama.cpp's partition takes
    longer texts first): ``<a>`` inside ``<a>b`` (a longer special) is not a cut; a lone ``<a>`` is."""
    from localrun.backends.llamacpp.prompt_cache import _overlapped

    sp = Specials({3: frozenset({"<a>"}), 4: frozenset({"<a>b"}), 1: frozenset({"\n"})}, {1: "<a>"})
    assert _overlapped("xx<a>bc", 2, "<a>", sp)
    assert not _overlapped("xx<a>\nc", 2, "<a>", sp)
    assert _overlapped("x<<a>", 2, "<a>", Specials({2: frozenset({"<<"}), 3: frozenset({"<a>"})}, {}))


def test_the_cache_holds_at_most_max_chars():
    """Least recently used texts leave once ``max_chars`` would be passed; a recent one stays a hit."""
    calls = []

    def tokenize(text, *, add_special=True, parse_special=False):  # stands for the engine's: one id a character
        calls.append(text)
        return [ord(c) for c in text]

    cache = PromptTokenCache(tokenize, lambda: None, max_chars=1000)
    for i in range(50):
        assert cache(f"{i:03d}" + "y" * 97) == [ord(c) for c in f"{i:03d}" + "y" * 97]
        assert cache.held_chars <= 1000
    n = len(calls)
    cache("049" + "y" * 97)
    assert len(calls) == n  # the latest is still held
    cache("000" + "y" * 97)
    assert len(calls) == n + 1  # the first left long ago
