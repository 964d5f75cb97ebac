"""`localrun serve` against llama.cpp's llama-server (``--llama-server``) or `python -m llama_cpp.server`:
concurrency, mixed lengths and prefix caching, same run.

One server at a time (never both at once: each gets the whole machine), a fresh server process per level
and the order alternating level by level (peer, localrun; localrun, peer; …) so that load from other work on
a shared machine lands on both alike; the same GGUF (default: the embedded SmolLM2-135M Q4_1), the same
``--threads`` and the same context per sequence (``--ctx``):

1. **Concurrency levels** (default 1, 8, 16, 32): ``level`` streaming clients in a closed loop (each sends
   its next request when the previous ends) over ``/v1/completions``, greedy, ``max_tokens`` fixed, a
   distinct prompt per request. Per level: aggregate decode tok/s = completion tokens of all requests /
   wall time of the level; TTFT P50 (request sent → first token chunk, queueing included); inter-token
   latency P50 and P99; the CPU the server process used, the CPU *other* processes used meanwhile and the CPU
   time the hypervisor gave to other guests ("steal"; all from /proc/stat, in cores), so a noisy machine
   shows up in the table instead of hiding in the ratio.
2. **Prefix cache**: ``--prefix-trials`` times, a fresh ~1,000-token system prompt, then two chat requests
   sharing it (different user questions), one after the other; TTFT of the second / the first.

Goals (issue 4), printed as ratios: localrun / llama_cpp.server aggregate tok/s at 8 streams ≥ 2.5×;
second-request TTFT ≤ 0.2× the first's on localrun (the peer's is printed for comparison —
llama-cpp-python reuses the longest prefix of the previous prompt in its single context).

The table's "loop" column is the CPU of the server's event-loop thread alone (HTTP, JSON, SSE), in cores.
"tok/s/core" divides aggregate tok/s by the cores the server process got: when other processes take CPU
unevenly between the phases it is the fairer comparison (a rough one: it assumes throughput scales with
the CPU share). Flash attention: localrun's planner decides, llama-server runs llama.cpp's "auto", the peer
runs llama-cpp-python's default (off) unless ``--peer-flash-attn``.

The peer is started with ``--interrupt_requests False`` (by default it ends a running stream as soon as
another request arrives) through ``benches/llama_cpp_server_noamx.py`` (the AMX fix localrun applies).
It needs llama-cpp-python's server extras, without rebuilding llama-cpp-python:

    .venv/bin/pip install sse-starlette starlette-context pydantic-settings

Run (a few minutes on 2 cores; everything is bounded by ``--level-timeout``):

    timeout 900 .venv/bin/python benches/serve_concurrency.py [--model PATH] [--threads N] [--ctx 2048]
        [--levels 1,4,8,16] [--requests 16] [--max-tokens 64] [--only localrun|peer] [--json OUT.json]

``--llama-server PATH`` measures llama.cpp's own server instead of llama_cpp.server (``--with-peer`` keeps
that one too), in its two KV layouts, each a separate server per level: ``llama-server`` (one KV stream
per slot, ``--no-kv-unified``) and ``llama-server -kvu`` (one unified pool, ``--kv-unified``); ``-np`` = the
top level, its default flash attention (auto), ``--no-repack`` where the CPU advertises AMX. The ratios
compare localrun with the FASTER of the two at each level (issue 47's goals: aggregate tok/s ≥ 1.0×, ITL p99
≤ 1.5×, TTFT p50 ≤ 1.0×). llama-server's flash attention "auto" is ON on a CPU; localrun's planner keeps it
off there (at depth its one-query kernel is slow: ``offload/plan.py`` ``flash_attention``), which costs
localrun ~8 % on this short-context workload: ``--localrun-arg=--flash-attn`` compares like with like.
For localrun the table adds the ubatches per decode step (passes over the weights; 1.0 is the
goal) from its /metrics (``localrun_decode_ubatches_total`` / ``localrun_decode_steps_total``: predicted
from the batches, or measured by llama.cpp's eval callback with ``--count-ubatches``, which slows localrun
a little) and the sequences it moved to keep the running ids consecutive.

``--mixed N`` adds the mixed-lengths run (``benches/serve_mixed.py``): N short chat streams while one
~4k-token prompt prefills; ITL p99 of the short streams during that prefill, per server.

    timeout 3600 .venv/bin/python benches/serve_concurrency.py --llama-server /tmp/peer/build/bin/llama-server \
        --levels 1,8,16,32 --mixed 8

Both servers listen on free 127.0.0.1 ports and are killed on exit (also on Ctrl-C / SIGTERM).
Not a test: it prints numbers and ratios, no thresholds are asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

from serve_process import HOST, CpuWindow, Server, free_port  # noqa: E402

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have "
         "an they you were her she there one all we their been has when who will more no if out so said what "
         "up its about into than them can only other new some could time these two may then do first any my "
         "now such like our over man me even most made after also did many before must through back years "
         "where much your way well down should because each just those people how too little state good very "
         "make world still own see men work long get here between both life being under never day same "
         "another know while last might us great old year off come since against go came right used take "
         "three city water house river market garden letter window music paper story table light voice field "
         "morning number system").split()
TOPICS = ["a lighthouse keeper", "a lost dog", "a clockmaker", "a river pilot", "a baker at dawn", "a chess club",
          "a night train", "a mountain school", "a street musician", "a beekeeper", "a map collector",
          "a ferry captain", "a winter market", "a glass blower", "an old library", "a kite festival",
          "a desert well", "a radio operator", "a tea garden", "a bridge builder"]


# ------------------------------------------------------------------------------------------------ client
# one streaming request, every content chunk timed: localrun bench's own HTTP client (RequestResult:
# ttft_s, token_times, completion_tokens from usage, cached_tokens)
def stream_one(client, url: str, body: dict, chat: bool):
    from localrun.bench.clients import stream_completion

    return stream_completion(client, url, body, chat=chat)


def completion_prompts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Here is a story about {TOPICS[i % len(TOPICS)]} (part {i + 1}): "
            + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


def step_counters(srv: Server) -> dict[str, float]:
    """localrun's step totals from its /metrics (``localrun_decode_steps_total``, ``…_decode_ubatches_total``,
    ``…_kv_moves_total``, summed over models); {} for a server without them."""
    import httpx

    try:
        text = httpx.get(srv.base + "/metrics", timeout=10.0).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for key in ("decode_steps", "decode_ubatches", "prefill_steps", "prefill_ubatches", "kv_moves"):
            if name == f"localrun_{key}_total":
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
            if name == "localrun_decode_ubatches_total":
                out["measured"] = float('source="measured"' in line)
    return out


async def run_level(srv: Server, level: int, n_requests: int, args) -> dict:
    """``level`` clients in a closed loop send ``n_requests`` streaming completions in all."""
    import httpx

    prompts = completion_prompts(n_requests, args.prompt_words, seed=1000 * level)
    body = lambda p: {"model": srv.model_id, "prompt": p, "max_tokens": args.max_tokens,  # noqa: E731
                      "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    todo = iter(prompts)
    results = []
    timeout = httpx.Timeout(args.level_timeout, connect=10.0)
    limits = httpx.Limits(max_connections=level + 2, max_keepalive_connections=level + 2)
    steps0 = await asyncio.to_thread(step_counters, srv)
    cpu = CpuWindow(srv.proc.pid)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        async def worker():
            for p in todo:
                results.append(await stream_one(client, srv.base + "/v1/completions", body(p), chat=False))

        t0 = time.perf_counter()
        tasks = [asyncio.create_task(worker()) for _ in range(level)]
        done, pending = await asyncio.wait(tasks, timeout=args.level_timeout)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
    load = cpu.stop()
    steps1 = await asyncio.to_thread(step_counters, srv)
    d = {k: steps1.get(k, 0.0) - steps0.get(k, 0.0) for k in steps1}
    ok = [r for r in results if r.ok]
    toks = sum(len(r.token_times) for r in ok)  # content chunks: one per token on all three servers
    itl = [b - a for r in ok for a, b in zip(r.token_times, r.token_times[1:])]
    return {"level": level, "requests": n_requests, "ok": len(ok), "failed": len(results) - len(ok),
            "unfinished": n_requests - len(results), "errors": sorted({r.error for r in results if not r.ok})[:3],
            "wall_s": wall, "tokens": toks, "tok_s": toks / wall if wall > 0 else 0.0,
            "tokens_per_req": toks / len(ok) if ok else 0.0,
            "usage_tokens": sum(r.completion_tokens for r in ok),
            "ttft_p50_s": statistics.median(r.ttft_s for r in ok) if ok else None,
            "ttft_max_s": max(r.ttft_s for r in ok) if ok else None,
            "itl_p50_s": statistics.median(itl) if itl else None,
            "itl_p99_s": sorted(itl)[min(len(itl) - 1, int(0.99 * len(itl)))] if itl else None,
            "decode_steps": d.get("decode_steps"), "kv_moves": d.get("kv_moves"),
            "ubatches_per_step": (d["decode_ubatches"] / d["decode_steps"]) if d.get("decode_steps") else None,
            "prefill_ubatches_per_step": (d["prefill_ubatches"] / d["prefill_steps"]) if d.get("prefill_steps")
            else None, "ubatches_measured": bool(steps1.get("measured")), **load}


def system_prompt(trial: int, words: int) -> str:
    rng = random.Random(77_000 + trial)
    return (f"You are assistant number {trial} of a reading club. Use the notes below to answer.\nNotes: "
            + " ".join(rng.choice(WORDS) for _ in range(words)))


async def run_prefix(srv: Server, args) -> list[dict]:
    """Per trial: a fresh system prompt, then two chat requests sharing it, sent one after the other."""
    import httpx

    out = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.level_timeout, connect=10.0)) as client:
        for trial in range(args.prefix_trials):
            sysmsg = system_prompt(trial, args.system_words)
            pair = []
            for q in ("Which word appears most often in the notes?", "Summarize the notes in one sentence."):
                body = {"model": srv.model_id, "max_tokens": 8, "temperature": 0.0, "stream": True,
                        "stream_options": {"include_usage": True},
                        "messages": [{"role": "system", "content": sysmsg}, {"role": "user", "content": q}]}
                pair.append(await stream_one(client, srv.base + "/v1/chat/completions", body, chat=True))
            a, b = pair
            out.append({"trial": trial, "ok": a.ok and b.ok, "errors": [r.error for r in pair if not r.ok],
                        "prompt_tokens": a.prompt_tokens or None, "ttft_first_s": a.ttft_s,
                        "ttft_second_s": b.ttft_s, "cached_second": b.cached_tokens,
                        "ratio": b.ttft_s / a.ttft_s if a.ok and b.ok and a.ttft_s > 0 else None})
    return out


async def warmup(srv: Server) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=120.0) as client:
        await stream_one(client, srv.base + "/v1/completions",
                         {"model": srv.model_id, "prompt": "Warm up: hello", "max_tokens": 4, "temperature": 0.0,
                          "stream": True}, chat=False)


# ------------------------------------------------------------------------------------------------ main
def server_argv(kind: str, args, port: int, n_parallel: int | None = None, ctx: int | None = None) -> list[str]:
    """The command line of a ``kind`` server with ``n_parallel`` slots (default: the top level) of ``ctx``
    tokens each (default ``--ctx``)."""
    py = sys.executable
    n, ctx = n_parallel or max(args.levels), ctx or args.ctx
    if kind == "localrun":
        return [py, "-m", "localrun", "serve", str(args.model), "--host", HOST, "--port", str(port),
                "--parallel", str(n), "--ctx", str(ctx), "--threads", str(args.threads),
                "--max-queue", "256", "--log-level", "warning"] + list(args.localrun_arg or [])
    if kind.startswith("llama-server"):  # llama.cpp's own server (tools/server), built from the same llama.cpp
        argv = [str(args.llama_server), "-m", str(args.model), "--host", HOST, "--port", str(port), "-np", str(n),
                "-c", str(ctx * n), "-t", str(args.threads), "-tb", str(args.threads), "--no-webui",
                "--kv-unified" if kind == "llama-server-kvu" else "--no-kv-unified"]
        from localrun.backends.llamacpp.lib import cpu_advertises_amx

        return argv + (["--no-repack"] if cpu_advertises_amx() else [])  # the AMX fix localrun applies
    return [py, str(ROOT / "benches" / "llama_cpp_server_noamx.py"), "--model", str(args.model),
            "--host", HOST, "--port", str(port), "--n_ctx", str(args.ctx), "--n_threads", str(args.threads),
            "--n_threads_batch", str(args.threads), "--interrupt_requests", "False",
            "--flash_attn", str(args.peer_flash_attn)]


NAMES = {"localrun": "localrun serve", "peer": "llama_cpp.server", "llama-server": "llama-server",
         "llama-server-kvu": "llama-server -kvu"}
LLAMA_SERVERS = ("llama-server", "llama-server-kvu")


def with_server(kind: str, args, log_dir: str, what: str, fn, **argv_kw):
    """Start a fresh ``kind`` server, warm it up, return ``fn(srv)``; the server is always stopped.
    ``argv_kw``: ``n_parallel``, ``ctx`` for ``server_argv``."""
    port = free_port()
    env = {"LOCALRUN_COUNT_UBATCHES": "1"} if kind == "localrun" and args.count_ubatches else None
    srv = Server(kind, server_argv(kind, args, port, **argv_kw), port, log_dir, env=env)
    try:
        t0 = time.perf_counter()
        srv.wait_ready(args.start_timeout)
        print(f"-- {NAMES[kind]:<16} {what:<11} (127.0.0.1:{port}, ready in {time.perf_counter() - t0:.1f}s, "
              f"load average {os.getloadavg()[0]:.2f})", flush=True)
        asyncio.run(warmup(srv))
        return fn(srv)
    finally:
        srv.stop()


def level_requests(level: int, args) -> int:
    """Requests sent at ``level`` streams: ``--requests-single`` at 1, else ``--requests`` (at least one per
    stream)."""
    return args.requests_single if level == 1 else max(args.requests, level)


def run_all(kinds: list[str], args, log_dir: str) -> dict[str, dict]:
    """Level by level, each server in turn on a fresh process (the order alternates per level), so noise
    from other work on the machine lands on both alike; then the prefix-cache trials, one server at a time."""
    runs = {k: {"server": NAMES[k], "levels": [], "prefix": []} for k in kinds}
    for i, level in enumerate(args.levels):
        n = level_requests(level, args)
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            try:
                lv = with_server(kind, args, log_dir, f"{level} streams",
                                 lambda srv: asyncio.run(run_level(srv, level, n, args)))
            except RuntimeError as e:
                print(f"   FAILED: {e}", flush=True)
                runs[kind].setdefault("errors", []).append(str(e))
                continue
            runs[kind]["levels"].append(lv)
            ub = (f", {lv['ubatches_per_step']:.3f} ubatches per decode step "
                  f"({'measured' if lv['ubatches_measured'] else 'predicted'}; {lv['decode_steps']:.0f} steps, "
                  f"{lv['kv_moves']:.0f} moves)" if lv.get("ubatches_per_step") is not None else "")
            print(f"   {level:>2} streams: {lv['tok_s']:7.1f} tok/s aggregate, TTFT p50 {_ms(lv['ttft_p50_s'])}, "
                  f"ITL p50/p99 {_ms(lv['itl_p50_s'])}/{_ms(lv['itl_p99_s'])}{ub}, {lv['ok']}/{n} ok, "
                  f"{lv['tokens_per_req']:.1f} tok/req, "
                  f"server {lv['server_cores']:.2f} cores (event loop {lv['loop_cores']:.2f}), "
                  f"others {lv['other_cores']:.2f} cores, stolen by the hypervisor {lv['steal_cores']:.2f}"
                  + (f"  ERRORS: {lv['errors']}" if lv["errors"] else ""), flush=True)
    if args.mixed:
        from serve_mixed import print_mixed, run_mixed

        ctx = max(args.ctx, int(args.long_words * 1.6) + 256)
        for kind in kinds:
            try:
                m = with_server(kind, args, log_dir, f"mixed {args.mixed}+1",
                                lambda srv: asyncio.run(run_mixed(srv, args, WORDS, stream_one)),
                                n_parallel=args.mixed + 1, ctx=ctx)
            except (RuntimeError, asyncio.TimeoutError) as e:
                print(f"   FAILED: {e}", flush=True)
                continue
            runs[kind]["mixed"] = m
            print_mixed(NAMES[kind], m, _ms)
    if args.prefix_trials:
        for kind in kinds:
            try:
                prefix = with_server(kind, args, log_dir, "prefix", lambda srv: asyncio.run(run_prefix(srv, args)))
            except RuntimeError as e:
                print(f"   FAILED: {e}", flush=True)
                continue
            runs[kind]["prefix"] = prefix
            for p in prefix:
                print(
                    f"   prefix trial {p['trial']}: {p['prompt_tokens'] or 'n/a'} prompt tokens, TTFT first "
                    f"{_ms(p['ttft_first_s'])}, second {_ms(p['ttft_second_s'])} (ratio {_x(p['ratio'])}, "
                    f"cached {'n/a' if p['cached_second'] is None else p['cached_second']})"
                    + (f"  ERRORS: {p['errors']}" if p["errors"] else ""),
                    flush=True,
                )
    return runs


def _per_core(lv: dict) -> float:
    return lv["tok_s"] / lv["server_cores"] if lv["server_cores"] > 0.05 else 0.0


def _ms(s: float | None) -> str:
    return "   n/a" if s is None else f"{s * 1000:6.0f}ms"


def _x(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}×"


def report(runs: dict[str, dict], args, floor: dict | None = None) -> None:
    """The table and the ratios; ``floor``: ``ttft_floor.floors``'s result (the TTFT p50 floor per level)."""
    print(
        f"\nmodel {args.model}; threads {args.threads}; ctx {args.ctx}/sequence; max_tokens {args.max_tokens}; "
        f"CPUs {os.cpu_count()}; peer flash_attn {'on' if args.peer_flash_attn else 'off'}"
    )
    print(
        f"{'server':<18}{'streams':>8}{'tok/s':>9}{'TTFT p50':>10}{'ITL p50':>9}{'ITL p99':>9}{'ub/step':>8}"
        f"{'ok':>7}{'srv cores':>10}{'loop':>6}{'others':>8}{'steal':>7}{'tok/s/core':>11}"
    )
    for run in runs.values():
        for lv in run["levels"]:
            ub = lv.get("ubatches_per_step")
            print(
                f"{run['server']:<18}{lv['level']:>8}{lv['tok_s']:>9.1f}{_ms(lv['ttft_p50_s']):>10}"
                f"{_ms(lv['itl_p50_s']):>9}{_ms(lv.get('itl_p99_s')):>9}{'' if ub is None else f'{ub:.3f}':>8}"
                f"{lv['ok']:>4}/{lv['requests']:<2}{lv['server_cores']:>10.2f}"
                f"{lv['loop_cores']:>6.2f}{lv['other_cores']:>8.2f}{lv.get('steal_cores', 0.0):>7.2f}"
                f"{_per_core(lv):>11.1f}"
            )
    pe = runs.get("peer")
    for key in ("localrun", "llama-server"):
        if not (runs.get(key) and pe):
            continue
        print(f"\n{NAMES[key]} / llama_cpp.server aggregate tok/s:")
        by = {lv["level"]: lv for lv in pe["levels"]}
        for lv in runs[key]["levels"]:
            other = by.get(lv["level"])
            if other and other["tok_s"] > 0:
                goal = (
                    "  (goal ≥ 2.5×: " + ("MET" if lv["tok_s"] / other["tok_s"] >= 2.5 else "NOT MET") + ")"
                    if lv["level"] == 8 and key == "localrun"
                    else ""
                )
                per_core = _per_core(lv) / _per_core(other) if _per_core(other) > 0 else float("nan")
                print(
                    f"  {lv['level']:>2} streams: {lv['tok_s'] / other['tok_s']:.2f}×{goal}; "
                    f"per server core {per_core:.2f}×"
                )
    lr = runs.get("localrun")
    if lr and any(runs.get(k) for k in LLAMA_SERVERS):
        print("\nlocalrun serve / the faster llama-server layout at each level (issue 47's goals: tok/s ≥ 1.0×, "
              "ITL p99 ≤ 1.5×, TTFT p50 ≤ 1.0×):")
        for lv in lr["levels"]:
            cands = [(o, k) for k in LLAMA_SERVERS for o in (runs.get(k) or {}).get("levels", [])
                     if o["level"] == lv["level"] and o["tok_s"] > 0]
            if not cands:
                continue
            other, kind = max(cands, key=lambda c: c[0]["tok_s"])
            r_tok = lv["tok_s"] / other["tok_s"]
            r_ttft = (lv["ttft_p50_s"] / other["ttft_p50_s"]) if lv["ttft_p50_s"] and other["ttft_p50_s"] else None
            r_itl = (lv["itl_p99_s"] / other["itl_p99_s"]) if lv["itl_p99_s"] and other["itl_p99_s"] else None
            ub = lv.get("ubatches_per_step")
            print(f"  {lv['level']:>2} streams vs {NAMES[kind]:<17}: tok/s {r_tok:.2f}× "
                  f"({'MET' if r_tok >= 1.0 else 'NOT MET'}), ITL p99 {_x(r_itl)} "
                  f"({'MET' if r_itl is not None and r_itl <= 1.5 else 'NOT MET'}), TTFT p50 {_x(r_ttft)} "
                  f"({'MET' if r_ttft is not None and r_ttft <= 1.0 else 'NOT MET'})"
                  + ("" if ub is None else f"; localrun {ub:.3f} ubatches per decode step"))
            f_s = (floor or {}).get("levels", {}).get(lv["level"])
            if f_s is not None and other["ttft_p50_s"]:
                best = f_s / other["ttft_p50_s"]
                print(f"      TTFT p50 floor {_ms(f_s).strip()} (prefill only, at {floor['pp_tok_s']:.0f} tok/s, the "
                      f"fastest seen: {floor['source']}; benches/ttft_floor.py): no server "
                      f"can do better than {best:.2f}× of {NAMES[kind]}'s"
                      + (" (the 1.0× goal is below it)" if best > 1.0 else ""))
    for key, run in runs.items():
        ratios = [p["ratio"] for p in run["prefix"] if p["ratio"] is not None]
        if ratios:
            med = statistics.median(ratios)
            goal = f"  (goal ≤ 0.2×: {'MET' if med <= 0.2 else 'NOT MET'})" if key == "localrun" else ""
            print(f"prefix cache, {run['server']}: TTFT second / first, median of {len(ratios)} = {med:.3f}×{goal}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded SmolLM2-135M Q4_1)")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads for both servers (default: 1 if the 1-min load average exceeds 1, else all CPUs)",
    )
    ap.add_argument("--ctx", type=int, default=2048, help="context per sequence, tokens (both servers)")
    ap.add_argument("--levels", default="1,8,16,32", help="concurrent streams per level")
    ap.add_argument("--requests", type=int, default=16, help="requests per level (levels > 1)")
    ap.add_argument("--requests-single", type=int, default=4, help="requests at level 1")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=40, help="random words per prompt (plus a distinct head)")
    ap.add_argument("--system-words", type=int, default=960, help="words in the shared system prompt (~1,000 tokens)")
    ap.add_argument("--prefix-trials", type=int, default=3)
    ap.add_argument("--peer-flash-attn", action="store_true", help="run the peer with --flash_attn True")
    ap.add_argument("--only", choices=("localrun", "peer", "llama-server", "llama-server-kvu"), default=None)
    ap.add_argument("--with-peer", action="store_true", help="with --llama-server: llama_cpp.server too")
    ap.add_argument("--localrun-arg", action="append", metavar="ARG",
                    help="an extra argument for `localrun serve` (repeat: --localrun-arg=--flash-attn)")
    ap.add_argument("--count-ubatches", action="store_true",
                    help="localrun counts its ubatches with llama.cpp's eval callback (measured, a little slower) "
                    "instead of predicting them from the batches")
    ap.add_argument("--mixed", type=int, default=0, metavar="N",
                    help="mixed lengths: N short chat streams while one long prompt prefills (0 = skip)")
    ap.add_argument("--mixed-max-tokens", type=int, default=32, help="max_tokens of the short chat requests")
    ap.add_argument("--long-words", type=int, default=3000, help="random words in the long prompt (~1.3 tokens each)")
    ap.add_argument("--mixed-tail", type=float, default=2.0, help="seconds the short streams go on after it")
    ap.add_argument(
        "--llama-server",
        default=os.environ.get("LLAMA_SERVER"),
        metavar="PATH",
        help="also measure llama.cpp's own llama-server binary (built from the same llama.cpp: "
        "cmake --build build --target llama-server), started with -np = the top level",
    )
    ap.add_argument("--level-timeout", type=float, default=300.0, help="seconds before a level is cut off")
    ap.add_argument("--start-timeout", type=float, default=180.0)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    args.levels = sorted({int(x) for x in args.levels.split(",") if x.strip()})
    if args.model is None:
        from localrun.store.resolve import default_model_path

        args.model = default_model_path()
    load0 = os.getloadavg()
    if args.threads <= 0:
        args.threads = 1 if load0[0] > 1.0 else (os.cpu_count() or 1)
    print(
        f"serve_concurrency: load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} at start; "
        f"threads {args.threads}",
        flush=True,
    )

    def on_term(signum, frame):  # `timeout` sends SIGTERM: unwind so the finally blocks stop the servers
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    with tempfile.TemporaryDirectory(prefix="serve_concurrency-") as log_dir:
        kinds = (["localrun", *LLAMA_SERVERS] + (["peer"] if args.with_peer else []) if args.llama_server
                 else ["peer", "localrun"])
        if args.only in LLAMA_SERVERS and not args.llama_server:
            ap.error(f"--only {args.only} needs --llama-server PATH")
        runs = run_all([args.only] if args.only else kinds, args, log_dir)
    if args.llama_server and args.only is None:  # the compute floor under TTFT p50 (benches/ttft_floor.py)
        from ttft_floor import floors

        floor = floors(args, {lv: completion_prompts(level_requests(lv, args), args.prompt_words, seed=1000 * lv)
                              for lv in args.levels}, runs)
    else:
        floor = {}
    report(runs, args, floor)
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "runs": runs,
                 "ttft_floor": floor},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    if "--backend" in sys.argv[1:]:  # --backend mlx: localrun on MLX against mlx_lm.server, in its own script
        import runpy  # (run, not imported: that script imports this one's client and statistics)

        runpy.run_path(str(Path(__file__).with_name("serve_concurrency_mlx.py")), run_name="__main__")
    sys.exit(main())
