"""What a bench run sends: prompt and output lengths, concurrency levels, shared prefix, arrivals.

A ``Workload`` is plain data (it goes into the ``--json`` report unchanged). ``build_requests`` turns it
into the requests of one concurrency level: each prompt is ``prompt_tokens`` long, of which the first
``shared_prefix × prompt_tokens`` are identical across all requests (a system prompt, a RAG preamble)
and the rest is unique to the request, so a prefix cache can reuse the shared part and nothing else.

Arrivals are either a *closed loop* (``rate_rps=None``: each of ``concurrency`` clients sends its next
request as soon as the previous one finishes) or *Poisson* (``rate_rps``: exponential gaps with mean
``1/rate_rps`` seconds, at most ``concurrency`` in flight), as in vLLM's ``benchmark_serving.py``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from localrun.errors import ConfigError

# Common English words; with BPE vocabularies (SmolLM2, Llama, Qwen, Gemma) " word" is one token for
# nearly all of them, so an HTTP client that cannot tokenize still gets close to the asked length.
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another know while last "
    "might us great old year off come since against go came right used take three city water house river "
    "market garden letter window music paper story table music light voice field morning number system"
).split()


@dataclass
class Workload:
    """One bench workload. Lengths in tokens, times in seconds, rates in requests/second.

    ``requests`` per concurrency level (default ``4 × concurrency``, at least 8) unless ``duration_s``
    is set, in which case requests are sent until that much time has passed (and those in flight end).
    """

    prompt_tokens: int = 128
    max_tokens: int = 128
    concurrency: list[int] = field(default_factory=lambda: [1])
    shared_prefix: float = 0.0  # fraction of the prompt identical across requests, 0..1
    requests: int | None = None
    duration_s: float | None = None
    rate_rps: float | None = None  # Poisson arrival rate; None = closed loop
    scenario: str | None = None
    seed: int = 0
    ignore_eos: bool = True  # generate exactly max_tokens (EOS banned), as vLLM's --ignore-eos

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the bad value."""
        if self.prompt_tokens < 1:
            raise ConfigError(f"--prompt-tokens must be ≥ 1, got {self.prompt_tokens}")
        if self.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be ≥ 1, got {self.max_tokens}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ConfigError(
                f"--concurrency needs levels ≥ 1, got {self.concurrency}", hint="e.g. --concurrency 1,4,8"
            )
        if not 0.0 <= self.shared_prefix <= 1.0:
            raise ConfigError(f"--shared-prefix is a fraction 0..1, got {self.shared_prefix}")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"--requests must be ≥ 1, got {self.requests}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ConfigError(f"--duration must be > 0 seconds, got {self.duration_s}")
        if self.rate_rps is not None and self.rate_rps <= 0:
            raise ConfigError(f"--rate must be > 0 requests/s, got {self.rate_rps}")

    @property
    def shared_tokens(self) -> int:
        return int(round(self.shared_prefix * self.prompt_tokens))

    def requests_for(self, concurrency: int) -> int:
        return self.requests if self.requests is not None else max(8, 4 * concurrency)

    def to_dict(self) -> dict:
        return asdict(self)


# name -> (description, workload fields). Lengths follow common serving benchmarks: chat (ShareGPT-like
# short turns), RAG (a long retrieved context, short answer), agent (a large shared system prompt with
# tool descriptions, short varied user turns).
SCENARIOS: dict[str, tuple[str, dict]] = {
    "chat": ("short chat turns", dict(prompt_tokens=128, max_tokens=128, shared_prefix=0.1)),
    "rag": ("long retrieved context, short answer", dict(prompt_tokens=2048, max_tokens=96, shared_prefix=0.0)),
    "agent": ("large shared system prompt, short turns", dict(prompt_tokens=1024, max_tokens=64, shared_prefix=0.85)),
}


def scenario(name: str, **overrides) -> Workload:
    """The named scenario with ``overrides`` (None values ignored). Raises ConfigError for an unknown name."""
    try:
        _, base = SCENARIOS[name]
    except KeyError:
        raise ConfigError(f"unknown scenario {name!r}", hint=f"use one of: {', '.join(SCENARIOS)}") from None
    values = {**base, **{k: v for k, v in overrides.items() if v is not None}, "scenario": name}
    return Workload(**values)


def parse_concurrency(text: str) -> list[int]:
    """'1,4,8' → [1, 4, 8]. Raises ConfigError."""
    try:
        levels = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(
            f"--concurrency takes numbers separated by commas, got {text!r}", hint="e.g. --concurrency 1,4,8,16"
        ) from None
    if not levels or any(c < 1 for c in levels):
        raise ConfigError(f"--concurrency needs levels ≥ 1, got {text!r}")
    return levels


@dataclass
class Request:
    """One request of a level: ``index`` within the level, ``arrival_s`` after the level's start
    (None in a closed loop), the prompt as words (HTTP) and, when a tokenizer is at hand, as tokens."""

    index: int
    text: str
    arrival_s: float | None = None
    tokens: list[int] | None = None


def _words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(_WORDS) for _ in range(n)]


def iter_requests(w: Workload, concurrency: int, level_index: int = 0, tokenizer=None):
    """Yield the requests of one level: ``w.requests_for(concurrency)`` of them, or without end when
    ``w.duration_s`` is set (the caller stops taking them when the time is up).

    With ``tokenizer`` (a callable text → token ids, no BOS), prompts are cut to exactly
    ``w.prompt_tokens`` tokens and the shared prefix to exactly ``w.shared_tokens``; without it the
    prompt has ``prompt_tokens`` words (≈ tokens, see ``_WORDS``). The unique part starts with the level
    and request number so no two requests of a run share more than the prefix. Poisson arrival times
    (seconds after the level's start) come with each request when ``w.rate_rps`` is set.
    """
    n = None if w.duration_s else w.requests_for(concurrency)
    shared_words = _words(random.Random(w.seed), w.shared_tokens)  # the same prefix for every level
    shared_ids = None
    rng = random.Random(f"{w.seed}/{level_index}/{concurrency}")
    t_arrival = 0.0
    i = 0
    while n is None or i < n:
        arrival = None
        if w.rate_rps:
            arrival = t_arrival
            t_arrival += rng.expovariate(w.rate_rps)
        unique = [f"Request {level_index}-{i}:"] + _words(rng, max(0, w.prompt_tokens - w.shared_tokens))
        if tokenizer is None:
            words = " ".join(shared_words + unique).split()[: w.prompt_tokens]
            yield Request(index=i, text=" ".join(words), arrival_s=arrival)
        else:
            if shared_ids is None:
                shared_ids = tokenizer(" ".join(shared_words))[: w.shared_tokens] if w.shared_tokens else []
            ids = (shared_ids + tokenizer(" " + " ".join(unique)))[: w.prompt_tokens]
            while len(ids) < w.prompt_tokens:  # pad with more unique words
                ids += tokenizer(" " + " ".join(_words(rng, w.prompt_tokens)))[: w.prompt_tokens - len(ids)]
            yield Request(index=i, text=" ".join(shared_words + unique), arrival_s=arrival, tokens=ids)
        i += 1


def build_requests(
    w: Workload, concurrency: int, level_index: int = 0, tokenizer=None, n: int | None = None
) -> list[Request]:
    """The first ``n`` (default ``w.requests_for(concurrency)``) requests of ``iter_requests``."""
    from itertools import islice

    n = n if n is not None else w.requests_for(concurrency)
    return list(islice(iter_requests(w, concurrency, level_index, tokenizer), n))


def poisson_arrivals(n: int, rate_rps: float, rng: random.Random) -> list[float]:
    """``n`` arrival times (seconds from 0) of a Poisson process with ``rate_rps`` requests/second."""
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate_rps)
    return out
