"""The engine contract and the data it speaks.

* ``Engine``: what every backend does. ``generate``/``chat`` yield ``Chunk``s from one generator (the
  shape of mlx-lm's ``stream_generate``); ``chat`` and ``localrun chat`` are built on it.
* ``BatchEngine``: an ``Engine`` that runs several sequences together. The server's scheduler and bench
  drive it with ``acquire_slot`` → ``start`` → ``step`` … → ``release`` on ONE thread, each ``start``
  returning a ``Generation``. ``LlamaCppEngine`` is one; a single-stream engine (MLX) becomes one through
  ``backends.as_batch_engine`` (``mlx.batch.MlxBatchEngine``, or ``SerialEngine``: one slot, requests one
  at a time), the only place that decides (the shape of Ollama's ``LlamaServer`` interface, which its
  scheduler is given).
* ``SingleStreamEngine``: what ``SerialEngine`` needs of the engine it wraps (its one prefix cache).
* ``SpeculationTarget`` (``BatchSpeculationTarget`` for llama.cpp, ``StreamSpeculationTarget`` for MLX): the
  narrow part of an engine its speculative decoding reads (``llamacpp/spec.py``, ``mlx/spec.py``), so that
  speculation takes an engine without importing its class (the engine imports speculation, never the
  reverse).

Lengths are tokens, times seconds (``time.perf_counter``), rates tokens/second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from localrun.model.gguf_info import ModelSpec


@dataclass
class Message:
    role: str  # system | user | assistant | tool
    content: str
    tool_calls: list[dict] | None = None  # OpenAI-shaped, passed to the chat template
    name: str | None = None
    images: list | None = None  # backends.images.ImageInput, one per IMAGE_MARKER in content, in order

    def to_dict(self) -> dict:
        d: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = self.tool_calls
        if self.name:
            d["name"] = self.name
        return d


@dataclass(frozen=True)
class Constraint:
    """What the output must match, enforced token by token (``localrun.constrain`` compiles it with
    llguidance for the engine's vocabulary).

    ``kind``: ``"json_schema"`` (``source`` a JSON Schema dict), ``"json_object"`` (any JSON object;
    ``source`` ignored), ``"regex"`` (``source`` a regex, Rust ``regex`` syntax), ``"lark"`` (llguidance's
    Lark dialect), ``"gbnf"`` (llama.cpp GBNF). ``param``: the request field it came from, named in errors.
    ``strict``: OpenAI's ``strict: true`` (the schema was closed by ``constrain.strict_schema``); a reply cut
    by the token limit before the constraint completes then carries an error, not only ``finish_reason:
    length`` (a loop-guard cut always does: docs/architecture.md §2, *Loop guards under a constraint*).
    """

    kind: str
    source: str | dict | None = None
    param: str = ""
    strict: bool = False


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
    both backends, MLX through ``backends.dry``), and ``stop_loops``, which ends a generation stuck in a
    cycle with finish reason ``loop`` (``backends.text.LoopDetector``). ``chat`` turns on DRY and
    ``stop_loops`` by default; the HTTP API keeps OpenAI's semantics (all off) unless ``serve`` is told
    otherwise. All of them apply under a ``constraint`` too (docs/architecture.md §2).

    Token control (``backends/control.py``, docs/architecture.md §2): ``reasoning_budget`` (tokens of thinking, None =
    unlimited) after which the engine forces the tokens of ``budget_close`` (text; control-token markers
    in it become their tokens; "" = ``think_close``) and the model answers, never writing ``think_close``
    again; ``think_open``/``think_close`` are the block's markers, ``starts_in_thinking`` says the prompt
    already ends inside the block; ``end_thinking``: an object with ``is_set()`` (a ``threading.Event``) that,
    once set, makes the budget spent now (the chat's Ctrl-C while the model thinks; with it the budget
    control runs even when ``reasoning_budget`` is None). ``constraint``: a ``Constraint`` the output must
    match (a token mask per step, before the penalties and DRY rank what it allows; finish ``stop`` when it
    is complete; the loop guard still applies). ``render_special``: control tokens'
    text (gpt-oss's ``<|channel|>``) appears in the output text; end-of-generation tokens still end it, unshown.
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
    reasoning_budget: int | None = None
    budget_close: str = ""
    think_open: str = ""
    think_close: str = ""
    starts_in_thinking: bool = False
    end_thinking: object | None = None  # threading.Event: set → the engine closes the thinking block now
    render_special: bool = False
    constraint: Constraint | None = None  # structured output (JSON schema, regex, grammar); None = free text


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
    draft_tokens: int = 0  # speculative decoding: tokens drafted and verified (backends/spec_decode.py)
    accepted_tokens: int = 0  # of those, the ones the target kept

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted tokens; None when nothing was drafted."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

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
    first; ``token_id``/``top_ids`` are the same tokens' ids, ``top_bytes`` their bytes (empty: not known),
    which tell apart alternatives that are each part of a UTF-8 sequence (all shown as '\ufffd')."""

    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float]] = field(default_factory=list)
    token_id: int | None = None
    top_ids: list[int] = field(default_factory=list)
    top_bytes: list[list[int]] = field(default_factory=list)


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
    """A loaded model (``backends.load_engine``). Not thread-safe: one thread drives it."""

    backend: str  # "llamacpp" | "mlx"
    model_path: str  # the .gguf file or MLX folder it was loaded from
    n_ctx: int  # context window per sequence, tokens
    spec: ModelSpec | None  # the GGUF header; None for an MLX folder
    add_bos: bool | None  # whether tokenize(add_special=True) starts with BOS (None: the tokenizer decides)
    kv_cache: Any  # its KV snapshot tiers (backends/kv_cache.py KVCache, mlx.cache.MlxKVCache), None = off
    speculation: Any  # speculative decoding (.totals(): drafted / accepted tokens), None = off

    @property
    def has_chat_template(self) -> bool: ...

    @property
    def template_source(self) -> str | None:
        """The Jinja chat template in use (the model's or ``--chat-template``'s), None without one."""
        ...

    @property
    def supports_tools(self) -> bool:
        """Whether that template renders a ``tools`` list (``chat_template.template_supports_tools``)."""
        ...

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends a generation (EOS, end of turn)."""
        ...

    def apply_chat_template(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, template_kwargs: dict | None = None) -> str: ...

    def tokenize_chat(self, messages: Sequence[Message], *, tools: list[dict] | None = None,
                      add_generation_prompt: bool = True, parse_special_in_content: bool = False,
                      template_kwargs: dict | None = None) -> tuple[str, list[int]]:
        """Render with the chat template → (prompt text, token ids); message text is never read as
        control tokens (unless ``parse_special_in_content``). ``template_kwargs``: extra template
        variables (``enable_thinking``, ``reasoning_effort``)."""
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


@runtime_checkable
class Generation(Protocol):
    """A request running on a ``BatchEngine`` sequence, as ``start`` returns it. The scheduler and bench
    read these fields (the engine writes them); everything else in it is the engine's own."""

    prompt: list[int]  # the prompt's token ids
    params: SamplingParams
    cached_tokens: int  # prompt tokens whose KV was reused (prefix cache), not prefilled again
    t_start: float  # perf_counter seconds when ``start`` took the request
    finish_reason: str | None  # set by the ``step`` that produced the last chunk

    @property
    def done(self) -> bool:
        """``finish_reason is not None``: ``step`` skips it, the caller releases it."""
        ...


@runtime_checkable
class BatchEngine(Engine, Protocol):
    """An ``Engine`` that decodes up to ``n_parallel`` sequences together (continuous batching), driven
    from ONE thread (``server/scheduler.py``)::

        slot = engine.acquire_slot(prompt)          # None: every slot is busy, keep the request queued
        gen = engine.start(prompt, params, slot)    # raises ContextOverflowError, LocalrunError
        while not gen.done:
            for g, chunk in engine.step([gen, ...]):  # one decode for all; chunk.finish_reason on the last
                ...
        engine.release(gen, keep_kv=True)           # keep_kv=False: a cancelled or failed request

    ``interrupt()`` is the one method any thread may call (a signal handler too).
    """

    n_parallel: int  # sequences decoded together (slots)
    n_vocab: int  # vocabulary size, tokens; valid ids are 0..n_vocab-1
    serial: bool  # True: requests run one at a time (SerialEngine), never batched together

    def acquire_slot(self, prompt: Sequence[int]) -> object | None:
        """A free slot for ``prompt`` (the one whose cached tokens share the longest prefix with it), or
        None when every slot is busy."""
        ...

    def start(self, prompt: Sequence[int], params: SamplingParams, slot: object | None = None) -> Generation:
        """Take ``slot`` (or acquire one) for ``prompt``, reusing its cached prefix; no model work yet.
        Raises ContextOverflowError (no room to generate), LocalrunError (a bad token id, a grammar the
        backend lacks), BackendError (no free slot)."""
        ...

    def step(self, gens: Sequence[Generation]) -> list[tuple[Generation, Chunk]]:
        """One forward pass for the running ``gens`` → the chunks it produced, in order (one per token: with
        speculative decoding a generation may get several; one still prefilling may get none). Raises
        BackendError (the decode failed), KeyboardInterrupt (``interrupt()`` cut a prefill short; every
        slot stays consistent)."""
        ...

    def release(self, gen: Generation, *, keep_kv: bool = True) -> None:
        """Free ``gen``'s slot. ``keep_kv`` keeps its tokens' KV as prefix cache for later prompts."""
        ...

    def kv_cells_used(self) -> int:
        """Tokens held in the KV cache over all slots."""
        ...

    def interrupt(self) -> None:
        """From any thread: make a ``step`` in progress return early (raising KeyboardInterrupt in the
        driving thread), where the backend can; otherwise the step ends on its own."""
        ...


@runtime_checkable
class SingleStreamEngine(Engine, Protocol):
    """An ``Engine`` with one sequence and one KV cache that it reuses across generations (MLX), as
    ``SerialEngine`` wraps it: ``generate(tokens)`` opens a generator that prefills on its first
    ``next()``; closing it early stops decoding and leaves the engine usable."""

    n_vocab: int

    def reuse_prefix(self, prompt: list[int]) -> int:
        """Trim the cache to the longest prefix it shares with ``prompt`` → that length (tokens,
        < ``len(prompt)``); a later ``generate(prompt)`` then prefills only the rest."""
        ...

    def reset_cache(self) -> None:
        """Drop the cached KV."""
        ...

    def kv_cells_used(self) -> int:
        """Tokens held in the cache."""
        ...


class SpeculationTarget(Protocol):
    """What an engine's speculative decoding reads of the engine it drafts for (``spec_decode.py``'s
    ``EngineSpeculation`` and each backend's side of it): the plan and the step's token budget."""

    plan: Any  # offload.plan.Plan: n_gpu_layers (a GPU is memory-bound: drafted tokens cost little), …
    n_ctx: int  # context window per sequence, tokens
    n_batch: int  # tokens one forward pass takes at most


class BatchSpeculationTarget(SpeculationTarget, Protocol):
    """The llama.cpp side (``llamacpp/spec.py Speculation``): after a verify step's ``llama_decode``, each
    position's logits row, and the end-of-generation ids (``ignore_eos`` bans them in the sampled rule)."""

    @property
    def eog_ids(self) -> tuple[int, ...]: ...

    def logits_row(self, idx: int) -> Any:
        """Logits row ``idx`` of the last decode: float32 ``[n_vocab]``."""
        ...


class StreamSpeculationTarget(SpeculationTarget, Protocol):
    """The MLX side (``mlx/spec.py``): one sequence fed a few tokens at a time through its prompt cache, and
    cut back when drafts are rejected; a draft model is another such engine. ``configure_speculation`` sets
    ``speculation``; a draft model's vocabulary is checked on ``spec`` (GGUF header) and ``tokenizer``."""

    mx: Any  # the mlx.core module
    cpu_dequantized: bool  # weights dequantized for the CPU (decode is compute-bound there)
    spec: ModelSpec | None  # the GGUF header; None for an MLX folder
    tokenizer: Any  # the Hugging Face tokenizer
    speculation: Any  # mlx.spec.MlxSpeculation, None = off

    @property
    def prompt_cache(self) -> list | None:
        """mlx-lm's per-layer caches (None before the first prompt)."""
        ...

    def feed(self, tokens: Sequence[int], *, rows: int = 1) -> Any:
        """Run ``tokens`` through the model into the prompt cache → the last ``rows`` logits rows."""
        ...

    def rewind(self, n_tokens: int) -> bool:
        """Cut the last ``n_tokens`` off the prompt cache → whether it could."""
        ...

    def reuse_prefix(self, prompt: list[int]) -> int:
        """Trim the cache to the longest prefix it shares with ``prompt`` → that length."""
        ...

    def close(self) -> None: ...
