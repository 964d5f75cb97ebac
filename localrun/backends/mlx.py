"""MLX backend on ``mlx`` + ``mlx-lm``: Apple Silicon's GPU through Metal, or the CPU with ``mlx[cpu]``.

``MlxEngine`` speaks the same ``Engine`` protocol as ``LlamaCppEngine`` (``base.py``): tokenize /
detokenize / apply_chat_template, and ``generate``/``chat`` generators yielding ``Chunk``s whose last one
carries ``finish_reason`` and ``Stats``. It loads

* an **MLX model folder** (config.json + safetensors + tokenizer, as mlx-community publishes them)
  through ``mlx_lm.load``;
* a **GGUF file**, converted in memory by ``mlx_gguf`` (natively for F16/Q4_0/Q4_1/Q8_0, dequantized
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

**What ``serve`` does on MLX**: there is no multi-sequence ``step()`` here (a ``SingleStreamEngine``, not a
``BatchEngine``), so ``backends.as_batch_engine`` wraps it in ``SerialEngine`` and the server runs requests
one at a time through ``generate`` (a queue; the next request starts when the previous one's
generator is finished or closed). Closing a generator early (client disconnect, Ctrl-C) stops decoding
and leaves the engine usable: the KV of what was decoded stays cached and is reused by the next request
when it shares the prefix. Starting a new generation while an old generator is still open closes the
old one first. Not thread-safe: one thread drives the engine.
"""

from __future__ import annotations

import json
import os
import time
from typing import Iterator, Sequence

from localrun.backends.base import Chunk, Message, SamplingParams, Stats, TokenLogprob
from localrun.backends.control import build_control
from localrun.backends.text import TextStream, common_prefix
from localrun.errors import (
    BackendError,
    BackendUnavailableError,
    ContextOverflowError,
    ModelNotFoundError,
)

# end-of-generation tokens by text, as llama.cpp's vocabulary marks them (src/llama-vocab.cpp, special_eog_ids)
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
             "<|end_of_text|>", "<｜end▁of▁sentence｜>", "<|return|>", "<|call|>")


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
    Silicon; ``force`` skips that refusal. Raises BackendUnavailableError, ModelNotFoundError,
    UnsupportedArchitectureError, ModelFormatError, InsufficientMemoryError, BackendError.
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
        self.conversion_note = ""
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
        if is_dir:
            self._load_folder()
        else:
            self._load_gguf(dtype)
        if cpu_dequantize is None:
            cpu_dequantize = not mx.metal.is_available()
        if cpu_dequantize:
            # mlx[cpu] has no SIMD kernel for quantized matmuls (≈5× slower than float32 GEMV on this
            # machine), so on the CPU the weights are expanded to float32 once (exact: w = scale·q + bias)
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
        self.eog_ids = set(self._eos_ids)
        vocab = hf.get_vocab()
        # gpt-oss (harmony): <|end|> closes a message, <|return|>/<|call|> end the turn (llama-vocab.cpp does the same)
        harmony = "<|return|>" in vocab and "<|call|>" in vocab
        eog_texts = [t for t in EOG_TEXTS if not (t == "<|end|>" and harmony)]
        self.eog_ids.update(vocab[t] for t in eog_texts if t in vocab)
        if hf.eos_token_id is not None:
            self.eog_ids.add(hf.eos_token_id)
        src = chat_template or self._template_src
        self._template = ChatTemplate(src, bos_token=self.bos_text, eos_token=self.eos_text) if src else None
        self._special_ids = set(hf.all_special_ids)
        self._pieces: list[bytes] | None = None
        self._piece_table()
        self._cache = None
        self._cache_tokens: list[int] = []
        self._active = None  # the open generator, closed when a new generation starts
        self._active_tag: object | None = None

    # ------------------------------------------------------------------ loading
    def _load_folder(self) -> None:
        import mlx_lm

        try:
            model, wrapper, config = mlx_lm.load(self.model_path, return_config=True)
        except (FileNotFoundError, ValueError, KeyError) as e:
            raise BackendError(f"mlx-lm could not load the MLX folder {self.model_path}: {e}",
                               hint="an MLX folder holds config.json, *.safetensors and tokenizer files "
                               "(mlx-community on Hugging Face); for a .gguf give the file") from None
        self.model, self.config = model, config
        self.tokenizer = wrapper._tokenizer
        self._eos_ids = set(wrapper.eos_token_ids or ())
        self._template_src = self.tokenizer.chat_template if isinstance(self.tokenizer.chat_template, str) else None
        self._manual_bos = False
        self.add_bos = None
        self.conversion_note = "MLX folder"

    def _load_gguf(self, dtype: str | None) -> None:
        from localrun.backends.mlx_gguf import load_gguf

        try:
            self.model, conv = load_gguf(self.model_path, self.spec, dtype=dtype)
        except (ValueError, KeyError) as e:
            raise BackendError(f"MLX could not build {os.path.basename(self.model_path)}: {e}",
                               hint="use --backend llamacpp for this file") from None
        self.config = conv.config
        self.tokenizer = conv.tokenizer
        self._eos_ids = {conv.config["eos_token_id"]} if "eos_token_id" in conv.config else set()
        self._template_src = conv.chat_template
        self._manual_bos = True
        self.add_bos = conv.add_bos
        self.conversion_note = conv.note

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
        """Bytes of every token, as llama.cpp's ``token_to_piece(special=False)`` writes them: byte-level
        BPE letters mapped back to bytes, SentencePiece ``▁`` → space and ``<0xNN>`` → the byte,
        control tokens → nothing."""
        if self._pieces is not None:
            return self._pieces
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        hf = self.tokenizer
        toks = hf.convert_ids_to_tokens(list(range(len(hf))))
        dec = json.dumps(json.loads(hf.backend_tokenizer.to_str()).get("decoder") or {})
        byte_level = "ByteLevel" in dec
        inv = {c: b for b, c in bytes_to_unicode().items()}
        out: list[bytes] = []
        for i, t in enumerate(toks):
            if t is None or i in self._special_ids:
                out.append(b"")
            elif byte_level:
                out.append(bytes(inv[c] for c in t) if all(c in inv for c in t) else t.encode())
            elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                out.append(bytes([int(t[3:5], 16)]))
            else:
                out.append(t.replace("\u2581", " ").encode())
        self._pieces = out
        return out

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
            from localrun.backends.dry import breaker_ids
            from localrun.backends.llamacpp_sampling import DRY_SEQUENCE_BREAKERS

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
        """``sample(logprobs [1, vocab], key) -> token [1]`` in llama.cpp's order (top-k, top-p, min-p on
        the untempered distribution, then temperature; mlx_lm.sample_utils filters)."""
        mx = self.mx
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        if p.temperature <= 0:
            return lambda lp, key: mx.argmax(lp, axis=-1)
        inv_t = 1.0 / float(p.temperature)

        def sample(lp, key):
            if p.top_k > 0:
                lp = apply_top_k(lp, int(p.top_k))
            if 0 < p.top_p < 1:
                lp = apply_top_p(lp, float(p.top_p))
            if p.min_p > 0:
                lp = apply_min_p(lp, float(p.min_p))
            return mx.random.categorical(lp * inv_t, key=key)

        return sample

    def make_processors(self, p: SamplingParams) -> list:
        """mlx-lm logits processors for logit bias and the repetition/presence/frequency penalties."""
        from mlx_lm.sample_utils import make_logits_processors

        bias = {int(k): float(v) for k, v in p.logit_bias.items()}
        if p.ignore_eos:
            bias.update((t, float("-inf")) for t in self.eog_ids)
        n = self.n_ctx if p.repeat_last_n < 0 else p.repeat_last_n  # -1: the whole context, as llama.cpp
        procs = make_logits_processors(
            logit_bias=bias or None,
            repetition_penalty=p.repeat_penalty if p.repeat_penalty != 1.0 and n else None,
            repetition_context_size=n,
            presence_penalty=p.presence_penalty or None, presence_context_size=n,
            frequency_penalty=p.frequency_penalty or None, frequency_context_size=n)
        if p.dry_multiplier > 0:
            from localrun.backends.dry import DrySampler

            procs.append(DrySampler(self, p))
        return procs

    # ------------------------------------------------------------------ prompt cache
    @property
    def cached_tokens(self) -> list[int]:
        """The tokens whose KV the cache holds (a copy)."""
        return list(self._cache_tokens)

    def kv_cells_used(self) -> int:
        """Tokens whose KV the cache holds."""
        return len(self._cache_tokens)

    def reuse_prefix(self, prompt: list[int]) -> int:
        """Trim the KV cache to the longest prefix it shares with ``prompt``; return its length (< len(prompt),
        so at least the last prompt token is decoded again for its logits)."""
        from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

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
        """The generation loop; ``ctl``: its ``TokenControl`` or None (free)."""
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
        t_first = t_prefill = 0.0
        def forward(toks: list[int]):
            nonlocal key
            logits = self.model(mx.array(toks)[None], cache=self._cache)[:, -1, :]
            self._cache_tokens.extend(toks)  # the cache offset advanced with the graph
            logprobs = raw = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            if procs:  # penalties, DRY, bias: they steer the choice; reported logprobs stay the model's own
                hist = mx.array(self._cache_tokens)
                for proc in procs:
                    logits = proc(hist, logits)
                logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            if ctl is not None:
                mx.async_eval(logprobs)  # the forward pass runs while the control works out its answer
                forced = ctl.forced()
                if forced is not None:  # emitted without sampling; this pass only puts ``toks`` in the cache
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
                         n_ctx=self.n_ctx)

        try:
            rest = prompt[n_keep:]
            while len(rest) > 1:  # chunked prefill of all but the last prompt token
                chunk = rest[:min(self.n_batch, len(rest) - 1)]
                self.model(mx.array(chunk)[None], cache=self._cache)
                self._cache_tokens.extend(chunk)
                mx.eval([c.state for c in self._cache])
                rest = rest[len(chunk):]
            y, lp = forward(rest)
            mx.async_eval(y, lp)
            while True:
                tok = int(y.item())
                now = time.perf_counter()
                if not generated:
                    t_first = t_prefill = now
                generated.append(tok)
                eog = self.is_eog(tok)
                tlp = self._logprob(tok, lp, p.logprobs) if p.logprobs is not None and not eog else None
                # the text pipeline shared with llama.cpp: UTF-8, stop strings, max_tokens, context full, loops
                out, finish = stream.push(tok, b"" if eog else self.token_bytes(tok, p.render_special), eog=eog,
                                          n_ctx_used=len(self._cache_tokens))
                if ctl is not None:
                    ctl.accept(tok)
                    if finish is None and ctl.complete():
                        rest, finish = stream.finish("stop")
                        out += rest
                if finish is not None:
                    yield Chunk(text=out, token_id=tok, finish_reason=finish, stats=stats(),
                                logprobs=[tlp] if tlp else None)
                    return
                y, lp = forward([tok])  # queue the next token before handing this one out
                mx.async_eval(y, lp)
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

    def _logprob(self, tok: int, lp, top_n: int) -> TokenLogprob:
        import numpy as np

        v = np.array(lp[0].astype(self.mx.float32))
        piece = self.token_bytes(tok)
        top = np.argsort(-v)[:top_n] if top_n else []
        return TokenLogprob(token=piece.decode("utf-8", errors="replace"), logprob=float(v[tok]),
                            bytes=list(piece), top=[(self.detokenize([int(t)]), float(v[t])) for t in top],
                            token_id=tok, top_ids=[int(t) for t in top])

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
        self._cache, self._cache_tokens = None, []
        self.model = None
        mx = getattr(self, "mx", None)
        if mx is not None:
            mx.clear_cache()
