"""llama.cpp backend on llama-cpp-python's low-level C API (``llama_cpp.llama_cpp``).

Why not ``llama_cpp.Llama``: its streamed completion copies the logits to NumPy for every token and
samples in Python (≈ 42 tok/s for SmolLM2 here, against ≈ 62 for llama-bench), it holds one sequence,
and its constructor takes 45 parameters. This engine drives ``llama_decode`` with llama.cpp's own
sampler chain (``llama_sampler_chain_*``), as ``examples/simple`` and ``tools/server`` do, and decodes
several sequences in one batch (continuous batching, used by ``localrun serve``):

* a context holds ``plan.n_parallel`` sequences, each with its own KV cells (``n_ctx`` tokens each);
* each ``Slot`` remembers which tokens its KV holds, so a new prompt that shares a prefix with it (the
  same system prompt, the earlier turns of a chat) only prefills the rest (prefix caching);
* ``step(gens)`` puts one decode token for every running sequence plus prompt chunks of the ones still
  prefilling into a single ``llama_decode`` (prompts are prefilled in chunks of at most ``n_batch``
  tokens, so running streams keep flowing), then samples each sequence with its own sampler.
"""

from __future__ import annotations

import ctypes
import math
import time
from typing import Iterator, Sequence

from localrun.backends.base import Chunk, Message, SamplingParams, TokenLogprob
from localrun.backends.control import build_control
from localrun.backends.llamacpp_lib import LlamaLog, import_llama, last_errors
from localrun.backends.llamacpp_params import context_params, load_model, model_params, new_context
from localrun.backends.llamacpp_seq import Generation, Slot
from localrun.backends.text import TextStream, common_prefix
from localrun.errors import (
    BackendError,
    ContextOverflowError,
    LocalrunError,
    UnsupportedArchitectureError,
)


class _AbortFlag:
    """What the abort callback reads: ``interrupt()`` (any thread) or Ctrl-C (a SIGINT handler installed
    around a prefill decode on the main thread) sets it; llama.cpp polls ``check`` between graph nodes."""

    def __init__(self) -> None:
        self.requested = False
        self.keyboard = False

    def check(self, _data) -> bool:
        return self.requested

    def on_sigint(self, _signum, _frame) -> None:
        self.requested = self.keyboard = True

    def take(self) -> bool:
        """True (once) when an interrupt was requested; clears it."""
        hit, self.requested, self.keyboard = self.requested, False, False
        return hit


class LlamaCppEngine:
    """A GGUF loaded in llama.cpp with the parameters of a ``Plan``: a ``BatchEngine`` (``base.py``).

    Raises BackendUnavailableError (no llama_cpp), UnsupportedArchitectureError, BackendError (load or
    decode failure). Not thread-safe: one thread drives it (chat's loop or the server's scheduler).
    """

    backend = "llamacpp"
    serial = False  # n_parallel sequences are decoded together

    def __init__(self, model_path: str, plan, *, chat_template: str | None = None, spec=None) -> None:
        from localrun.model.chat_template import ChatTemplate
        from localrun.model.gguf_info import read_gguf

        self.model_path = model_path
        self.plan = plan
        self.spec = spec or read_gguf(model_path)
        self.spec.check_complete()
        self.llama_cpp, C = import_llama()
        self.C = C
        C.llama_backend_init()
        mark = LlamaLog.mark()

        mparams = model_params(C, plan, self.spec)  # llamacpp_params.py: devices, split, weight placement
        self._keep = mparams  # the ctypes arrays the params point into live as long as the model
        self.repacked, self.batch_invariant = mparams.repacked, mparams.batch_invariant
        self._rpc_devices = mparams.rpc_devices
        t0 = time.perf_counter()
        self.model = load_model(C, model_path, mparams)
        if not self.model:
            self._raise_load_error(LlamaLog.since(mark))
        self.vocab = C.llama_model_get_vocab(self.model)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)

        n_par = max(1, int(plan.n_parallel))
        cp = context_params(C, plan)
        self.ctx = new_context(C, self.model, cp)
        if not self.ctx:
            lines = LlamaLog.since(mark)
            C.llama_model_free(self.model)
            self.model = None
            raise BackendError("llama.cpp could not create the context: " + last_errors(lines),
                               hint="lower --ctx, use --kv-type q8_0, or fewer --n-gpu-layers")
        self.load_s = time.perf_counter() - t0
        self.load_log = LlamaLog.since(mark)
        self.mem = C.llama_get_memory(self.ctx)
        # tokens per sequence: llama.cpp's per-stream size, or (unified) an equal share that localrun enforces
        self.n_ctx = int(C.llama_n_ctx_seq(self.ctx)) // (n_par if cp.kv_unified else 1)
        self.n_batch = int(C.llama_n_batch(self.ctx))
        self.n_parallel = n_par
        self.slots = [Slot(seq_id=i) for i in range(n_par)]
        self._prefill_turn = True
        self._steps = 0
        # prompt chunk while other sequences decode: ≈ 0.6 s of prefill on a 2-core CPU instead of 2.5 s
        # (a GPU prefills n_batch tokens in milliseconds and keeps the full chunk)
        self.prefill_chunk_decoding = self.n_batch if plan.n_gpu_layers != 0 else min(self.n_batch, 128)
        self._batch = C.llama_batch_init(self.n_batch + n_par, 0, 1)
        self._piece = ctypes.create_string_buffer(256)
        self._eog: tuple[int, ...] | None = None
        self._dry_cache: dict = {}  # DRY prototype samplers by setting (llamacpp_sampling.make_sampler)
        self.kv_cache = None  # kv_cache.KVCache: RAM/disk snapshot tiers (kv_cache.attach_kv_cache), None = off
        self.add_bos = bool(C.llama_vocab_get_add_bos(self.vocab))
        self.bos_text = self.spec.token_text(self.spec.bos_token_id) or ""
        self.eos_text = self.spec.token_text(self.spec.eos_token_id) or ""
        src = chat_template or self.spec.chat_template
        self._template = ChatTemplate(src, bos_token=self.bos_text, eos_token=self.eos_text) if src else None
        # a sliding-window cache (without swa_full) drops positions more than n_swa tokens back, so a cached
        # prefix can be cut back (start()) only while the window before the cut is still there
        self.n_swa = 0 if plan.swa_full else max(0, int(C.llama_model_n_swa(self.model)))
        # interrupt(): llama.cpp asks this callback between graph nodes during a prefill (llama_set_abort_callback)
        self._abort = _AbortFlag()
        self._abort_cb = C.ggml_abort_callback(self._abort.check)
        self._no_abort_cb = C.ggml_abort_callback()
        self.speculation = None  # llamacpp_spec.Speculation: speculative decoding (set_speculation), None = off

    def set_speculation(self, mode: str = "auto", draft_max: int | None = None,
                        draft_path: str | None = None) -> None:
        """Speculative decoding for the generations started from now on (``spec_decode.py``):
        ``mode`` ``auto`` | ``ngram`` | ``draft`` | ``off``; ``draft_max`` tokens per verify step at most;
        ``draft_path`` a GGUF with this model's vocabulary, loaded here with its own context and the plan
        ``offload.plan.draft_plan`` derives from this engine's (on the GPU when ``plan.draft_on_gpu``). Raises
        VocabularyMismatchError (checked on the headers, before loading), LocalrunError (``draft``
        without a draft model, an unknown mode), BackendError (the draft does not load)."""
        from localrun.backends.llamacpp_spec import DraftModel, Speculation, check_same_vocab
        from localrun.backends.spec_decode import DRAFT_MAX_DEFAULT

        old = self.speculation
        if old is not None and old.draft is not None:
            old.draft.close()
        self.speculation = None
        if mode == "off":
            return
        draft = None
        if draft_path and mode in ("auto", "draft"):
            from localrun.model.gguf_info import read_gguf

            draft_spec = read_gguf(draft_path)
            check_same_vocab(self.spec, draft_spec)
            from localrun.offload.plan import draft_plan

            draft = DraftModel(draft_path, draft_plan(self.plan), spec=draft_spec)
        self.speculation = Speculation(self, mode, DRAFT_MAX_DEFAULT if draft_max is None else draft_max, draft)

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

    def _raise_load_error(self, lines: list[str]):
        text = "\n".join(lines)
        if "unknown model architecture" in text:
            raise UnsupportedArchitectureError(self.spec.arch, "llama.cpp")
        raise BackendError(f"llama.cpp could not load {self.model_path}: {last_errors(lines)}",
                           hint="run with LOCALRUN_DEBUG=1 to see llama.cpp's log")

    # ------------------------------------------------------------------ text <-> tokens
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        C = self.C
        data = text.encode("utf-8")
        if add_special and self.bos_text and parse_special and text.startswith(self.bos_text):
            add_special = False  # the template already wrote BOS; don't double it
        n_max = len(data) + 8
        buf = (C.llama_token * n_max)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (C.llama_token * n_max)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        n = self.C.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            return buf.raw[:n]
        return self._piece.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(self.C.llama_vocab_is_eog(self.vocab, token))

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

        text, ids = chat_prompt_tokens(self._template, self.model_path, messages, self.tokenize,
                                       add_generation_prompt=add_generation_prompt, tools=tools,
                                       parse_special_in_content=parse_special_in_content,
                                       template_kwargs=template_kwargs)
        if self.kv_cache is not None:  # the system prompt's end: a KV-tier snapshot boundary
            from localrun.backends.kv_cache import system_prompt_end

            system_prompt_end(self.kv_cache, messages, ids, lambda m: chat_prompt_tokens(
                self._template, self.model_path, m, self.tokenize, add_generation_prompt=False, tools=tools,
                parse_special_in_content=parse_special_in_content, template_kwargs=template_kwargs)[1])
        return text, ids

    @property
    def eog_ids(self) -> tuple[int, ...]:
        """The vocabulary's end-of-generation token ids (computed once)."""
        if self._eog is None:
            self._eog = tuple(t for t in range(self.n_vocab) if self.C.llama_vocab_is_eog(self.vocab, t))
        return self._eog

    # ------------------------------------------------------------------ sampling
    def make_sampler(self, p: SamplingParams, history: Sequence[int] = ()):
        """llama.cpp sampler chain for ``p``, its penalties primed with ``history`` (the prompt's tokens;
        see ``llamacpp_sampling.make_sampler``)."""
        from localrun.backends.llamacpp_sampling import make_sampler

        if p.ignore_eos and self._eog is None:  # the end-of-generation ids, once per model
            self._eog = tuple(t for t in range(self.n_vocab) if self.C.llama_vocab_is_eog(self.vocab, t))
        return make_sampler(self.C, self.vocab, self.n_vocab, p, self._eog if p.ignore_eos else (), n_ctx=self.n_ctx,
                            dry_cache=self._dry_cache, history=history)

    # ------------------------------------------------------------------ sequences
    def acquire_slot(self, prompt: Sequence[int]) -> Slot | None:
        """The free slot whose cached tokens share the longest prefix with ``prompt`` (LRU on ties)."""
        free = [s for s in self.slots if not s.busy]
        if not free:
            return None
        # longest cached prefix; on ties the lowest id, which keeps busy sequence ids consecutive (cheaper
        # batches, see step()), then least recently used
        return max(free, key=lambda s: (common_prefix(s.tokens, prompt), -s.seq_id, -s.last_used))

    def start(self, prompt: Sequence[int], params: SamplingParams, slot: Slot | None = None) -> Generation:
        """Reserve a slot for ``prompt`` and reuse its longest cached prefix.

        Raises ContextOverflowError when the prompt leaves no room to generate, LocalrunError for a token
        id outside the vocabulary (llama_decode would fail the whole batch), BackendError when no slot is
        free (callers queue instead)."""
        prompt = list(prompt)
        if not prompt:
            prompt = [self.C.llama_vocab_bos(self.vocab)] if self.add_bos else self.tokenize(" ", add_special=True)
        if len(prompt) >= self.n_ctx:
            raise ContextOverflowError(len(prompt), self.n_ctx)
        if min(prompt) < 0 or max(prompt) >= self.n_vocab:
            bad = next(t for t in prompt if not 0 <= t < self.n_vocab)
            raise LocalrunError(f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})",
                                hint="send token ids this model's tokenizer produced (or text)")
        control = build_control(self, params)  # before the slot is taken: it may raise (a bad constraint)
        slot = slot or self.acquire_slot(prompt)
        if slot is None or slot.busy:
            raise BackendError("no free sequence slot", hint="wait for a running request to finish")
        sampler = self.make_sampler(params, prompt)
        if self.kv_cache is not None:  # save the slot's KV before it is cut; restore a snapshot that reuses more
            self.kv_cache.admit(self, slot, prompt)
        n_keep = common_prefix(slot.tokens, prompt)
        if n_keep == len(prompt):
            n_keep -= 1  # re-decode the last prompt token to get its logits
        if n_keep < len(slot.tokens) and not self._window_kept(slot, n_keep):
            n_keep = 0  # the sliding-window cache no longer holds the window before the cut: prefill it all
        if not self.C.llama_memory_seq_rm(self.mem, slot.seq_id, n_keep, -1):
            n_keep = 0
            self.C.llama_memory_seq_rm(self.mem, slot.seq_id, 0, -1)
        del slot.tokens[n_keep:]
        slot.busy = True
        slot.last_used = time.monotonic()
        # prefix caching: prime the sampler's penalty history with the reused prompt tokens
        spec = self.speculation.begin(prompt, params) if self.speculation is not None else None
        snap_at = self.kv_cache.boundary_in(prompt, n_keep, sliding=bool(self.n_swa)) if self.kv_cache else 0
        return Generation(slot=slot, prompt=prompt, params=params, sampler=sampler, n_prompt_done=n_keep,
                          cached_tokens=n_keep, t_start=time.perf_counter(), stream=TextStream(params, self.n_ctx),
                          control=control, spec=spec, snapshot_at=snap_at)

    def _window_kept(self, slot: Slot, n_keep: int) -> bool:
        """Can ``slot``'s KV be cut back to its first ``n_keep`` tokens? Always, without sliding-window
        layers. With them (and no ``swa_full``), the SWA cache keeps only the positions [pos_min, pos_max]
        (llama-kv-cache.cpp apply_ubatch purges what it overwrites), and the token at position n_keep
        attends to the n_swa - 1 before it: the cut is safe when pos_min <= n_keep - n_swa (llama-server's
        threshold, tools/server/server-context.cpp pos_min_thold). A prompt that only extends the cached
        tokens needs no cut and is always reused."""
        if not self.n_swa or n_keep == 0:
            return True
        pos_min = self.C.llama_memory_seq_pos_min(self.mem, slot.seq_id)
        return 0 <= pos_min <= max(0, n_keep - self.n_swa)

    def release(self, gen: Generation, *, keep_kv: bool = True) -> None:
        """Free ``gen``'s slot. ``keep_kv`` keeps the KV of its tokens for prefix reuse; otherwise (a
        cancelled request) its cells are freed at once."""
        slot = gen.slot
        if not slot.busy:
            return
        if keep_kv:
            self.C.llama_memory_seq_rm(self.mem, slot.seq_id, len(slot.tokens), -1)  # drop anything unaccounted
        else:
            self.C.llama_memory_seq_rm(self.mem, slot.seq_id, 0, -1)
            slot.tokens.clear()
        if gen.sampler:
            self.C.llama_sampler_free(gen.sampler)
            gen.sampler = None
        slot.busy = False
        slot.last_used = time.monotonic()

    def kv_cells_used(self) -> int:
        return sum(len(s.tokens) for s in self.slots)

    def step(self, gens: Sequence[Generation]) -> list[tuple[Generation, Chunk]]:
        """One ``llama_decode`` for the running sequences; returns the chunks it produced.

        Either a decode batch (one token for every sequence that is generating, ordered by sequence id)
        or a prefill batch (the next chunk, up to ``n_batch`` tokens, of ONE sequence's prompt, taking
        the prefilling sequences in turn; on the CPU at most ``prefill_chunk_decoding`` tokens while
        others decode); while both kinds are waiting they alternate, so a long prompt is prefilled in
        chunks and running streams keep flowing. Not mixing them matters with one KV stream per sequence:
        llama.cpp then splits a batch into equal per-sequence parts over consecutive sequence ids
        (llama-batch.cpp split_equal), which would cut a prompt mixed with decode tokens into one-token
        pieces. It also keeps a prompt's arithmetic the same whether or not other requests are running.
        """
        batch = self._batch
        n = 0
        outputs: list[tuple[Generation, int]] = []
        decoding = sorted(
            (g for g in gens if not g.done and not g.prefilling and g.pending is not None), key=lambda g: g.slot.seq_id
        )
        waiting = [g for g in gens if not g.done and g.prefilling]
        prefill: list[tuple[Generation, int]] = []
        spec, k = None, 0  # speculation in this step (a decode step only) and its draft length
        if waiting and (not decoding or self._prefill_turn):
            # round-robin over the prompts still prefilling (a new one first): a short request that
            # arrives during a long prompt's prefill waits one chunk, not the whole prompt
            g = min(waiting, key=lambda w: (w.last_prefill, w.t_start))
            self._steps += 1
            g.last_prefill = self._steps
            left = len(g.prompt) - g.n_prompt_done
            take = min(self.n_batch, left)
            if decoding and self.prefill_chunk_decoding < take:
                # streams are waiting on this chunk: a smaller one bounds their stall (on a CPU a prompt
                # token costs the same in a chunk of 64 or 512); never leave a remainder under 32 tokens,
                # whose kernels round differently (outputs stay equal to a solo run's)
                take = self.prefill_chunk_decoding if left - self.prefill_chunk_decoding >= 32 else take
            if g.snapshot_at > g.n_prompt_done:  # a KV-tier boundary (the system prompt's end): stop there
                take = min(take, g.snapshot_at - g.n_prompt_done)
            sid, pos0, toks = g.slot.seq_id, g.n_prompt_done, g.prompt
            for j in range(take):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = toks[pos0 + j], pos0 + j, 1
                batch.seq_id[n][0], batch.logits[n] = sid, 0
                n += 1
            prefill.append((g, take))
            if pos0 + take == len(g.prompt):
                batch.logits[n - 1] = 1
                outputs.append((g, n - 1))
            decoding = []
            self._prefill_turn = False
        else:
            # speculation: K drafted tokens after each sequence's pending one, the same K for all (a batch of
            # equal per-sequence lengths stays one ubatch: llamacpp_spec.py), logits at every position
            spec = self.speculation if decoding and all(g.spec is not None for g in decoding) else None
            k = spec.plan(decoding) if spec is not None else 0
            for g in decoding:
                pos0 = len(g.slot.tokens)
                outputs.append((g, n))
                for j, tok in enumerate([g.pending] + (g.spec.draft if k else [])):
                    batch.token[n], batch.pos[n], batch.n_seq_id[n] = tok, pos0 + j, 1
                    batch.seq_id[n][0], batch.logits[n] = g.slot.seq_id, 1
                    n += 1
            self._prefill_turn = True
        if n == 0:
            return []
        batch.n_tokens = n
        mark = LlamaLog.mark()
        rc = self._decode(batch, abortable=bool(prefill))
        if rc not in (0, 2):
            raise BackendError(
                f"llama_decode failed (code {rc}): " + last_errors(LlamaLog.since(mark)),
                hint="the KV cache is full or memory ran out; lower --parallel or --ctx",
            )
        # bookkeeping first: the KV now holds these tokens (after an abort, those llama.cpp kept)
        for g, take in prefill:
            kept = take if rc == 0 else self.C.llama_memory_seq_pos_max(self.mem, g.slot.seq_id) + 1 - g.n_prompt_done
            g.slot.tokens.extend(g.prompt[g.n_prompt_done : g.n_prompt_done + max(0, min(kept, take))])
            g.n_prompt_done = len(g.slot.tokens)
            if g.snapshot_at and g.n_prompt_done == g.snapshot_at and self.kv_cache is not None:
                self.kv_cache.save(self, g.slot)  # the slot holds exactly prompt[:snapshot_at]
                g.snapshot_at = 0
        for g in decoding:
            g.slot.tokens.append(g.pending)
        if self._abort.take() or rc == 2:
            raise KeyboardInterrupt  # interrupt() or Ctrl-C: the caller's loop stops, as on Ctrl-C between steps
        for g, _ in prefill:  # a prompt done: the draft model's KV too, inside the time to first token
            if g.spec is not None and g.n_prompt_done == len(g.prompt) and self.speculation is not None:
                self.speculation.prompt_done(g)
        events = []
        now = time.perf_counter()
        for g, idx in outputs:
            if g.t_prefill_done == 0.0:
                g.t_prefill_done = now
            if decoding and k:
                events.extend(self._verify(g, idx, now))
                continue
            chunk = self._sample(g, idx, now)
            if g.spec is not None and decoding:
                g.spec.record_shadow(chunk.token_id)
            events.append((g, chunk))
        if decoding and spec is not None:
            spec.finish_step(decoding, k)
        return events

    def _verify(self, g: Generation, idx: int, now: float) -> list[tuple[Generation, Chunk]]:
        """The verify side of a speculative step for ``g``: its rows ``idx .. idx + K`` hold the logits
        after its pending token and after each drafted one. Sample position m as usual (``_sample``: token
        control, sampler chain or the draft-model rule, TextStream); while the token equals draft m, the
        draft's KV cell is kept and position m + 1 is sampled. The cells after the last kept token are
        removed (``llama_memory_seq_rm``). Returns one chunk per emitted token (1 .. K + 1).
        A drafted token that ends the generation (max_tokens, a stop, end of generation) counts as
        accepted too, though its KV cell is dropped like any token never fed back."""
        sp, out = g.spec, []
        m = n_accepted = 0
        while True:
            chunk = self._sample(g, idx + m, now, pick=self.speculation.pick_for(g, m))
            out.append((g, chunk))
            hit = m < len(sp.draft) and chunk.token_id == sp.draft[m]
            n_accepted += hit
            if g.done or not hit:
                break
            g.slot.tokens.append(sp.draft[m])  # its KV, written by this step, is now the sequence's own
            m += 1
        self.C.llama_memory_seq_rm(self.mem, g.slot.seq_id, len(g.slot.tokens), -1)
        sp.record(n_accepted)
        if g.done:  # the closing chunk's stats were taken before this step's drafts were counted
            out[-1][1].stats = g.stats(self.n_ctx)
        return out

    def _decode(self, batch, *, abortable: bool) -> int:
        """``llama_decode``; a prefill (``abortable``) stops between graph nodes when ``interrupt()`` is
        called or Ctrl-C is pressed (return code 2: llama.cpp dropped the unfinished ubatch's positions,
        llama-context.cpp decode). Decode batches take milliseconds and run without the callback."""
        C = self.C
        if not abortable:
            return C.llama_decode(self.ctx, batch)
        import signal
        import threading

        own_sigint = (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        if own_sigint:  # Python runs the handler inside the callback, which then returns True
            signal.signal(signal.SIGINT, self._abort.on_sigint)
        C.llama_set_abort_callback(self.ctx, self._abort_cb, None)
        try:
            return C.llama_decode(self.ctx, batch)
        finally:
            C.llama_set_abort_callback(self.ctx, self._no_abort_cb, None)
            if own_sigint:
                signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt(self) -> None:
        """Stop the engine's current work as Ctrl-C does, from any thread: a prefill ``llama_decode``
        returns between two graph nodes (milliseconds), and ``step`` raises KeyboardInterrupt in the
        thread that drives the engine once its bookkeeping is done (each slot's ``tokens`` still equal
        its KV, so the next request reuses what was prefilled)."""
        self._abort.requested = True

    def _sample(self, g: Generation, idx: int, now: float, pick=None) -> Chunk:
        """Choose ``g``'s next token from logits row ``idx`` (its token control first: a forced token skips
        the sampler, a mask sets the disallowed logits of this row to -inf), then run it through the
        sequence's ``TextStream``. ``pick(idx) -> token`` replaces the sampler chain's choice (the
        draft-model rule of speculative sampling); the chain still accepts the token (its history)."""
        C, p, ctl = self.C, g.params, g.control
        lp = self._logprobs(idx, p.logprobs) if p.logprobs is not None else None  # the model's own, unmasked
        forced = ctl.forced() if ctl is not None else None
        if forced is not None:
            tok = forced
            C.llama_sampler_accept(g.sampler, tok)  # penalty / grammar history, as a sampled token would
        else:
            if ctl is not None:
                self._apply_mask(idx, ctl.mask())
            if pick is None:
                tok = C.llama_sampler_sample(g.sampler, self.ctx, idx)
            else:
                tok = pick(idx)
                C.llama_sampler_accept(g.sampler, tok)
        if ctl is not None:
            ctl.accept(tok)
        if not g.generated:
            g.t_first = now
        g.generated.append(tok)
        g.pending = tok
        eog = self.is_eog(tok)
        piece = b"" if eog else self.token_bytes(tok, p.render_special)
        if lp is not None and not eog:
            lp = [self._token_logprob(tok, piece, lp)]
        elif lp is not None:
            lp = None
        # the text pipeline shared with MLX: UTF-8, stop strings, max_tokens, context full, loops
        out, finish = g.stream.push(tok, piece, eog=eog, n_ctx_used=len(g.slot.tokens))
        if finish is None and ctl is not None and ctl.complete():
            rest, finish = g.stream.finish("stop")
            out += rest
        if finish is None:
            return Chunk(text=out, token_id=tok, logprobs=lp)
        g.finish_reason = finish
        g.pending = None
        return Chunk(text=out, token_id=tok, finish_reason=finish, stats=g.stats(self.n_ctx), logprobs=lp)

    def _apply_mask(self, idx: int, allowed) -> None:
        """Set the logits of row ``idx`` to -inf where ``allowed`` (bool ``[n_vocab]``) is False, in
        llama.cpp's own logits buffer, which ``llama_sampler_sample`` reads next. None: nothing."""
        if allowed is None:
            return
        import numpy as np

        row = np.ctypeslib.as_array(self.C.llama_get_logits_ith(self.ctx, idx), shape=(self.n_vocab,))
        np.copyto(row, -np.inf, where=~allowed)

    def logits_row(self, idx: int):
        """Logits row ``idx`` of the last decode: a float32 ``[n_vocab]`` view of llama.cpp's buffer."""
        import numpy as np

        return np.ctypeslib.as_array(self.C.llama_get_logits_ith(self.ctx, idx), shape=(self.n_vocab,))

    def _logprobs(self, idx: int, top_n: int):
        import numpy as np

        ptr = self.C.llama_get_logits_ith(self.ctx, idx)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)
        m = logits.max()
        logz = m + math.log(np.exp(logits - m).sum())
        logp = logits - logz
        top = np.argsort(-logp)[:top_n] if top_n else []
        return logp, [(int(t), float(logp[t])) for t in top]

    def _token_logprob(self, tok: int, piece: bytes, lp) -> TokenLogprob:
        logp, top = lp
        return TokenLogprob(
            token=piece.decode("utf-8", errors="replace"),
            logprob=float(logp[tok]),
            bytes=list(piece),
            top=[(self.detokenize([t]), v) for t, v in top],
            token_id=tok,
            top_ids=[t for t, _ in top],
        )

    # ------------------------------------------------------------------ single-stream API
    def generate(
        self, prompt: str | Sequence[int], params: SamplingParams, *, parse_special: bool = True
    ) -> Iterator[Chunk]:
        """Stream a completion of ``prompt`` on slot 0 (reusing its cached prefix).

        A raw text prompt is the caller's own format: control-token text in it (``<|im_end|>``) becomes
        the control token, as in llama-server and llama-cpp-python; ``parse_special=False`` reads it as
        text. Closing the generator early (Ctrl-C, a client gone) stops decoding; the KV of what was
        decoded stays cached for the next turn.
        """
        if isinstance(prompt, str):
            tokens = self.tokenize(prompt, add_special=True, parse_special=parse_special)
        else:
            tokens = list(prompt)
        return self._run(tokens, params)

    def chat(
        self, messages: Sequence[Message], params: SamplingParams, tools: list[dict] | None = None
    ) -> Iterator[Chunk]:
        """Render with the chat template (message text stays text: ``tokenize_chat``), then generate."""
        _, tokens = self.tokenize_chat(messages, tools=tools)
        return self._run(tokens, params)

    def _run(self, tokens: list[int], params: SamplingParams) -> Iterator[Chunk]:
        self._abort.take()  # an interrupt() that came while nothing ran is not for this run
        gen = self.start(tokens, params, slot=self.slots[0])
        try:
            while not gen.done:
                for _, chunk in self.step([gen]):
                    yield chunk
        finally:
            if not gen.done:
                gen.cancelled = True
            self.release(gen)

    def close(self) -> None:
        C = getattr(self, "C", None)
        if C is None:
            return
        if getattr(self, "kv_cache", None) is not None and getattr(self, "ctx", None):
            self.kv_cache.persist(self)  # the slots' KV to the RAM tier, the RAM tier to disk
        for s in getattr(self, "slots", []):
            s.busy = False
        for proto in getattr(self, "_dry_cache", {}).values():
            C.llama_sampler_free(proto)
        self._dry_cache = {}
        spec = getattr(self, "speculation", None)
        if spec is not None and spec.draft is not None:
            spec.draft.close()
            self.speculation = None
        if getattr(self, "_batch", None) is not None:
            C.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ctx", None):
            C.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            C.llama_model_free(self.model)
            self.model = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
