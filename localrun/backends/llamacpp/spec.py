"""Speculative decoding on llama.cpp: the per-engine ``Speculation`` (drafts for a step, the verify
rules' llama.cpp side) and the ``DraftModel`` (a second, small model in the same process with its own
context and KV). The pure parts (drafters, rules, controller) are in ``spec_decode.py``.

Why every sequence in a verify step gets the SAME number of drafted tokens: with one KV stream per
sequence (``kv_unified`` off, localrun's default) llama.cpp cuts a batch into ubatches with
``split_equal(n_ubatch, sequential=true)`` (src/llama-batch.cpp, called from llama-kv-cache.cpp
``init_batch``): each ubatch takes the same number of tokens from every sequence of a run of consecutive
sequence ids. Counted with an eval callback on SmolLM2 (4 sequences): 1+1+1+1 tokens → 1 ubatch,
5+5+5+5 → 1, 5+1+1+1 → 2, 5+3+1+5 → 4 (each ubatch reads all the weights again); with a unified KV all
of them are 1. So a verify step pads shorter drafts (a padded position is simply rejected; any token is
a valid draft for the exact rules) and the controller picks one K per step. The draft model's own
context IS unified (its batches mix catch-up lengths freely), which costs it nothing.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Sequence

from localrun.backends.spec_decode import (
    DRAFT_MAX_DEFAULT,
    Acceptance,
    EngineSpeculation,
    NgramDrafter,
    SeqSpec,
    target_probs,
)
from localrun.backends.text import common_prefix
from localrun.errors import BackendError, LocalrunError

if TYPE_CHECKING:
    from localrun.backends.base import BatchSpeculationTarget
    from localrun.backends.llamacpp.seq import Generation


def recurrent_spec_error(arch: str, *, draft: bool = False) -> LocalrunError:
    """The refusal of speculative decoding on a model with recurrent layers (``arch``: its GGUF
    architecture; ``draft``: the draft model is the one). A verify step decodes the drafted tokens into the
    sequence and cuts the rejected ones back off (``llama_memory_seq_rm``); a recurrent state has already
    folded them in and cannot be cut (src/llama-memory-recurrent.cpp ``seq_rm``), so decoding would go on
    from a wrong state. llama.cpp's ``n_rs_seq`` rollback (experimental) is not used: it multiplies the
    recurrent state by 1 + n_rs_seq, only some archs have it, and its per-token states are those of the
    sequence's last ubatch only, while ``seq_rm`` accepts any rollback up to n_rs_seq (after a one-token
    decode step, a cut of 2 would restore a stale state; models/delta-net-base.cpp ``n_written``)."""
    who = "the draft model" if draft else "this model"
    return LocalrunError(
        f"speculative decoding cannot run with {who} ({arch}): its recurrent layers cannot take back "
        "rejected draft tokens, so the output would not be the model's own",
        hint="run with --spec off (the default)" + (", or pick a draft model without recurrent layers" if draft
                                                    else ""))


class DraftModel:
    """A small GGUF loaded next to the target with ``plan`` (``offload.plan.draft_plan``: unified KV, one
    sequence per target slot, ``n_ctx`` tokens each) through ``llamacpp.params`` like every model localrun
    loads, and a mirror of the tokens each sequence's KV holds. ``spec``: its header, when already read.

    ``propose`` brings each sequence's KV up to its context (only what changed since the last call is
    decoded: the accepted tokens) and decodes ``k`` draft tokens for all sequences together, one
    ``llama_decode`` per drafted position. Raises BackendError when llama.cpp cannot load it."""

    def __init__(self, path: str, plan, *, spec=None) -> None:
        from localrun.backends.llamacpp.lib import LlamaLog, import_llama, last_errors
        from localrun.backends.llamacpp.params import context_params, load_model, model_params, new_context
        from localrun.model.gguf_info import read_gguf

        _, C = import_llama()
        self.C, self.path, self.plan = C, path, plan
        mark = LlamaLog.mark()
        # the same placement, load mode and threads as any model localrun loads (llamacpp_params)
        self._params = model_params(C, plan, spec or read_gguf(path))
        self.model = load_model(C, path, self._params)
        if not self.model:
            raise BackendError(f"llama.cpp could not load the draft model {path}: " + last_errors(LlamaLog.since(mark)))
        from localrun.backends.llamacpp.checkpoints import has_recurrent_state

        if has_recurrent_state(C, self.model):  # catch_up cuts its rejected drafts back: refused
            C.llama_model_free(self.model)
            self.model = None
            raise recurrent_spec_error((spec or read_gguf(path)).arch, draft=True)
        self.vocab = C.llama_model_get_vocab(self.model)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        cp = context_params(C, plan)
        self.ctx = new_context(C, self.model, cp)
        if not self.ctx:
            C.llama_model_free(self.model)
            raise BackendError("llama.cpp could not create the draft model's context: "
                               + last_errors(LlamaLog.since(mark)), hint="lower --ctx or --parallel")
        n_parallel = max(1, int(plan.n_parallel))
        self.mem = C.llama_get_memory(self.ctx)
        self.n_batch = int(cp.n_batch)
        self.batch = C.llama_batch_init(self.n_batch, 0, 1)
        self.mirrors: list[list[int]] = [[] for _ in range(n_parallel)]

    def logits(self, i: int):
        import numpy as np

        return np.ctypeslib.as_array(self.C.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    def move(self, src: int, dst: int) -> None:
        """Sequence ``src``'s KV and mirror to sequence ``dst`` (the target moved that sequence:
        ``llamacpp/placement.py``); ``dst``'s are dropped. The draft's KV is unified, so this only relabels
        cells (src/llama-kv-cache.cpp ``seq_cp`` within one stream)."""
        C = self.C
        C.llama_memory_seq_rm(self.mem, dst, 0, -1)
        C.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        C.llama_memory_seq_rm(self.mem, src, 0, -1)
        self.mirrors[dst], self.mirrors[src] = self.mirrors[src], []

    def propose(self, items: Sequence[tuple[int, list[int], object]], k: int) -> list[tuple[list[int], list]]:
        """``items``: (sequence id, its context tokens, ``pick``) where ``pick(logits) -> (token, q row or
        None)`` chooses a draft token (argmax, or a draw from q). Returns per item (``k`` tokens, q rows)."""
        rows = self.catch_up([(seq, ctx_tokens) for seq, ctx_tokens, _ in items])
        out: dict[int, tuple[list[int], list]] = {seq: ([], []) for seq, _, _ in items}
        for step in range(k):
            dec = []
            for seq, _, pick in items:
                tok, q = pick(rows[seq])
                out[seq][0].append(tok)
                out[seq][1].append(q)
                if step < k - 1:
                    dec.append((seq, len(self.mirrors[seq]), tok, True))
                    self.mirrors[seq].append(tok)
            if dec:
                self._decode(dec)
                for i, (s, _, _, _) in enumerate(dec):
                    rows[s] = self.logits(i).copy()
        return [out[seq] for seq, _, _ in items]

    def catch_up(self, items: Sequence[tuple[int, list[int]]]) -> dict[int, object]:
        """Bring each (sequence id, context tokens)'s KV up to its context: what the mirror already holds
        is kept, the rest decoded in chunks of ``n_batch``, and the last token re-decoded when nothing else
        is, for its logits. Returns {sequence id: logits row after the context}; ``caught_up`` = tokens
        decoded. The engine calls it once a prompt is prefilled (``Speculation.prompt_done``), so the draft's
        prefill counts in the time to first token, not in decode."""
        C = self.C
        rows: dict[int, object] = {}
        todo: list[tuple[int, int, int, bool]] = []  # (seq, pos, token, wants logits)
        for seq, ctx_tokens in items:
            mirror = self.mirrors[seq]
            keep = min(common_prefix(mirror, ctx_tokens), len(ctx_tokens) - 1)
            if not C.llama_memory_seq_rm(self.mem, seq, keep, -1):  # never silently: decode it all again
                keep = 0
                C.llama_memory_seq_rm(self.mem, seq, 0, -1)
            del mirror[keep:]
            for j in range(keep, len(ctx_tokens)):
                todo.append((seq, j, ctx_tokens[j], j == len(ctx_tokens) - 1))
            mirror.extend(ctx_tokens[keep:])
        for lo in range(0, len(todo), self.n_batch):  # catch-up, in chunks of n_batch tokens
            part = todo[lo:lo + self.n_batch]
            self._decode([(s, p, t, w) for s, p, t, w in part])
            for i, (s, _, _, w) in enumerate(part):
                if w:
                    rows[s] = self.logits(i).copy()
        self.caught_up = len(todo)  # tokens decoded to catch up (a new prompt's prefill included)
        return rows

    def _decode(self, toks: list[tuple[int, int, int, bool]]) -> None:
        b = self.batch
        for n, (s, p, t, w) in enumerate(toks):
            b.token[n], b.pos[n], b.n_seq_id[n] = t, p, 1
            b.seq_id[n][0], b.logits[n] = s, int(w)
        b.n_tokens = len(toks)
        rc = self.C.llama_decode(self.ctx, b)
        if rc != 0:
            raise BackendError(f"the draft model's llama_decode failed (code {rc})")

    def close(self) -> None:
        if getattr(self, "batch", None) is not None:
            self.C.llama_batch_free(self.batch)
            self.batch = None
        if getattr(self, "ctx", None):
            self.C.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            self.C.llama_model_free(self.model)
            self.model = None


def _plain_chain(p) -> bool:
    """Whether the sampler chain for ``p`` is what ``target_probs`` computes (no penalties, DRY, grammar)."""
    return (p.repeat_penalty == 1.0 and not p.frequency_penalty and not p.presence_penalty
            and p.dry_multiplier <= 0 and not p.grammar)


class Speculation(EngineSpeculation):
    """An engine's speculative decoding: the mode (``auto`` | ``ngram`` | ``draft``), ``draft_max``,
    the optional draft model, the measured step costs, and per generation a ``SeqSpec``.

    ``auto`` uses the draft model when one is loaded, else prompt lookup, each only while the controller
    measures that it pays (``spec_decode.choose_k``); ``ngram``/``draft`` force the drafter but the
    draft length still adapts (K = 0 when it would lose)."""

    def __init__(self, engine: BatchSpeculationTarget, mode: str = "auto", draft_max: int = DRAFT_MAX_DEFAULT,
                 draft: DraftModel | None = None) -> None:
        # a GPU is memory-bound: drafted tokens cost little; a CPU's are measured from the first verify steps on
        super().__init__(mode, draft_max, draft, memory_bound=engine.plan.n_gpu_layers != 0)
        self.engine = engine
        self.t_step = 0.0

    def begin(self, prompt: Sequence[int], params) -> SeqSpec:
        if self.draft is not None:
            # Sampling with a plain chain (temperature, top-k/p, min-p, logit bias): the draft samples from
            # its own q and the target keeps it with probability min(1, p/q) (Leviathan et al. 2023).
            # Greedy, or a chain target_probs cannot reproduce (penalties, DRY, a GBNF grammar): the draft's
            # argmax, kept exactly when the target's own sampler chain picks it (the deterministic rule).
            sampled = params.temperature > 0 and _plain_chain(params)
            return SeqSpec(ngram=None, acceptance=Acceptance(prior_alpha=0.6), sampled=sampled)
        return SeqSpec(ngram=NgramDrafter(prompt), acceptance=Acceptance(prior_alpha=0.5))

    def prompt_done(self, g: Generation) -> None:
        """``g``'s prompt is in the target's KV: prefill it into the draft model's too (a draft model only),
        so the first verify step drafts at once instead of paying that prefill inside decode."""
        if self.draft is not None:
            self.draft.catch_up([(g.slot.seq_id, list(g.prompt))])

    # -------------------------------------------------------------------- before the decode
    def plan(self, gens: Sequence[Generation]) -> int:
        """Choose K for this step and put each generation's draft (K tokens, padded) in ``g.spec.draft``;
        0 = a plain step (then ``g.spec.shadow`` holds prompt lookup's proposal, to measure it)."""
        eng = self.engine
        self.t_step = time.perf_counter()
        k_room = min(self.draft_max, eng.n_batch // max(1, len(gens)) - 1)
        for g in gens:
            p = g.params
            left = eng.n_ctx - len(g.slot.tokens) - 2
            if p.max_tokens is not None:
                left = min(left, p.max_tokens - len(g.generated))
            k_room = min(k_room, left)
        lengths = []
        for g in gens:
            sp = g.spec
            if sp.ngram is not None:
                ctx_len = len(g.prompt) + len(g.generated)
                sp.ngram.extend((g.prompt + g.generated)[len(sp.ngram.tokens):ctx_len])
                sp.draft = sp.ngram.propose(max(0, k_room))
                lengths.append(len(sp.draft))
            else:
                sp.acceptance.forget()
                lengths.append(max(0, k_room))
        k = self.policy.choose([g.spec.acceptance.alpha for g in gens], lengths, k_room, self.cost,
                               draft=self.draft is not None)
        if k == 0:
            for g in gens:
                g.spec.shadow, g.spec.draft, g.spec.real = g.spec.draft, [], 0
            return 0
        if self.draft is not None:
            self._draft_model(gens, k)
        self.t_step = time.perf_counter()  # the verify step's own cost (the draft's is measured apart)
        for g in gens:
            sp = g.spec
            sp.real = min(len(sp.draft), k)
            sp.draft = (sp.draft + [sp.draft[-1] if sp.draft else g.pending] * k)[:k]  # pad: rejected anyway
        return k

    def _draft_model(self, gens: Sequence[Generation], k: int) -> None:
        import numpy as np

        eng = self.engine
        items = []
        for g in gens:
            sp = g.spec
            if sp.sampled:
                p = g.params
                bias = dict(p.logit_bias)
                if p.ignore_eos:
                    bias.update((t, float("-inf")) for t in eng.eog_ids)
                rng = _rng(g)

                def pick(row, p=p, bias=bias, rng=rng):
                    q = target_probs(row, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                     min_p=p.min_p, logit_bias=bias)
                    return int(rng.choice(len(q), p=q)), q
            else:
                def pick(row):
                    return int(np.argmax(row)), None
            items.append((g.slot.seq_id, g.prompt + g.generated, pick))
        t0 = time.perf_counter()
        drafts = self.draft.propose(items, k)
        if self.draft.caught_up <= len(gens) * (self.draft_max + 1):  # not a prompt's prefill: a draft's cost
            self.cost.observe_draft(len(gens), (time.perf_counter() - t0) / k)
        for g, (toks, qs) in zip(gens, drafts):
            g.spec.draft, g.spec.q_rows = toks, qs

    # -------------------------------------------------------------------- after the decode
    def pick_for(self, g: Generation, m: int):
        """The token chooser for verify position ``m`` of ``g`` (``LlamaCppEngine._sample``'s ``pick``),
        or None for llama.cpp's own sampler chain (the deterministic rule)."""
        sp = g.spec
        if not sp.sampled:
            return None
        eng = self.engine

        def pick(idx: int) -> int:
            from localrun.backends.spec_decode import sample, speculative_accept

            p_ = g.params
            bias = dict(p_.logit_bias)
            if p_.ignore_eos:
                bias.update((t, float("-inf")) for t in eng.eog_ids)
            p = target_probs(eng.logits_row(idx), temperature=p_.temperature, top_k=p_.top_k, top_p=p_.top_p,
                             min_p=p_.min_p, logit_bias=bias)
            rng = _rng(g)
            if m < sp.real:
                return speculative_accept(p, sp.q_rows[m], sp.draft[m], float(rng.random()), rng)[1]
            return sample(p, rng)

        return pick

    def finish_step(self, gens: Sequence[Generation], k: int) -> None:
        self.cost.observe(len(gens), k, time.perf_counter() - self.t_step)
        if k:
            self.verify_steps += 1
            self.draft_tokens += sum(g.spec.real for g in gens)
            self.accepted_tokens += sum(g.spec.last_accepted for g in gens)
        else:
            self.plain_steps += 1


def _rng(g):
    """The generation's own numpy Generator for the sampled rule (seeded from ``params.seed``)."""
    import numpy as np

    sp = g.spec
    if sp.rng is None:
        seed = g.params.seed if g.params.seed is not None else random.getrandbits(32)
        sp.rng = np.random.default_rng(int(seed) & 0xFFFFFFFF)
    return sp.rng

