"""llama.cpp backend on llama-cpp-python's low-level C API (``llama_cpp.llama_cpp``).

Why not ``llama_cpp.Llama``: its streamed completion copies the logits to NumPy for every token and
samples in Python (≈ 42 tok/s for SmolLM2 here, against ≈ 62 for llama-bench), it holds one sequence,
and its constructor takes 45 parameters. This engine drives ``llama_decode`` with llama.cpp's own
sampler chain (``llama_sampler_chain_*``), as ``examples/simple`` and ``tools/server`` do, and decodes
several sequences in one batch (continuous batching, used by ``localrun serve``):

* a context holds ``plan.n_parallel`` sequences, each with its own KV stream (``n_ctx`` tokens each), the
  running ones kept on consecutive sequence ids so a decode step is one ubatch (``placement.py``);
* each ``Slot`` remembers which tokens its KV holds, so a new prompt that shares a prefix with it (the
  same system prompt, the earlier turns of a chat) only prefills the rest (prefix caching); a model with
  recurrent layers (a hybrid), whose state cannot be cut back, resumes from a context checkpoint instead
  (``checkpoints.py``);
* ``step(gens)`` puts one decode token for every running sequence plus prompt chunks of the ones still
  prefilling into a single ``llama_decode`` (prompts are prefilled in chunks of at most ``n_batch``
  tokens, so running streams keep flowing), then samples each sequence with its own sampler
  (``batch.py``: the step itself, a mixin of the engine).

This module keeps the model and its context (load, close), text and tokens, the chat template, the
sampler factory, and the sequences: how much of its slot's cached prefix a prompt keeps (``start``,
``release``; which slot it takes is ``placement.py``'s ``acquire_slot``).
"""

from __future__ import annotations

import ctypes
import time
from typing import Iterator, Sequence

from localrun.backends.base import Chunk, Message, SamplingParams
from localrun.backends.control import build_control
from localrun.backends.llamacpp.batch import AbortFlag, BatchStep
from localrun.backends.llamacpp.lib import LlamaLog, import_llama, last_errors
from localrun.backends.llamacpp.params import context_params, load_model, model_params, new_context
from localrun.backends.llamacpp.placement import SlotPlacement
from localrun.backends.llamacpp.sampling import plain_greedy
from localrun.backends.llamacpp.seq import Generation, Slot
from localrun.backends.llamacpp.ubatch import StepTotals, UbatchCounter
from localrun.backends.text import TextStream, common_prefix
from localrun.errors import (
    BackendError,
    ContextOverflowError,
    LocalrunError,
    UnsupportedArchitectureError,
)


class LlamaCppEngine(BatchStep, SlotPlacement):
    """A GGUF loaded in llama.cpp with the parameters of a ``Plan``: a ``BatchEngine`` (``base.py``).
    ``mmproj``: a vision projector GGUF loaded with it (``llamacpp/mtmd.py``): chat messages may then carry
    images; ``mmproj_optional``: a projector that does not load is skipped with a warning (one found beside
    the model), else its BackendError is raised.

    Raises BackendUnavailableError (no llama_cpp), UnsupportedArchitectureError, BackendError (load or
    decode failure). Not thread-safe: one thread drives it (chat's loop or the server's scheduler).
    """

    backend = "llamacpp"
    serial = False  # n_parallel sequences are decoded together

    def __init__(self, model_path: str, plan, *, chat_template: str | None = None, spec=None,
                 mmproj: str | None = None, mmproj_optional: bool = False) -> None:
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

        mparams = model_params(C, plan, self.spec)  # llamacpp/params.py: devices, split, weight placement
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
        # LOCALRUN_COUNT_UBATCHES=1: count the passes llama.cpp makes with its eval callback (llamacpp/ubatch.py)
        self._ubatch_counter = UbatchCounter(C) if UbatchCounter.wanted() else None
        if self._ubatch_counter is not None:
            self._ubatch_counter.install(cp)
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
        self.n_ubatch = int(C.llama_n_ubatch(self.ctx))
        self.kv_unified = bool(cp.kv_unified)  # one KV stream for all sequences (any batch is one ubatch)
        self.step_totals = StepTotals(measured=self._ubatch_counter is not None)  # steps, ubatches, moves
        self.n_parallel = n_par
        self.slots = [Slot(seq_id=i) for i in range(n_par)]
        self._prefill_turn = True
        self._steps = 0
        # prompt tokens a step takes while other sequences decode: ≈ 0.3 s of prefill on a 2-core CPU instead
        # of 2.5 s (a GPU prefills a ubatch in milliseconds and takes one whole); nothing decoding, a step takes
        # up to n_batch (2048: prompts that arrive together are prefilled together, batch.py)
        self.prefill_chunk_decoding = min(self.n_batch, self.n_ubatch) if plan.n_gpu_layers != 0 \
            else min(self.n_batch, 128)
        self._batch = C.llama_batch_init(self.n_batch + n_par, 0, 1)
        self._piece = ctypes.create_string_buffer(256)
        self._eog: tuple[int, ...] | None = None
        self._dry_cache: dict = {}  # DRY prototype samplers by setting (llamacpp.sampling.make_sampler)
        self.kv_cache = None  # kv_cache.KVCache: RAM/disk snapshot tiers (kv_cache.attach_kv_cache), None = off
        self.add_bos = bool(C.llama_vocab_get_add_bos(self.vocab))
        self.bos_text = self.spec.token_text(self.spec.bos_token_id) or ""
        self.eos_text = self.spec.token_text(self.spec.eos_token_id) or ""
        src = chat_template or self.spec.chat_template
        self._template = ChatTemplate(src, bos_token=self.bos_text, eos_token=self.eos_text) if src else None
        # a sliding-window cache (without swa_full) drops positions more than n_swa tokens back, so a cached
        # prefix can be cut back (start()) only while the window before the cut is still there
        self.n_swa = 0 if plan.swa_full else max(0, int(C.llama_model_n_swa(self.model)))
        # recurrent layers (a hybrid's delta-net, Mamba, short-conv): their state cannot be cut back, so a
        # cached prefix is reused through context checkpoints (llamacpp/checkpoints.py)
        from localrun.backends.llamacpp.checkpoints import Checkpoints, has_recurrent_state

        self.recurrent = has_recurrent_state(C, self.model)
        self.checkpoints = Checkpoints(self) if self.recurrent else None
        # interrupt(): llama.cpp asks this callback between graph nodes during a prefill (llama_set_abort_callback)
        self._abort = AbortFlag()
        self._abort_cb = C.ggml_abort_callback(self._abort.check)
        self._no_abort_cb = C.ggml_abort_callback()
        self.speculation = None  # llamacpp.spec.Speculation: speculative decoding (set_speculation), None = off
        self.projector = None  # llamacpp.mtmd.Projector: images in (``mmproj``), None = text only
        if mmproj:
            from localrun.backends.llamacpp.mtmd import Projector

            try:
                self.projector = Projector(self, mmproj)
            except BackendError as e:  # a projector found beside the model may be another model's
                if not mmproj_optional:
                    self.close()
                    raise
                import logging

                logging.getLogger("localrun").warning("%s; serving text only", e.message)
            except BaseException:
                self.close()
                raise

    def set_speculation(self, mode: str = "auto", draft_max: int | None = None,
                        draft_path: str | None = None) -> None:
        """Speculative decoding for the generations started from now on (``spec_decode.py``):
        ``mode`` ``auto`` | ``ngram`` | ``draft`` | ``off``; ``draft_max`` tokens per verify step at most;
        ``draft_path`` a GGUF with this model's vocabulary, loaded here with its own context and the plan
        ``offload.plan.draft_plan`` derives from this engine's (on the GPU when ``plan.draft_on_gpu``). Raises
        VocabularyMismatchError (checked on the headers, before loading), LocalrunError (``draft``
        without a draft model, an unknown mode), BackendError (the draft does not load)."""
        from localrun.backends.draft_vocab import check_same_vocab
        from localrun.backends.llamacpp.spec import DraftModel, Speculation, recurrent_spec_error
        from localrun.backends.spec_decode import DRAFT_MAX_DEFAULT

        old = self.speculation
        if old is not None and old.draft is not None:
            old.draft.close()
        self.speculation = None
        if mode == "off":
            return
        if self.recurrent:  # a verify step's rejected drafts would stay folded into the recurrent state
            raise recurrent_spec_error(self.spec.arch)
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
        from localrun.backends.images import images_of, no_projector_error, without_images
        from localrun.backends.llamacpp.prompt_cache import cached_tokenizer
        from localrun.model.chat_template import chat_prompt_tokens

        images = [img for m in messages for img in images_of(m)]
        tokenize = plain = cached_tokenizer(self)  # exact hits and a kept head: llamacpp/prompt_cache.py
        if images:  # each image's place → its tokens (llamacpp/mtmd.py)
            if self.projector is None:
                raise no_projector_error(images[0].part)
            tokenize = self.projector.tokenizer(self.tokenize)
            messages = [without_images(m) for m in messages]
        text, ids = chat_prompt_tokens(self._template, self.model_path, messages, tokenize,
                                       add_generation_prompt=add_generation_prompt, tools=tools,
                                       parse_special_in_content=parse_special_in_content,
                                       template_kwargs=template_kwargs)
        if images:
            ids = self.projector.expand(ids, images)
        if self.checkpoints is not None and not images:  # the last user turn's start: a context checkpoint there
            self.checkpoints.note_turn_start(messages, ids, lambda m: chat_prompt_tokens(
                self._template, self.model_path, m, plain, add_generation_prompt=False, tools=tools,
                parse_special_in_content=parse_special_in_content, template_kwargs=template_kwargs)[1])
        if self.kv_cache is not None:  # the system prompt's end: a KV-tier snapshot boundary
            from localrun.backends.kv_cache import system_prompt_end

            system_prompt_end(self.kv_cache, messages, ids, lambda m: chat_prompt_tokens(
                self._template, self.model_path, m, plain, add_generation_prompt=False, tools=tools,
                parse_special_in_content=parse_special_in_content, template_kwargs=template_kwargs)[1],
                tools=bool(tools))
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
        see ``llamacpp.sampling.make_sampler``)."""
        from localrun.backends.llamacpp.sampling import make_sampler

        if p.ignore_eos and self._eog is None:  # the end-of-generation ids, once per model
            self._eog = tuple(t for t in range(self.n_vocab) if self.C.llama_vocab_is_eog(self.vocab, t))
        return make_sampler(self.C, self.vocab, self.n_vocab, p, self._eog if p.ignore_eos else (), n_ctx=self.n_ctx,
                            dry_cache=self._dry_cache, history=history)

    # ------------------------------------------------------------------ sequences
    # acquire_slot: which slot a prompt takes (prefix reuse, running ids kept consecutive): llamacpp/placement.py

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
        # images: spans of pseudo-tokens (negative ids) the projector knows (llamacpp/mtmd.py)
        images = self.projector.spans(prompt) if self.projector is not None and min(prompt) < 0 else []
        if (min(prompt) < 0 and not images) or max(prompt) >= self.n_vocab:
            bad = next(t for t in prompt if not 0 <= t < self.n_vocab)
            raise LocalrunError(f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})",
                                hint="send token ids this model's tokenizer produced (or text)")
        control = build_control(self, params)  # before the slot is taken: it may raise (a bad constraint)
        slot = slot or self.acquire_slot(prompt)
        if slot is None or slot.busy:
            raise BackendError("no free sequence slot", hint="wait for a running request to finish")
        sampler = self.make_sampler(params, [t for t in prompt if t >= 0] if images else prompt)
        if self.kv_cache is not None:  # save the slot's KV before it is cut; restore a snapshot that reuses more
            self.kv_cache.admit(self, slot, prompt)
        n_keep = common_prefix(slot.tokens, prompt)
        if n_keep == len(prompt):
            n_keep -= 1  # re-decode the last prompt token to get its logits
        n_keep = next((s for s, e in images if s < n_keep < e), n_keep)  # an image's KV is whole or absent
        n_keep = self._cut(slot, n_keep, len(prompt))
        del slot.tokens[n_keep:]
        slot.busy = True
        slot.last_used = time.monotonic()
        # prefix caching: prime the sampler's penalty history with the reused prompt tokens
        spec = self.speculation.begin(prompt, params) if self.speculation is not None and not images else None
        snap_at = self.kv_cache.boundary_in(prompt, n_keep, sliding=self.exact_snapshots) if self.kv_cache else 0
        cps = self.checkpoints
        marks = cps.marks(len(prompt), cps.turn_start_of(prompt)) if cps is not None else ()
        return Generation(slot=slot, prompt=prompt, params=params, sampler=sampler, n_prompt_done=n_keep,
                          cached_tokens=n_keep, t_start=time.perf_counter(), stream=TextStream(params, self.n_ctx),
                          control=control, spec=spec, snapshot_at=snap_at, checkpoint_marks=marks,
                          images=images or None, greedy=plain_greedy(params))

    def _cut(self, slot: Slot, n_keep: int, n_prompt: int) -> int:
        """Cut ``slot``'s sequence back to its first ``n_keep`` tokens, or fewer where the cache cannot cut
        there → the tokens it keeps (0: the sequence is emptied, and the log says why). Recurrent layers:
        through a context checkpoint (``llamacpp/checkpoints.py``); sliding-window layers: only while the
        window before the cut is still held (``_window_kept``)."""
        import logging

        if self.checkpoints is not None:
            return self.checkpoints.cut(slot, n_keep, n_prompt)
        if n_keep < len(slot.tokens) and not self._window_kept(slot, n_keep):
            logging.getLogger("localrun.checkpoints").info(
                "the sliding-window cache no longer holds the %d tokens before %d of %d: prefilling all %d "
                "prompt tokens", self.n_swa, n_keep, len(slot.tokens), n_prompt)
            n_keep = 0
        if not self.C.llama_memory_seq_rm(self.mem, slot.seq_id, n_keep, -1):
            n_keep = 0
            self.C.llama_memory_seq_rm(self.mem, slot.seq_id, 0, -1)
        return n_keep

    @property
    def exact_snapshots(self) -> bool:
        """Whether a KV-tier snapshot resumes only at exactly its end (sliding-window or recurrent layers:
        it cannot be cut back; ``kv_cache.KVCache.best``)."""
        return bool(self.n_swa) or self.recurrent

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
            if self.checkpoints is not None:  # the turn's end: where a later turn that edits the next one resumes
                self.checkpoints.save(slot)
        else:
            self.C.llama_memory_seq_rm(self.mem, slot.seq_id, 0, -1)
            slot.forget()
        if gen.sampler:
            self.C.llama_sampler_free(gen.sampler)
            gen.sampler = None
        slot.busy = False
        slot.last_used = time.monotonic()

    def kv_cells_used(self) -> int:
        return sum(len(s.tokens) for s in self.slots)

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
        if getattr(self, "projector", None) is not None:
            self.projector.close()
            self.projector = None
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
