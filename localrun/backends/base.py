"""The Engine protocol and the data it speaks.

Every backend yields ``Chunk``s from one generator; chat, the HTTP server and bench are built on it
(the shape of mlx-lm's ``stream_generate``). Lengths are tokens, times seconds, rates tokens/second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence, runtime_checkable


@dataclass
class Message:
    role: str  # system | user | assistant | tool
    content: str
    tool_calls: list[dict] | None = None  # OpenAI-shaped, passed to the chat template
    name: str | None = None

    def to_dict(self) -> dict:
        d: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = self.tool_calls
        if self.name:
            d["name"] = self.name
        return d


@dataclass
class SamplingParams:
    """Sampling settings; the defaults are llama.cpp's (common/common.h ``common_params_sampling``).

    ``temperature <= 0`` means greedy. ``max_tokens=None`` generates until EOS, a stop string, or the
    context is full. ``seed=None`` draws a random seed. ``grammar`` is GBNF (llama.cpp grammars/README.md).
    ``logprobs`` = number of top alternatives to return per token (0 = the chosen token's only, None = off).
    ``ignore_eos`` bans the end-of-generation tokens (llama-server's and vLLM's extension: fixed-length
    outputs for benchmarks), so only ``max_tokens``, a stop string or a full context end the generation.

    Against loops (small models fall into them): ``repeat_penalty`` with ``repeat_last_n`` (llama.cpp's
    penalties sampler; ``repeat_last_n`` -1 = the whole context, 0 = off), DRY (``dry_multiplier`` > 0;
    "Don't Repeat Yourself", p-e-w, llama.cpp common/sampling.cpp: a penalty
    ``dry_multiplier × dry_base^(n - dry_allowed_length)`` on a token that would extend a repeated run of
    n ≥ ``dry_allowed_length`` tokens, over the last ``dry_penalty_last_n`` tokens, -1 = the context;
    llama.cpp backend only), and ``stop_loops``, which ends a generation stuck in a cycle with finish
    reason ``loop`` (``backends.text.LoopDetector``). ``chat`` turns on a repeat penalty and ``stop_loops``
    by default; the HTTP API keeps OpenAI's semantics (all off) unless ``serve`` is told otherwise.
    """

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int | None = None
    stop: Sequence[str] = ()
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    grammar: str | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    stop_loops: bool = False


@dataclass
class Stats:
    """Timing of one generation. ``ttft_s`` = request start → first token (prefill included)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV was reused (prefix cache), not prefilled again
    completion_tokens: int = 0
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    n_ctx_used: int = 0  # tokens in this sequence's KV cache at the end
    n_ctx: int = 0

    @property
    def prefill_tok_s(self) -> float:
        n = self.prompt_tokens - self.cached_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Decode rate over tokens after the first (the first token's time is TTFT)."""
        return (self.completion_tokens - 1) / self.decode_s if self.decode_s > 0 and self.completion_tokens > 1 else 0.0

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (TPOT)."""
        return self.decode_s / (self.completion_tokens - 1) if self.completion_tokens > 1 else 0.0


@dataclass
class TokenLogprob:
    """One generated token's log-probability and the ``top`` alternatives (text, logprob), most likely
    first; ``token_id``/``top_ids`` are the same tokens' ids."""

    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float]] = field(default_factory=list)
    token_id: int | None = None
    top_ids: list[int] = field(default_factory=list)


@dataclass
class Chunk:
    """One step of a generation: new text (may be '' while a stop string or UTF-8 sequence is pending).

    The last chunk has ``finish_reason`` set (``stop`` = EOS or stop string, ``length`` = max_tokens or
    context full, ``loop`` = the output repeated itself and ``stop_loops`` ended it, ``cancelled``) and
    ``stats``.
    """

    text: str
    token_id: int | None = None
    finish_reason: str | None = None
    stats: Stats | None = None
    logprobs: list[TokenLogprob] | None = None


@runtime_checkable
class Engine(Protocol):
    backend: str  # "llamacpp" | "mlx"
    model_path: str
    n_ctx: int  # context window per sequence, tokens

    @property
    def has_chat_template(self) -> bool: ...

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def apply_chat_template(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str: ...

    def tokenize_chat(self, messages: Sequence[Message], *, tools: list[dict] | None = None,
                      add_generation_prompt: bool = True, parse_special_in_content: bool = False
                      ) -> tuple[str, list[int]]:
        """Render with the chat template → (prompt text, token ids); message text is never read as
        control tokens (unless ``parse_special_in_content``)."""
        ...

    def generate(self, prompt: str | Sequence[int], params: SamplingParams, *,
                 parse_special: bool = True) -> Iterator[Chunk]:
        """Complete raw text (or tokens); control-token text in a raw prompt becomes control tokens unless
        ``parse_special=False``. Raises ContextOverflowError when the prompt does not fit."""
        ...

    def chat(self, messages: Sequence[Message], params: SamplingParams,
             tools: list[dict] | None = None) -> Iterator[Chunk]:
        """Render with the chat template, then generate. Raises ChatTemplateError without a template."""
        ...

    def close(self) -> None: ...
