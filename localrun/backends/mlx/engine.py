"""MLX backend on ``mlx`` + ``mlx-lm``: Apple Silicon's GPU through Metal, or the CPU with ``mlx[cpu]``.

``MlxEngine`` speaks the same ``Engine`` protocol as ``LlamaCppEngine`` (``base.py``): tokenize /
detokenize / apply_chat_template, and ``generate``/``chat`` generators yielding ``Chunk``s whose last one
carries ``finish_reason`` and ``Stats``. It loads (``mlx/load.py``)

* an **MLX model folder** (config.json + safetensors + tokenizer, as mlx-community publishes them)
  through ``mlx_lm.load``;
* a **GGUF file**, converted in memory by ``mlx.gguf`` (natively for F16/Q4_0/Q4_1/Q8_0, dequantized
  and re-quantized for K-quants: see its docstring for the quality note).

Generation is one sequence with one KV cache (mlx-lm's ``make_prompt_cache``): the engine remembers
which tokens the cache holds, and a new prompt that extends them (the next turn of a chat, the same
system prompt) only prefills the new tokens; otherwise the cache is trimmed back to the common prefix
(``trim_prompt_cache``) or, for caches that cannot be trimmed (a sliding-window ``RotatingKVCache``
that has wrapped), rebuilt. The decode loop follows ``mlx_lm.generate.generate_step``: the next
forward pass is queued with ``mx.async_eval`` before the current token is handed out.

Sampling follows llama.cpp's chain order (common/sampling.cpp): logit bias, penalties, top-k, top-p,
min-p, temperature, then a categorical draw from ``mx.random`` keyed by ``seed`` (greedy when
temperature <= 0). GBNF grammars are llama.cpp-only (BackendUnavailableError). A token control
(``backends/control.py``: reasoning budget, constraints) forces tokens or masks the logits before the draw.

**Speculative decoding** (``set_speculation``, ``mlx/spec.py``): prompt lookup or a draft model; a step
feeds the pending token and the drafted ones together and keeps the drafts the target's own samples agree
with, so the text is that of plain decoding. **Prompt-cache tiers** (``kv_cache`` set by
``mlx.cache.attach_mlx_kv_cache``): the cache is saved to RAM/disk before a prompt cuts it, and a saved
prefix is restored when it covers more of a new prompt.

**What ``serve`` does on MLX**: this engine holds one sequence (a ``SingleStreamEngine``);
``backends.as_batch_engine`` gives the server ``mlx/batch.py MlxBatchEngine``, which batches several
sequences on this engine's model, tokenizer and sampling pieces (``make_sampler``, ``make_processors``,
``token_logprob``, ``reuse_prefix`` for each slot's cache), or ``SerialEngine`` (requests one at a time
through ``generate``) when the caches cannot batch or speculation is on. Closing a generator early (client
disconnect, Ctrl-C) stops decoding and leaves the engine usable: the KV of what was decoded stays cached and
is reused by the next request when it shares the prefix. Starting a new generation while an old generator is
still open closes the old one first. Not thread-safe: one thread drives the engine.
"""

from __future__ import annotations

import os
import time
from typing import Iterator, Sequence

from localrun.backends.base import Chunk, Message, SamplingParams, Stats, TokenLogprob
from localrun.backends.control import build_control
from localrun.backends.mlx.load import dequantize_pays, end_of_generation_ids, load_folder, load_gguf
from localrun.backends.text import TextStream, common_prefix
from localrun.errors import (
    BackendError,
    BackendUnavailableError,
    ContextOverflowError,
    ModelNotFoundError,
)


def _import_mlx():
    try:
        import mlx.core as mx
        import mlx_lm  # noqa: F401
    except ImportError as e:
        raise BackendUnavailableError(
            f"the MLX backend needs mlx and mlx-lm ({e})",
            hint="pip install 'localrun[mlx]' (on Linux: pip install 'mlx[cpu]' mlx-lm)") from None
    return mx


class MlxEngine:
    """A model loaded in MLX with the parameters of a ``Plan`` (``n_ctx``, ``n_batch`` are used).

    ``hardware`` (a HardwareProfile) is checked by ``choice.check_mlx_memory`` before loading on Apple
    Silicon; ``force`` skips that refusal. ``cpu_dequantize`` None: quantized on Metal; on a CPU float32
    where that multiplies faster here (``load.dequantize_pays``), unless ``LOCALRUN_MLX_DEQUANTIZE`` is ``0``
    (keep quantized) or ``1`` (float32). Raises
    BackendUnavailableError, ModelNotFoundError, UnsupportedArchitectureError, ModelFormatError,
    InsufficientMemoryError, BackendError.
    """

    backend = "mlx"

    def __init__(self, model_path: str, plan, *, chat_template: str | None = None, spec=None,
                 hardware=None, force: bool = False, dtype: str | None = None,
                 cpu_dequantize: bool | None = None) -> None:
        from localrun.backends import choice
        from localrun.model.chat_template import ChatTemplate

        mx = _import_mlx()
        self.mx = mx
        self.model_path = str(model_path)
        self.plan = plan
        self.spec = None
        is_dir = os.path.isdir(self.model_path)
        if not is_dir and not os.path.isfile(self.model_path):
            raise ModelNotFoundError(self.model_path)
        if not is_dir:
            from localrun.model.gguf_info import read_gguf

            self.spec = spec or read_gguf(self.model_path)
            self.spec.check_complete()
        self.wired_limit_bytes = choice.prepare_mlx_memory(plan, self.spec, hardware, force=force,
                                                          folder=self.model_path if is_dir else None)
        t0 = time.perf_counter()
        loaded = load_folder(self.model_path) if is_dir else load_gguf(self.model_path, self.spec, dtype)
        self.model, self.config, self.tokenizer = loaded.model, loaded.config, loaded.tokenizer
        self._manual_bos, self.add_bos, self.conversion_note = loaded.manual_bos, loaded.add_bos, loaded.note
        if cpu_dequantize is None:  # LOCALRUN_MLX_DEQUANTIZE=0/1 overrides (benches compare both)
            env = os.environ.get("LOCALRUN_MLX_DEQUANTIZE", "")
            cpu_dequantize = env == "1" if env in ("0", "1") else (not mx.metal.is_available()
                                                                    and dequantize_pays(self.model))
        if cpu_dequantize:
            # on a CPU whose float32 matmuls beat mlx's quantized kernels (measured: load.dequantize_pays), the
            # weights are expanded to float32 once (exact: w = scale·q + bias)
            from mlx_lm.utils import dequantize_model

            self.model = dequantize_model(self.model)
            mx.eval(self.model.parameters())
        self.cpu_dequantized = bool(cpu_dequantize)
        self.load_s = time.perf_counter() - t0
        max_pos = int(self.config.get("max_position_embeddings") or 0)
        self.n_ctx = int(plan.n_ctx) if not max_pos else min(int(plan.n_ctx), max_pos)
        self.n_batch = max(1, int(getattr(plan, "n_batch", 512) or 512))
        self.n_parallel = 1
        self.n_vocab = int(self.config.get("vocab_size") or len(self.tokenizer))  # tokens
        hf = self.tokenizer
        self.bos_id = hf.bos_token_id
        self.bos_text = hf.bos_token or ""
        self.eos_text = hf.eos_token or ""
        self.eog_ids = end_of_generation_ids(hf, loaded.eos_ids)
        src = chat_template or loaded.template_src
        self._template = ChatTemplate(src, bos_token=self.bos_text, eos_token=self.eos_text) if src else None
        self._special_ids = set(hf.all_special_ids)
        self._pieces: list[bytes] | None = None
        self._piece_table()
        self._cache = None
        self._cache_tokens: list[int] = []
        self._active = None  # the open generator, closed when a new generation starts
        self._active_tag: object | None = None
        self.speculation = None  # mlx.spec.MlxSpeculation: speculative decoding (set_speculation), None = off
        self.kv_cache = None  # mlx.cache.MlxKVCache: RAM/disk prompt-cache tiers (mlx.cache.attach_mlx_kv_cache)

    def set_speculation(self, mode: str = "auto", draft_max: int | None = None,
                        draft_path: str | None = None) -> None:
        """Speculative decoding for the generations started from now on, as ``LlamaCppEngine.set_speculation``
        (``mlx/spec.py``). Raises VocabularyMismatchError,
        LocalrunError (an unknown mode, ``draft`` without a draft model), BackendError."""
        from localrun.backends.mlx.spec import configure_speculation

        def load_draft(path: str) -> MlxEngine:  # the draft: this class, the target's plan and dequantization
            return MlxEngine(path, self.plan, cpu_dequantize=self.cpu_dequantized)

        configure_speculation(self, mode, draft_max, draft_path, load_draft)

    # ------------------------------------------------------------------ model facts
    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    @property
    def template_source(self) -> str | None:
        return self._template.source if self._template is not None else None

    @property
    def supports_tools(self) -> bool:
        from localrun.model.chat_template import template_supports_tools

        return template_supports_tools(self.template_source)

    def is_eog(self, token: int) -> bool:
        return token in self.eog_ids

    # ------------------------------------------------------------------ text <-> tokens
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``. ``parse_special`` reads ``<|im_start|>`` etc. as control tokens;
        ``add_special`` adds BOS when the model wants it (once, even if the text starts with BOS)."""
        backend = self.tokenizer.backend_tokenizer
        old = backend.encode_special_tokens
        backend.encode_special_tokens = not parse_special
        try:
            if self._manual_bos:
                ids = backend.encode(text, add_special_tokens=False).ids
                if add_special and self.add_bos and self.bos_id is not None and not (ids and ids[0] == self.bos_id):
                    ids = [self.bos_id] + ids
            else:
                ids = self.tokenizer.encode(text, add_special_tokens=add_special)
                if len(ids) > 1 and self.bos_id is not None and ids[0] == ids[1] == self.bos_id:
                    ids = ids[1:]  # the template already wrote BOS
        finally:
            backend.encode_special_tokens = old
        return list(ids)

    def _piece_table(self) -> list[bytes]:
        """Bytes of every token (``mlx.sampling.piece_table``), computed once."""
        if self._pieces is None:
            from localrun.backends.mlx.sampling import piece_table

            self._pieces = piece_table(self.tokenizer, self._special_ids)
        return self._pieces

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """The bytes ``token`` writes; a control token writes its text only with ``special`` (as llama.cpp's
        ``token_to_piece(special)``)."""
        table = self._piece_table()
        piece = table[token] if 0 <= token < len(table) else b""
        if special and not piece and token in self._special_ids:
            return (self.tokenizer.convert_ids_to_tokens(token) or "").encode()
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def dry_breakers(self) -> frozenset[int]:
        """Token ids that break a DRY repeat run (llama.cpp's default breakers), computed once."""
        if getattr(self, "_dry_breakers", None) is None:
            from localrun.backends.dry import DRY_SEQUENCE_BREAKERS, breaker_ids

            table = self._piece_table()
            self._dry_breakers = breaker_ids(((t, b.decode("utf-8", errors="replace")) for t, b in enumerate(table)),
                                             DRY_SEQUENCE_BREAKERS)
        return self._dry_breakers

    def apply_chat_template(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, template_kwargs: dict | None = None) -> str:
        from localrun.model.chat_template import render_chat

        return render_chat(self._template, self.model_path, messages,
                           add_generation_prompt=add_generation_prompt, tools=tools, template_kwargs=template_kwargs)

    def tokenize_chat(self, messages: Sequence[Message], *, tools: list[dict] | None = None,
                      add_generation_prompt: bool = True, parse_special_in_content: bool = False,
                      template_kwargs: dict | None = None) -> tuple[str, list[int]]:
        """Render ``messages`` with the chat template → (prompt text, token ids). Only the template's own
        markers become control tokens; message text is always tokenised as text (see
        ``chat_template.chat_prompt_tokens``). ``template_kwargs``: extra template variables
        (``enable_thinking``, ``reasoning_effort``). Raises ChatTemplateError."""
        from localrun.model.chat_template import chat_prompt_tokens

        return chat_prompt_tokens(self._template, self.model_path, messages, self.tokenize,
                                  add_generation_prompt=add_generation_prompt, tools=tools,
                                  parse_special_in_content=parse_special_in_content, template_kwargs=template_kwargs)

    # ------------------------------------------------------------------ sampling
    def make_sampler(self, p: SamplingParams):
        """``sample(logprobs [1, vocab], key) -> token [1]`` (``mlx.sampling.make_sampler``)."""
        from localrun.backends.mlx.sampling import make_sampler

        return make_sampler(self.mx, p)

    def make_processors(self, p: SamplingParams) -> list:
        """mlx-lm logits processors for bias, penalties and DRY (``mlx.sampling.make_processors``)."""
        from localrun.backends.mlx.sampling import make_processors

        return make_processors(self, p)

    # ------------------------------------------------------------------ prompt cache
    @property
    def cached_tokens(self) -> list[int]:
        """The tokens whose KV the cache holds (a copy)."""
        return list(self._cache_tokens)

    @property
    def prompt_cache(self) -> list | None:
        """mlx-lm's per-layer cache objects of the sequence (None before the first generation); they hold
        ``cached_tokens``."""
        return self._cache

    def set_prompt_cache(self, cache: list | None, tokens: Sequence[int]) -> None:
        """Replace the KV cache by ``cache`` (mlx-lm per-layer caches holding exactly ``tokens``; a
        restored snapshot), or empty it (None)."""
        self._cache, self._cache_tokens = cache, list(tokens) if cache is not None else []

    def kv_cells_used(self) -> int:
        """Tokens whose KV the cache holds."""
        return len(self._cache_tokens)

    def reuse_prefix(self, prompt: list[int]) -> int:
        """Trim the KV cache to the longest prefix it shares with ``prompt``; return its length (< len(prompt),
        so at least the last prompt token is decoded again for its logits)."""
        from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

        if self.kv_cache is not None:  # save what the prompt would cut; restore a snapshot that reuses more
            self.kv_cache.admit(self, None, prompt)
        if self._cache is None:
            self._cache, self._cache_tokens = make_prompt_cache(self.model), []
        n = min(common_prefix(self._cache_tokens, prompt), len(prompt) - 1)
        drop = len(self._cache_tokens) - n
        if drop > 0:
            if not (can_trim_prompt_cache(self._cache) and trim_prompt_cache(self._cache, drop) == drop):
                self._cache, self._cache_tokens, n = make_prompt_cache(self.model), [], 0
        del self._cache_tokens[n:]
        return n

    def reset_cache(self) -> None:
        self._cache, self._cache_tokens = None, []

    # ------------------------------------------------------------------ generation
    def generate(self, prompt: str | Sequence[int], params: SamplingParams, *,
                 parse_special: bool = True) -> Iterator[Chunk]:
        """Stream a completion of ``prompt`` (text or token ids), reusing the cached prefix.

        Control-token text in a raw text prompt (``<|im_end|>``) becomes the control token, as in
        llama-server; ``parse_special=False`` reads it as text. Raises ContextOverflowError (prompt does
        not fit ``n_ctx``). Closing the generator early stops decoding; the engine stays usable."""
        if isinstance(prompt, str):
            tokens = self.tokenize(prompt, add_special=True, parse_special=parse_special)
        else:
            tokens = list(prompt)
        return self._start(tokens, params)

    def chat(self, messages: Sequence[Message], params: SamplingParams,
             tools: list[dict] | None = None) -> Iterator[Chunk]:
        """Render with the chat template (message text stays text: ``tokenize_chat``), then generate."""
        return self._start(self.tokenize_chat(messages, tools=tools)[1], params)

    def _start(self, tokens: list[int], params: SamplingParams) -> Iterator[Chunk]:
        if not tokens:
            tokens = [self.bos_id] if self.bos_id is not None else self.tokenize(" ", add_special=False)
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(len(tokens), self.n_ctx)
        if params.grammar:
            raise BackendUnavailableError("GBNF grammars are supported by the llama.cpp backend only",
                                          hint="use --backend llamacpp for grammar-constrained output")
        ctl = build_control(self, params)  # forced tokens, masks (backends/control.py); raises before any work
        if self._active is not None:
            self._active.close()  # its finally block leaves the cache consistent
        tag = object()
        gen = self._run(tokens, params, tag, ctl)
        self._active, self._active_tag = gen, tag
        return gen

    def _run(self, prompt: list[int], params: SamplingParams, tag: object, ctl=None) -> Iterator[Chunk]:
        """The generation loop; ``ctl``: its ``TokenControl`` or None (free).

        Each step feeds the pending token, plus the drafted ones when speculating (``mlx/spec.py``), and
        gives one logits row per fed token. Row ``m`` is sampled only after the token of row ``m - 1`` was
        emitted (so penalties, the token control and the seeded key see exactly what plain decoding shows
        them) and is used only while the emitted tokens equal the drafted ones."""
        mx = self.mx
        p = params
        t_start = time.perf_counter()
        sampler = self.make_sampler(p)
        procs = self.make_processors(p)
        seed = p.seed if p.seed is not None else int.from_bytes(os.urandom(4), "little")
        key = mx.random.key(int(seed) & 0xFFFFFFFF)
        neg_inf = mx.array(float("-inf"))
        n_keep = self.reuse_prefix(prompt)
        generated: list[int] = []
        stream = TextStream(p, self.n_ctx)
        spec = self.speculation.begin(prompt, p) if self.speculation is not None else None
        t_first = t_prefill = 0.0

        def pick(logits, n_hist: int):
            """Sample from ``logits`` [1, vocab], the row after the cache's first ``n_hist`` tokens →
            (token [1], the model's own logprobs [1, vocab])."""
            nonlocal key
            logprobs = raw = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            if procs:  # penalties, DRY, bias: they steer the choice; reported logprobs stay the model's own
                hist = mx.array(self._cache_tokens[:n_hist])
                for proc in procs:
                    logits = proc(hist, logits)
                logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            if ctl is not None:
                mx.async_eval(logprobs)  # the forward pass runs while the control works out its answer
                forced = ctl.forced()
                if forced is not None:  # emitted without sampling
                    return mx.array([forced]), raw
                allowed = ctl.mask()
                if allowed is not None:
                    logprobs = mx.where(mx.array(allowed[: logprobs.shape[-1]])[None], logprobs, neg_inf)
            key, sub = mx.random.split(key)
            return sampler(logprobs, sub), raw

        def stats() -> Stats:
            now = time.perf_counter()
            return Stats(prompt_tokens=len(prompt), cached_tokens=n_keep, completion_tokens=len(generated),
                         ttft_s=(t_first or now) - t_start, prefill_s=(t_prefill or now) - t_start,
                         decode_s=max(0.0, now - (t_first or now)), n_ctx_used=len(self._cache_tokens),
                         n_ctx=self.n_ctx, draft_tokens=spec.draft_tokens if spec is not None else 0,
                         accepted_tokens=spec.accepted_tokens if spec is not None else 0)

        try:
            draft: list[int] = []  # the tokens drafted in this step (fed after the pending one)
            m = 0  # the row being sampled: m drafted tokens of this step were accepted
            rows = self.feed(prompt[n_keep:])
            base = len(self._cache_tokens) - 1  # cache tokens before this step's pending token
            y, lp = pick(rows, base + 1)
            mx.async_eval(y, lp)
            while True:
                tok = int(y.item())
                now = time.perf_counter()
                if not generated:
                    t_first = t_prefill = now
                generated.append(tok)
                eog = self.is_eog(tok)
                tlp = self.token_logprob(tok, lp, p.logprobs) if p.logprobs is not None and not eog else None
                # the text pipeline shared with llama.cpp: UTF-8, stop strings, max_tokens, context full, loops
                out, finish = stream.push(tok, b"" if eog else self.token_bytes(tok, p.render_special), eog=eog,
                                          n_ctx_used=base + 1 + m)
                if ctl is not None:
                    ctl.accept(tok)
                    if finish is None and ctl.complete():
                        rest, finish = stream.finish("stop")
                        out += rest
                if finish is not None:
                    if spec is not None and draft:
                        self.speculation.record(spec, m)
                    yield Chunk(text=out, token_id=tok, finish_reason=finish, stats=stats(),
                                logprobs=[tlp] if tlp else None)
                    return
                if m < len(draft) and tok == draft[m]:  # the target picked the drafted token: next row is valid
                    m += 1
                    y, lp = pick(rows[m:m + 1], base + 1 + m)
                else:  # the step is over; ``tok`` is the next pending token
                    if spec is not None:
                        n_left = p.max_tokens - len(generated) if p.max_tokens is not None else self.n_ctx
                        draft, rows = self.speculation.step(spec, tok, draft, m, prompt + generated, n_left)
                    else:
                        draft, rows = [], self.feed([tok])
                    m, base = 0, len(self._cache_tokens) - len(draft) - 1
                    y, lp = pick(rows[:1], base + 1)
                mx.async_eval(y, lp)  # queue the next token before handing this one out
                yield Chunk(text=out, token_id=tok, logprobs=[tlp] if tlp else None)
        except ContextOverflowError:
            raise
        except (RuntimeError, ValueError) as e:  # MLX errors (out of memory, shape) come as these
            self.reset_cache()
            raise BackendError(f"MLX generation failed: {e}",
                               hint="lower --ctx, or use --backend llamacpp") from None
        finally:
            if self._active_tag is tag:
                self._active, self._active_tag = None, None
            if self._cache is not None and any(c.offset != len(self._cache_tokens) for c in self._cache):
                self.reset_cache()  # never reuse a cache whose contents are not what we think

    def feed(self, tokens: Sequence[int], *, rows: int = 1):
        """Run ``tokens`` through the model on top of the KV cache (``reuse_prefix`` first): all but the last
        ``rows`` in chunks of ``n_batch`` (evaluated), then the last ``rows`` in one pass → their logits,
        ``mx.array [rows, vocab]`` (lazy). The cache and ``cached_tokens`` then hold ``tokens`` too."""
        mx = self.mx
        toks = list(tokens)
        while len(toks) > rows:  # chunked prefill
            chunk = toks[:min(self.n_batch, len(toks) - rows)]
            self.model(mx.array(chunk)[None], cache=self._cache)
            self._cache_tokens.extend(chunk)
            mx.eval([c.state for c in self._cache])
            toks = toks[len(chunk):]
        logits = self.model(mx.array(toks)[None], cache=self._cache)[0]
        self._cache_tokens.extend(toks)  # the cache offset advanced with the graph
        return logits

    def rewind(self, n_tokens: int) -> bool:
        """Drop the last ``n_tokens`` from the KV cache (rejected drafts) → whether it could (a sliding-window
        cache that has wrapped cannot be cut: the cache is then emptied)."""
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        if n_tokens <= 0:
            return True
        if can_trim_prompt_cache(self._cache) and trim_prompt_cache(self._cache, n_tokens) == n_tokens:
            del self._cache_tokens[len(self._cache_tokens) - n_tokens:]
            return True
        self.reset_cache()
        return False

    def token_logprob(self, tok: int, lp, top_n: int) -> TokenLogprob:
        """``tok``'s logprob and the ``top_n`` most likely alternatives, from ``lp`` (the model's logprobs,
        ``mx.array [1, vocab]``)."""
        import numpy as np

        v = np.array(lp[0].astype(self.mx.float32))
        piece = self.token_bytes(tok)
        top = [int(t) for t in np.argsort(-v)[:top_n]] if top_n else []
        return TokenLogprob(token=piece.decode("utf-8", errors="replace"), logprob=float(v[tok]), bytes=list(piece),
                            top=[(self.detokenize([t]), float(v[t])) for t in top], token_id=tok, top_ids=top,
                            top_bytes=[list(self.token_bytes(t)) for t in top])

    def logits(self, tokens: Sequence[int]):
        """Teacher-forced logits for every position of ``tokens`` (fresh cache): ``mx.array [n, vocab]``."""
        from mlx_lm.models.cache import make_prompt_cache

        out = self.model(self.mx.array(list(tokens))[None], cache=make_prompt_cache(self.model))[0]
        self.mx.eval(out)
        return out

    def close(self) -> None:
        if getattr(self, "_active", None) is not None:
            try:
                self._active.close()
            except Exception:
                pass
            self._active = None
        if getattr(self, "kv_cache", None) is not None and getattr(self, "model", None) is not None:
            self.kv_cache.persist(self)  # the cache to the RAM tier, the RAM tier to disk
        if getattr(self, "speculation", None) is not None:
            self.speculation.close()
            self.speculation = None
        self._cache, self._cache_tokens = None, []
        self.model = None
        mx = getattr(self, "mx", None)
        if mx is not None:
            mx.clear_cache()
