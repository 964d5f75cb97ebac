"""The llama.cpp engine's batch step (``LlamaCppEngine.step``, a ``BatchStep`` mixin of it): one
``llama_decode`` for the running sequences, either a prefill chunk of one prompt or one decode token per
generating sequence (plus the drafted tokens of a speculative verify step), then each sequence's token
chosen from its logits row: token control (forced tokens, masks), the sampler chain or speculative
sampling's rule, logprobs, and the text pipeline (``TextStream``).

The engine owns the state this reads and writes (``engine.py``: the context, the ``llama_batch``, the
slots, the prefill round-robin counters, the abort flag); this module holds only how a step uses it.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

from localrun.backends.base import Chunk, TokenLogprob
from localrun.backends.llamacpp.lib import LlamaLog, last_errors
from localrun.backends.llamacpp.seq import Generation
from localrun.backends.llamacpp.ubatch import predict_ubatches
from localrun.errors import BackendError


class AbortFlag:
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


class BatchStep:
    """``step`` and what it calls, as methods of ``LlamaCppEngine`` (the engine's attributes below are set in
    its constructor; ``speculation`` is a ``llamacpp.spec.Speculation`` or None, ``kv_cache`` a
    ``kv_cache.KVCache`` or None)."""

    C: Any  # llama_cpp.llama_cpp
    ctx: Any  # the llama_context
    mem: Any  # its llama_memory
    n_ctx: int
    n_vocab: int
    n_batch: int
    prefill_chunk_decoding: int
    kv_cache: Any
    checkpoints: Any  # llamacpp.checkpoints.Checkpoints (recurrent layers), None without them
    speculation: Any
    projector: Any  # llamacpp.mtmd.Projector (images), None without one
    n_ubatch: int
    kv_unified: bool
    step_totals: Any  # llamacpp.ubatch.StepTotals
    _ubatch_counter: Any  # llamacpp.ubatch.UbatchCounter, None unless LOCALRUN_COUNT_UBATCHES is set

    def step(self, gens: Sequence[Generation]) -> list[tuple[Generation, Chunk]]:
        """One ``llama_decode`` for the running sequences; returns the chunks it produced.

        Either a decode batch (one token for every sequence that is generating, ordered by sequence id)
        or a prefill batch: the next chunks of the waiting prompts, taken in turn (least recently prefilled
        first, a new prompt before all), as many as fit the step's budget (``prefill_budget``: ``n_batch``
        tokens, less while others decode; ``_prefill_take``); while both
        kinds are waiting they alternate, so a long prompt is prefilled in chunks, running streams keep
        flowing and prompts that arrive together are prefilled in the same steps (they start decoding
        together, as llama-server's batch of every waiting prompt does, tools/server ``update_slots``).
        Decode tokens are not put in a prefill batch: with one KV stream per sequence llama.cpp splits a batch
        into equal per-sequence parts over consecutive sequence ids (llama-batch.cpp split_equal), so the
        decode tokens would take a ubatch (a pass over the weights) of their own with one token of each prompt,
        and the prompts' rest others: no pass saved, and a prompt's arithmetic would depend on what else runs.
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
        # a prompt that sits in a hole of the decoding ids and ends in one chunk goes first, out of turn: the
        # decode step after it is one run again (llamacpp/placement.py)
        filler = self.hole_filler(waiting, decoding) if waiting and decoding and not self._prefill_turn else None
        if waiting and (not decoding or self._prefill_turn or filler is not None):
            # round-robin over the prompts still prefilling (a new one first): a short request that
            # arrives during a long prompt's prefill waits one chunk, not the whole prompt. Several prompts
            # share one step up to the step's token budget (``prefill_budget``), so prompts that arrive
            # together start decoding together and the running streams wait one step for all of them, not
            # one step per prompt
            order = sorted(waiting, key=lambda w: (w.last_prefill, w.t_start))
            if filler is not None:
                order.remove(filler)
                order.insert(0, filler)
            self._steps += 1
            budget = self.prefill_budget(len(decoding), len(waiting))
            for g in order:
                take = self._prefill_take(g, n, budget, decoding)
                if take is None:  # an image next in the first prompt: decoded alone (llamacpp/mtmd.py)
                    self.projector.prefill(self, g, g.n_prompt_done)
                    self._prefill_turn = False
                    return []
                if take <= 0:
                    continue
                g.last_prefill = self._steps
                sid, pos0, toks = g.slot.seq_id, g.n_prompt_done, g.prompt
                for j in range(take):
                    batch.token[n], batch.pos[n], batch.n_seq_id[n] = toks[pos0 + j], pos0 + j, 1
                    batch.seq_id[n][0], batch.logits[n] = sid, 0
                    n += 1
                prefill.append((g, take))
                if pos0 + take == len(g.prompt):
                    batch.logits[n - 1] = 1
                    outputs.append((g, n - 1))
                if n >= self.n_batch:
                    break
            decoding = []
            self._prefill_turn = False
        else:
            # the decoding sequences' ids in one run: one ubatch for the step (llamacpp/placement.py)
            self.compact(decoding, waiting)
            decoding.sort(key=lambda g: g.slot.seq_id)
            # speculation: K drafted tokens after each sequence's pending one, the same K for all (a batch of
            # equal per-sequence lengths stays one ubatch: llamacpp/spec.py), logits at every position
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
        if self._ubatch_counter is not None:
            self._ubatch_counter.take()  # graphs run outside step (an image's text chunks) are not this step's
        rc = self._decode(batch, abortable=bool(prefill))
        self._count_ubatches(batch, n, prefill=bool(prefill))
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
            if self.checkpoints is not None and self.checkpoints.wanted(g.n_prompt_done, len(g.prompt),
                                                                        g.checkpoint_marks):
                self.checkpoints.save(g.slot)  # the recurrent state after exactly prompt[:n_prompt_done]
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

    def prefill_budget(self, n_decoding: int, n_waiting: int) -> int:
        """Prompt tokens one prefill step takes in all, tokens: ``n_batch`` when nothing decodes; else
        ``prefill_chunk_decoding`` (a GPU's ubatch; 128 on a CPU, where a step's time grows with every token
        and the ``n_decoding`` running streams wait for it) for each running stream's worth of waiting prompts:
        ``chunk × max(1, n_waiting / n_decoding)``, at most ``n_batch``. One stream decoding while fifteen
        prompts wait (a burst of requests whose first arrived a moment early) gets one step for all fifteen,
        one stall for it and none for them afterwards; sixteen streams decoding while one prompt waits get
        chunks of 128 (the stall each step stays short)."""
        if n_decoding <= 0:
            return self.n_batch
        share = self.prefill_chunk_decoding * max(1.0, n_waiting / n_decoding)
        return int(min(self.n_batch, share))

    def _prefill_take(self, g: Generation, n: int, budget: int, decoding: Sequence[Generation]) -> int | None:
        """How many of ``g``'s next prompt tokens this prefill step takes, ``n`` tokens being in the batch
        already (tokens). The first prompt of a step (``n == 0``) takes up to a ubatch (``n_ubatch``) and, while others
        decode, at most ``budget`` unless that would leave under 32 (a chunk that small is
        computed by other kernels, which round differently: outputs stay equal to a solo run's); a later one
        is taken whole when it is short (at most ``prefill_chunk_decoding`` left) and fits in ``n_batch``, so a
        burst of short prompts stalls the running streams once, not once per budget's worth; a longer one
        takes what is left of ``budget``, only in pieces of 32 or more that leave 32 or more (else nothing:
        0). Stops at a KV-tier boundary (``snapshot_at``) and where a checkpoint is taken (recurrent layers).
        None: an image comes next in the first prompt (the caller decodes it alone)."""
        left = len(g.prompt) - g.n_prompt_done
        if g.images:  # a text chunk stops before an image
            nxt = next((s for s, _ in g.images if s >= g.n_prompt_done), len(g.prompt))
            if nxt == g.n_prompt_done:
                return None if n == 0 else 0
            left = nxt - g.n_prompt_done
        if n == 0:
            # one prompt's chunk is at most a ubatch (512): a bigger one computes no faster (llama.cpp splits it
            # into ubatches) and a request that arrives meanwhile would wait for all of it; n_batch bounds the
            # step's prompts together
            take = min(self.n_ubatch, self.n_batch, left)
            if decoding and budget < take:
                # streams are waiting on this chunk: a smaller one bounds their stall (on a CPU a prompt
                # token costs the same in a chunk of 64 or 512)
                take = budget if left - budget >= 32 else take
        elif left <= self.prefill_chunk_decoding and n + left <= self.n_batch:
            take = left  # a short prompt is taken whole: it starts decoding with the others, one stall for all
        else:
            room = min(budget, self.n_batch) - n
            take = min(left, room, self.n_ubatch)
            if take < left and left - take < 32:
                take = left - 32
            if take < left and take < 32:
                return 0
        if g.snapshot_at > g.n_prompt_done:  # a KV-tier boundary (the system prompt's end): stop there
            take = min(take, g.snapshot_at - g.n_prompt_done)
        if self.checkpoints is not None:  # recurrent state: stop where a checkpoint is taken (checkpoints.py)
            stop = self.checkpoints.next_stop(g.n_prompt_done, len(g.prompt), g.checkpoint_marks)
            take = min(take, stop - g.n_prompt_done)
        return max(0, take)

    def _count_ubatches(self, batch, n: int, *, prefill: bool) -> None:
        """Add this step to ``step_totals``: the ubatches llama.cpp made of its ``n`` tokens, measured by the
        eval callback when it is on, else predicted from the tokens' sequence ids (``llamacpp/ubatch.py``)."""
        counter = self._ubatch_counter
        if counter is not None:
            k = counter.take()
        else:
            k = predict_ubatches([batch.seq_id[i][0] for i in range(n)], self.n_ubatch, self.kv_unified)
        self.step_totals.add(prefill=prefill, ubatches=k)

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
        if not self.C.llama_memory_seq_rm(self.mem, g.slot.seq_id, len(g.slot.tokens), -1):
            # the rejected drafts would stay folded into the state (recurrent layers; set_speculation refuses them)
            raise BackendError(f"llama.cpp could not take back the rejected draft tokens of sequence {g.slot.seq_id}",
                               hint="run with --spec off")
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
            if pick is None and g.greedy:  # the chain is greedy alone (sampling.plain_greedy): its argmax
                tok = int(self.logits_row(idx).argmax())
            elif pick is None:
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
            top_bytes=[list(self.token_bytes(t, True)) for t, _ in top],
        )
