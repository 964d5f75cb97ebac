"""``GrammarControl``: one generation's token control from an llguidance matcher.

The engine asks, at every step: ``forced()`` (a token the grammar allows alone: emit it without
sampling, llguidance's fast-forward), else ``mask()`` (bool[n_vocab]: the tokens the grammar allows;
the engine sets the others' logits to -inf before its sampler chain), then ``accept(token)``.
``complete()`` is true when the grammar allows nothing but end of generation: the engine finishes
with ``stop`` (JSON mode ends right after the value).

Speed (docs/architecture.md §2): ``accept`` starts the next mask in a worker thread (llguidance releases the GIL),
so it is computed while the engine runs the forward pass for the token just accepted; ``mask()`` then
waits only for what is left. A constraint's matcher is built once per (tokenizer, grammar) and
deep-copied per generation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from localrun.backends.base import Constraint
from localrun.constrain.grammar import cache_key, check, explain, llguidance
from localrun.constrain.vocab import tokenizer_for
from localrun.errors import BackendError

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_MATCHERS: OrderedDict = OrderedDict()  # (id(tokenizer), cache_key) → (tokenizer, fresh LLMatcher)
_MATCHERS_MAX = 32


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="localrun-mask")
        return _POOL


def fresh_matcher(c: Constraint, tokenizer):
    """A new ``LLMatcher`` for ``c`` on ``tokenizer`` (built once, then deep-copied). Raises
    ConstraintError for what llguidance cannot enforce."""
    key = (id(tokenizer), cache_key(c))
    with _POOL_LOCK:
        hit = _MATCHERS.get(key)
        if hit is not None and hit[0] is tokenizer:
            _MATCHERS.move_to_end(key)
            return hit[1].deep_copy()
    m = llguidance().LLMatcher(tokenizer, check(c, tokenizer))
    if m.is_error():
        raise explain(c, m.get_error())
    with _POOL_LOCK:
        _MATCHERS[key] = (tokenizer, m)
        while len(_MATCHERS) > _MATCHERS_MAX:
            _MATCHERS.popitem(last=False)
    return m.deep_copy()


def token_control(c: Constraint, engine) -> GrammarControl:
    """The ``GrammarControl`` for ``c`` on ``engine``'s vocabulary (tokenizer cached per engine)."""
    return GrammarControl(fresh_matcher(c, tokenizer_for(engine)), engine.n_vocab)


class GrammarControl:
    """Token control for one generation on an llguidance ``LLMatcher`` (see the module docstring).

    ``n_vocab``: the model's vocabulary size (tokens); the mask has that length. Not thread-safe: the
    engine's one thread calls it (the worker thread only computes the pending mask).
    """

    def __init__(self, matcher, n_vocab: int) -> None:
        self.matcher = matcher
        self.n_vocab = n_vocab
        self._forced: list[int] = []
        self._mask: Future | None = None
        self.n_forced = 0  # tokens emitted by fast-forward (not sampled)
        self._advance()

    def forced(self) -> int | None:
        """The next token, when the grammar allows only it (fast-forward); None = sample with ``mask()``."""
        return self._forced[0] if self._forced else None

    def mask(self):
        """bool ndarray [n_vocab]: True where the grammar allows the token (end-of-generation tokens
        are allowed once the output is complete). Waits for the mask the worker computes."""
        if self._mask is None:
            self._mask = _pool().submit(self._compute)
        return self._mask.result()

    def accept(self, token: int) -> None:
        """The engine emitted ``token`` (sampled under the mask, or forced). Raises BackendError when the
        grammar cannot take it (an engine that did not apply the mask)."""
        self._wait()
        if self._forced and self._forced[0] == token:
            self.n_forced += 1
        if not self.matcher.consume_token(int(token)):
            raise BackendError(f"token {token} breaks the output constraint: {self.matcher.get_error()}",
                               hint="a bug: the engine sampled outside the constraint's mask; please report it")
        self._advance()

    def complete(self) -> bool:
        """True when the output matches and nothing but end of generation may follow."""
        return self._stopped

    def accepting(self) -> bool:
        """True when the output so far is a complete match (more may still follow)."""
        return self._accepting

    def close(self) -> None:
        """Wait for a pending mask (the matcher must not be freed under the worker)."""
        self._wait()

    def _advance(self) -> None:
        """Read the matcher's state, then start the next mask in the worker (which borrows the matcher
        until it is done: nothing else touches it before ``_wait``)."""
        m = self.matcher
        self._stopped, self._accepting = m.is_stopped(), m.is_accepting()
        self._forced = [] if self._stopped else list(m.compute_ff_tokens())
        self._mask = None if (self._forced or self._stopped) else _pool().submit(self._compute)

    def _wait(self) -> None:
        if self._mask is not None:
            self._mask.result()

    def _compute(self):
        import numpy as np

        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little").view(bool)
        if allowed.size >= self.n_vocab:
            return allowed[: self.n_vocab]
        return np.concatenate([allowed, np.zeros(self.n_vocab - allowed.size, dtype=bool)])
