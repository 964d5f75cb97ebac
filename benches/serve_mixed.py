"""Mixed lengths for ``benches/serve_concurrency.py``: short chat streams while one long prompt prefills.

``--mixed N`` there runs, on each server (fresh process, ``N + 1`` slots, a context that holds the long
prompt): ``N`` clients in a closed loop of short chat requests (``--mixed-max-tokens`` each); once every
client has had its first token, ONE long prompt (``--long-words`` random words, ~1.3 tokens a word, so the
default ~4k tokens) is sent with ``max_tokens`` 8; the short clients keep going until it has answered and
``--mixed-tail`` more seconds have passed. Printed per server: the long prompt's TTFT, the short streams'
inter-token latency p50 and p99 while the long prompt was prefilling (its send → its first token) and
outside that window, and aggregate tok/s of the short streams. A long prefill should stall the running
streams by at most one prefill chunk at a time: ITL p99 during ≈ one chunk's time, not the whole prompt's.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def long_prompt(words: int, vocab: tuple[str, ...], seed: int = 4242) -> str:
    rng = random.Random(seed)
    return "Read these notes and say which word is most frequent.\n" + " ".join(rng.choice(vocab)
                                                                              for _ in range(words))


async def run_mixed(srv, args, vocab: tuple[str, ...], stream_one) -> dict:
    """One mixed-lengths run against the started server ``srv`` (see the module docstring). ``stream_one``
    is serve_concurrency's client (``localrun.bench.clients.stream_completion``)."""
    import httpx

    n = args.mixed
    url = srv.base + "/v1/chat/completions"
    stop = asyncio.Event()
    first = [asyncio.Event() for _ in range(n)]
    short: list = []
    body = lambda q: {"model": srv.model_id, "max_tokens": args.mixed_max_tokens, "temperature": 0.0,  # noqa: E731
                      "stream": True, "stream_options": {"include_usage": True},
                      "messages": [{"role": "user", "content": q}]}
    timeout = httpx.Timeout(args.level_timeout, connect=10.0)
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        async def chat(i: int) -> None:
            k = 0
            while not stop.is_set():
                r = await stream_one(client, url, body(f"Client {i}, question {k}: tell me a short fact about "
                                                        f"{vocab[(7 * i + k) % len(vocab)]}."), chat=True)
                short.append(r)
                first[i].set()
                k += 1

        t0 = time.perf_counter()
        tasks = [asyncio.create_task(chat(i)) for i in range(n)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first)), args.level_timeout)
        long_body = {"model": srv.model_id, "max_tokens": 8, "temperature": 0.0, "stream": True,
                     "stream_options": {"include_usage": True},
                     "messages": [{"role": "user", "content": long_prompt(args.long_words, vocab)}]}
        t_send = time.perf_counter()
        big = await stream_one(client, url, long_body, chat=True)
        t_first = big.t_first or time.perf_counter()
        await asyncio.sleep(args.mixed_tail)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.perf_counter() - t0
    during, outside = [], []
    for r in short:
        for a, b in zip(r.token_times, r.token_times[1:]):
            (during if t_send <= b <= t_first else outside).append(b - a)
    ok = [r for r in short if r.ok]
    return {"streams": n, "long_ok": big.ok, "long_error": big.error, "long_prompt_tokens": big.prompt_tokens,
            "long_ttft_s": big.ttft_s if big.ok else None, "short_requests": len(ok),
            "short_tok_s": sum(len(r.token_times) for r in ok) / wall if wall > 0 else 0.0,
            "itl_during_p50_s": _pct(during, 0.5), "itl_during_p99_s": _pct(during, 0.99),
            "itl_during_max_s": max(during) if during else None, "itl_outside_p50_s": _pct(outside, 0.5),
            "itl_outside_p99_s": _pct(outside, 0.99), "n_itl_during": len(during),
            "ttft_short_p50_s": statistics.median(r.ttft_s for r in ok) if ok else None}


def print_mixed(name: str, m: dict, ms) -> None:
    print(f"   mixed {m['streams']} short + 1 long ({m['long_prompt_tokens'] or 'n/a'} tokens): long TTFT "
          f"{ms(m['long_ttft_s'])}; short ITL p50/p99 during its prefill {ms(m['itl_during_p50_s'])}/"
          f"{ms(m['itl_during_p99_s'])} (max {ms(m['itl_during_max_s'])}, {m['n_itl_during']} gaps), outside "
          f"{ms(m['itl_outside_p50_s'])}/{ms(m['itl_outside_p99_s'])}; short {m['short_tok_s']:.1f} tok/s, "
          f"TTFT p50 {ms(m['ttft_short_p50_s'])}" + ("" if m["long_ok"] else f"  LONG FAILED: {m['long_error']}"),
          flush=True)
