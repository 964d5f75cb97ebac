"""Incremental prompt tokens: a request whose rendered prompt extends an earlier one tokenizes only what is new.

An agent resends its whole conversation on every turn (stateless APIs): the rendered prompt of turn k+1 is
turn k's prompt plus the answer and a few new messages. Tokenizing 60 KB again costs 0.15-0.5 s on a CPU
(Gemma-3's SentencePiece vocabulary, llama.cpp's ``llama_tokenize``), several times per request
(``chat_template.chat_prompt_tokens`` tokenizes each part, checks each message's text and tokenizes the whole
text once more). ``PromptTokenCache`` wraps an engine's ``tokenize``:

* an exact text seen before (a message's content, the system prompt, a KV-tier probe) is a dictionary hit;
* a text tokenized with ``parse_special`` that shares a long head with a cached one keeps the cached tokens up
  to a *cut* and tokenizes only the text after it. The cut is the end of a control token's text (``<|im_start|>``,
  ``<start_of_turn>``) where llama.cpp's own tokenizer splits the text in both the old and the new prompt, so
  the result equals a full tokenization by construction, not by a back-off heuristic.

Why a control token is a hard cut (src/llama-vocab.cpp, ``llama_vocab::impl::tokenize`` and
``tokenizer_st_partition``): before any BPE/SentencePiece merge, the text is partitioned at every occurrence
of a CONTROL / USER_DEFINED / UNKNOWN token's text (the longest texts first, leftmost occurrences first,
with the token's LSTRIP/RSTRIP whitespace), and each raw fragment between them is tokenized on its own (a
SentencePiece fragment after a special token gets the same space prefix as a text's first fragment). An
occurrence of a control text ``c`` at ``S..X`` is certainly a cut when no other special text overlaps it
(then it is chosen whatever the processing order) and ``c`` neither starts nor ends with whitespace and has
no LSTRIP/RSTRIP (no neighbour's stripping reaches across it). Then ``tokens(text) = tokens(text)[:i+1] +
tokenize(text[X:], add_special=False)`` where ``i`` is ``c``'s token, and the tokens before ``S`` depend
only on ``text[:S]``. ``PromptTokenCache`` checks these conditions on both the cached and the new text
(the overlap check looks ``max_len`` characters around the cut), finds ``i`` from the cached tail's own
tokenization, and compares that tail with the cached tokens (a guard: a mismatch falls back to a full
tokenization and logs it). Only SentencePiece (SPM) and byte-level BPE vocabularies that add no EOS are
extended; others get exact hits only.

Bounded: at most ``max_chars`` characters of text are held, least recently used first out; with the tokens
as tuples (a copy is a pointer copy: ≈ 0.05 ms for 15k tokens, against ≈ 0.5 ms from a packed array) that is
≈ 11 bytes of RAM per character of English or JSON (≈ 3.8 characters a token × 36 bytes a token, plus the
text): the default 2 M characters ≈ 22 MB, room for about six 60 KB agent conversations (each holds its
message texts twice, its last prompt and its KV-tier probe). Thread-safe (the server tokenizes in worker
threads): the cache's bookkeeping is locked, tokenization is not.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)

# llama.h enum llama_token_attr / llama_vocab_type
ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_LSTRIP, ATTR_RSTRIP = 1 << 0, 1 << 3, 1 << 4, 1 << 7, 1 << 8
VOCAB_SPM, VOCAB_BPE = 1, 2

MIN_HEAD_CHARS = 2048  # a shared head shorter than this is not worth a cut: the text is tokenized whole
MAX_CACHED_CHARS = 2_000_000  # characters of text held (text + tokens ≈ 22 MB)
LONG_CANDIDATES = 16  # the most recent long parse_special texts tried as the head of a new one
MAX_CUT_TRIES = 16  # control-token occurrences tried as the cut, last first
ANCHOR_SCAN_TOKENS = 4096  # the cached prompt's last tokens whose control tokens are tried as cuts
_WS = " \t\n\v\f\r"  # C isspace(), which llama.cpp's LSTRIP/RSTRIP use


@dataclass(frozen=True)
class Specials:
    """What ``llama_tokenize(parse_special=True)`` cuts out of a text before merging (``tokenizer_st_partition``).

    ``by_len``: every CONTROL / USER_DEFINED / UNKNOWN token's text, by length in characters; ``anchors``:
    token id → text of the CONTROL tokens that can serve as a cut (no LSTRIP/RSTRIP attribute, no whitespace
    at either end of the text)."""

    by_len: dict[int, frozenset[str]]
    anchors: dict[int, str]
    max_len: int = field(init=False)
    lens_by_first: dict[str, tuple[int, ...]] = field(init=False)  # first character → lengths of texts

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_len", max(self.by_len, default=0))
        first: dict[str, set[int]] = {}
        for n, texts in self.by_len.items():
            for t in texts:
                first.setdefault(t[0], set()).add(n)
        object.__setattr__(self, "lens_by_first", {ch: tuple(sorted(ns)) for ch, ns in first.items()})


def vocab_specials(C, vocab) -> Specials | None:
    """Read ``vocab``'s special tokens through llama.cpp's C API (``llama_vocab_get_attr``/``_get_text``;
    one call per token: ≈ 0.05-0.3 s for Gemma-3's 262,144 tokens, once per engine) → ``Specials``, or None
    where a cut cannot be proven exact: a vocabulary other than SPM or BPE, one that appends EOS, or a special
    text that is not valid UTF-8 (matched on bytes by llama.cpp, on characters here)."""
    if C.llama_vocab_type(vocab) not in (VOCAB_SPM, VOCAB_BPE) or C.llama_vocab_get_add_eos(vocab):
        return None
    n = C.llama_vocab_n_tokens(vocab)
    attrs = list(map(C.llama_vocab_get_attr, itertools.repeat(vocab, n), range(n)))
    by_len: dict[int, set[str]] = {}
    anchors: dict[int, str] = {}
    for tok, attr in enumerate(attrs):
        if not attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
            continue
        try:
            text = C.llama_vocab_get_text(vocab, tok).decode("utf-8")
        except UnicodeDecodeError:
            return None
        if not text:
            continue
        by_len.setdefault(len(text), set()).add(text)
        if attr & ATTR_CONTROL and not attr & (ATTR_LSTRIP | ATTR_RSTRIP) and text[0] not in _WS \
                and text[-1] not in _WS:
            anchors[tok] = text
    return Specials({k: frozenset(v) for k, v in by_len.items()}, anchors)


@dataclass
class CacheStats:
    """Counters since the cache was made: ``hits`` (exact texts), ``extended`` (a cached head kept),
    ``full`` (tokenized whole), ``chars_tokenized`` (characters passed to the underlying tokenizer)."""

    hits: int = 0
    extended: int = 0
    full: int = 0
    chars_tokenized: int = 0


class PromptTokenCache:
    """``tokenize(text, add_special=, parse_special=)`` with exact hits and head reuse (module docstring).

    ``tokenize``: the engine's own (``LlamaCppEngine.tokenize``); ``specials``: called once, the first time a
    long text is tokenized with ``parse_special`` (``vocab_specials``; None turns head reuse off). Returns new
    lists: callers may change them."""

    def __init__(self, tokenize: Callable[..., list[int]], specials: Callable[[], Specials | None], *,
                 max_chars: int = MAX_CACHED_CHARS, min_head_chars: int = MIN_HEAD_CHARS) -> None:
        self._tokenize = tokenize
        self._specials_fn = specials
        self._specials: Specials | None = None
        self._specials_done = False
        self._specials_lock = threading.Lock()
        self.max_chars, self.min_head_chars = max_chars, min_head_chars
        self._entries: OrderedDict[tuple[str, bool, bool], tuple[int, ...]] = OrderedDict()
        self._chars = 0
        self._long: dict[bool, OrderedDict[str, None]] = {True: OrderedDict(), False: OrderedDict()}
        self._lock = threading.Lock()
        self.stats = CacheStats()

    def __call__(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        key = (text, add_special, parse_special)
        with self._lock:
            got = self._entries.get(key)
            if got is not None:
                self._entries.move_to_end(key)
                self.stats.hits += 1
                return list(got)
        ids = None
        if parse_special and len(text) >= self.min_head_chars:
            ids = self._extend(text, add_special)
        if ids is None:
            ids = self._raw(text, add_special, parse_special)
            self.stats.full += 1
        else:
            self.stats.extended += 1
        self._store(key, ids)
        return ids

    @property
    def held_chars(self) -> int:
        """Characters of text held now (≤ ``max_chars``)."""
        return self._chars

    def specials(self) -> Specials | None:
        """The vocabulary's ``Specials`` (read on first use), or None where head reuse is off."""
        return self._get_specials()

    # ------------------------------------------------------------------ internals
    def _raw(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        self.stats.chars_tokenized += len(text)
        return self._tokenize(text, add_special=add_special, parse_special=parse_special)

    def _store(self, key: tuple[str, bool, bool], ids: list[int]) -> None:
        text = key[0]
        if len(text) > self.max_chars:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = tuple(ids)
            self._chars += len(text)
            if key[2] and len(text) >= self.min_head_chars:
                long = self._long[key[1]]
                long[text] = None
                long.move_to_end(text)
                while len(long) > LONG_CANDIDATES:
                    long.popitem(last=False)
            while self._chars > self.max_chars:
                (old, a_s, p_s), _ = self._entries.popitem(last=False)
                self._chars -= len(old)
                if p_s:
                    self._long[a_s].pop(old, None)

    def _get_specials(self) -> Specials | None:
        with self._specials_lock:
            if not self._specials_done:
                try:
                    self._specials = self._specials_fn()
                except Exception as e:  # a vocabulary it cannot read: exact hits only
                    log.debug("prompt cache: no special tokens (%s); head reuse off", e)
                    self._specials = None
                self._specials_done = True
        return self._specials

    def _extend(self, text: str, add_special: bool) -> list[int] | None:
        """``text``'s tokens from the cached text sharing its longest head, or None (no head, no safe cut)."""
        specials = self._get_specials()
        if specials is None:
            return None
        with self._lock:
            cands = [(t, self._entries.get((t, add_special, True))) for t in reversed(self._long[add_special])]
        best, best_d, best_ids = None, 0, None
        probe = self.min_head_chars
        for old, ids in cands:
            if ids is None or not text.startswith(old[:probe]):
                continue
            d = len(old) if text.startswith(old) else common_prefix_len(old, text)
            if d > best_d:
                best, best_d, best_ids = old, d, ids
        if best is None or best_d < self.min_head_chars:
            return None
        return self._splice(best, best_ids, text, best_d, specials)

    def _splice(self, old: str, old_ids: tuple[int, ...], text: str, d: int, specials: Specials
                ) -> list[int] | None:
        """Keep ``old_ids`` up to the last provable cut within the shared head ``old[:d] == text[:d]``."""
        for s, c in _cut_candidates(old, old_ids, d, specials):
            x = s + len(c)
            if x < self.min_head_chars:
                return None  # the rest are further left still
            if _overlapped(old, s, c, specials) or _overlapped(text, s, c, specials):
                continue
            tail_old = self._raw(old[x:], False, True)
            i = len(old_ids) - len(tail_old) - 1
            if i < 0 or specials.anchors.get(old_ids[i]) != c or list(old_ids[i + 1:]) != tail_old:
                log.warning("prompt cache: the cached tokens do not split at %r (offset %d); tokenizing whole", c, s)
                return None
            return list(old_ids[:i + 1]) + self._raw(text[x:], False, True)
        return None


def _cut_candidates(old: str, old_ids: tuple[int, ...], d: int, specials: Specials):
    """(start, text) of control-token occurrences that end within ``old[:d]``, last first, at most
    ``MAX_CUT_TRIES``: the texts are those of the anchor tokens among the last ``ANCHOR_SCAN_TOKENS`` of
    ``old_ids`` (a template's turn markers)."""
    texts = {specials.anchors[t] for t in set(old_ids[-ANCHOR_SCAN_TOKENS:]) if t in specials.anchors}
    found: list[tuple[int, str]] = []
    for c in texts:
        end = d
        for _ in range(MAX_CUT_TRIES):
            s = old.rfind(c, 0, end)
            if s < 0:
                break
            found.append((s, c))
            end = s + len(c) - 1
    found.sort(reverse=True)
    return found[:MAX_CUT_TRIES]


def _overlapped(text: str, s: int, c: str, specials: Specials) -> bool:
    """Whether any special text other than ``c`` itself at ``s`` overlaps ``text[s:s+len(c)]`` (then the
    partition may not cut there)."""
    x = s + len(c)
    for p in range(max(0, s - specials.max_len + 1), min(x, len(text))):
        for n in specials.lens_by_first.get(text[p], ()):
            if p + n <= s or (p == s and n == len(c)):
                continue
            if text[p:p + n] in specials.by_len[n]:
                return True
    return False


def common_prefix_len(a: str, b: str) -> int:
    """The length of the longest common head of ``a`` and ``b`` (binary search over C-speed compares)."""
    lo, hi = 0, min(len(a), len(b))
    if b.startswith(a[:hi]):
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if b.startswith(a[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


def cached_tokenizer(engine) -> PromptTokenCache:
    """``engine``'s (a ``LlamaCppEngine``) prompt token cache, made on first use and kept on the engine."""
    cache = engine.__dict__.get("_prompt_token_cache")
    if cache is None:
        cache = PromptTokenCache(engine.tokenize, lambda: vocab_specials(engine.C, engine.vocab))
        engine.__dict__["_prompt_token_cache"] = cache
    return cache
