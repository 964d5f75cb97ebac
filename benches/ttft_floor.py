"""The compute floor under a serve bench's TTFT p50: how soon the median request of a level could see its
first token if the server did nothing but prefill, at llama.cpp's own prompt speed on this machine.

``benches/serve_concurrency.py`` runs a level as ``L`` clients in a closed loop sending ``R`` distinct
prompts (``run_level``): the first ``W = min(L, R)`` requests are sent at once, each later one when an
earlier one ends. No prompt shares a prefix with another (each starts with its own head), so no prefix
cache can spare any of its prefill. With prefill at ``P`` tokens/s (``llama-bench -p T -n 0``, the same
threads, no repacked weights where the CPU advertises AMX, as both servers run):

* of the first ``W`` requests, the k-th to get its first token waits for at least k prompts' prefill, at
  best the k shortest: ``(t_1 + … + t_k) / P``;
* a later request waits at least for its own: ``t_i / P``.

The j-th smallest TTFT of the level is at least the j-th smallest of these bounds, so their median is a
floor under the TTFT p50 that no scheduler reaches (it would also have to pause every running stream and
spend nothing on HTTP, tokenizing or sampling). Dividing the floor by the peer's measured TTFT p50 gives
the best ratio any server could print against it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Sequence


def prompt_tokens(model: str | Path, prompts: Sequence[str]) -> list[int]:
    """Token count of each prompt as a completion request prefills it (BOS as the model's metadata says),
    with llama.cpp's tokenizer (a vocabulary-only load of ``model``)."""
    from llama_cpp import Llama

    vocab = Llama(str(model), vocab_only=True, verbose=False)
    try:
        return [len(vocab.tokenize(p.encode(), add_bos=True, special=False)) for p in prompts]
    finally:
        vocab.close()


def llama_bench_pp(llama_bench: str | Path, model: str | Path, n_tokens: int, threads: int, *,
                   no_repack: bool, repetitions: int = 5, timeout_s: float = 300.0) -> float:
    """llama-bench's prompt speed, tokens/s, for a prompt of ``n_tokens`` on ``threads`` threads: the FASTEST
    of its ``repetitions`` (``samples_ts``; a shared machine only ever slows a run down, and a faster speed
    gives a lower, safer floor). Raises RuntimeError when llama-bench fails or prints no result."""
    cmd = [str(llama_bench), "-m", str(model), "-p", str(n_tokens), "-n", "0", "-t", str(threads),
           "-r", str(repetitions), "-o", "json"] + (["--repack", "0"] if no_repack else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench exited {r.returncode}: {r.stderr[-500:]}")
    rows = json.loads(r.stdout or "[]")
    if not rows:
        raise RuntimeError("llama-bench printed no result")
    return float(max(rows[0].get("samples_ts") or [rows[0]["avg_ts"]]))


def median_floor_s(lengths: Sequence[int], level: int, pp_tok_s: float) -> float:
    """The floor (seconds) under the TTFT p50 of a level of ``level`` streams over prompts of ``lengths``
    tokens, in the order the clients send them, at ``pp_tok_s`` prompt tokens per second (module
    docstring). Raises ValueError for no prompts or a non-positive speed."""
    if not lengths or pp_tok_s <= 0:
        raise ValueError("need at least one prompt and a positive prefill speed")
    w = min(level, len(lengths))
    first, bounds, total = sorted(lengths[:w]), [], 0
    for t in first:
        total += t
        bounds.append(total / pp_tok_s)
    bounds += [t / pp_tok_s for t in lengths[w:]]
    return statistics.median(bounds)


def floors(args, prompts_by_level: dict[int, list[str]], runs: dict | None = None) -> dict:
    """For ``serve_concurrency``: {"pp_tok_s", "pp_tokens", "source", "levels": {level: floor_s}} with
    llama-bench found beside ``args.llama_server``; {} (and a printed reason) when it is not there or fails.

    The speed is the fastest seen: llama-bench's best repetition, or, when a server did better, the median
    prompt of the 1-stream level over that server's TTFT p50 there (``runs``: serve_concurrency's results),
    which includes HTTP and the first token, so it can only understate the speed it prefilled at."""
    bench = Path(args.llama_server).with_name("llama-bench") if args.llama_server else None
    if bench is None or not bench.exists():
        print(f"TTFT floor: skipped (no llama-bench beside {args.llama_server})", flush=True)
        return {}
    from localrun.backends.llamacpp.lib import cpu_advertises_amx

    lengths = {lv: prompt_tokens(args.model, ps) for lv, ps in prompts_by_level.items()}
    typical = int(statistics.median([t for ls in lengths.values() for t in ls]))
    try:
        pp = llama_bench_pp(bench, args.model, typical, args.threads, no_repack=cpu_advertises_amx())
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
        print(f"TTFT floor: skipped ({e})", flush=True)
        return {}
    source = f"llama-bench pp{typical}"
    if 1 in lengths:
        one = statistics.median(lengths[1])
        for run in (runs or {}).values():
            for lv in run.get("levels", []):
                if lv["level"] == 1 and lv.get("ttft_p50_s") and one / lv["ttft_p50_s"] > pp:
                    pp, source = one / lv["ttft_p50_s"], f"{run['server']}'s 1-stream TTFT p50"
    return {"pp_tok_s": pp, "pp_tokens": typical, "source": source,
            "levels": {lv: median_floor_s(ls, lv, pp) for lv, ls in lengths.items()}}
