"""Decode speed of schema-constrained generation, same file, same threads, same run (issue 14).

  (a) localrun unconstrained: ``LlamaCppEngine.generate``, greedy, ``ignore_eos`` (exactly N tokens);
  (b) localrun constrained by a JSON Schema (llguidance: mask per step, computed in a worker thread while
      the forward pass runs; fast-forwarded tokens skip sampling);
  (c) llama-cpp-python's own GBNF path: ``Llama.create_completion(grammar=LlamaGrammar.from_json_schema)``
      on the same schema (llama.cpp's grammar sampler).

Decode tok/s = tokens after the first / time after the first (the first token's time is prefill). The
three are interleaved ``--rounds`` times (a, b, c, a, b, c, …) so machine noise hits all alike; the best
round of each is compared. Goals: (b)/(a) >= 0.9, (b)/(c) >= 1.5.

    python benches/structured.py [--model PATH] [--tokens 128] [--rounds 1] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time

SCHEMA = {"type": "object", "properties": {
    "people": {"type": "array", "minItems": 6, "maxItems": 6, "items": {
        "type": "object", "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string", "maxLength": 24},
            "role": {"enum": ["engineer", "doctor", "teacher", "artist"]}},
        "required": ["name", "age", "city", "role"], "additionalProperties": False}}},
    "required": ["people"], "additionalProperties": False}
PROMPT = ("<|im_start|>user\nList six people with their name, age, city and job as JSON.<|im_end|>\n"
          "<|im_start|>assistant\n")


def _fresh(engine) -> None:
    engine.slots[0].tokens.clear()  # no prefix reuse between rounds: same work as the peer
    engine.C.llama_memory_seq_rm(engine.mem, 0, 0, -1)


def bench_localrun(engine, n_tokens: int, constrained: bool) -> tuple[float, int]:
    from localrun.backends.base import Constraint, SamplingParams

    _fresh(engine)
    p = SamplingParams(temperature=0, max_tokens=n_tokens, ignore_eos=not constrained,
                       constraint=Constraint("json_schema", SCHEMA) if constrained else None)
    last = None
    for c in engine.generate(PROMPT, p):
        last = c
    return last.stats.decode_tok_s, last.stats.completion_tokens


def bench_llama_grammar(llm, grammar, n_tokens: int) -> tuple[float, int]:
    t0, n = None, 0
    for _ in llm.create_completion(PROMPT, max_tokens=n_tokens, temperature=0.0, stream=True, grammar=grammar):
        if t0 is None:
            t0 = time.perf_counter()  # first token out: prefill done
        n += 1
    llm.reset()
    return ((n - 1) / (time.perf_counter() - t0) if n > 1 else 0.0), n


def main() -> None:
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.store.resolve import default_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    import psutil
    from llama_cpp import Llama, LlamaGrammar

    path = str(args.model or default_model_path())
    threads = args.threads or psutil.cpu_count(logical=False) or 1
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from decode import no_amx_patch

    no_amx_patch()  # this machine's llama.cpp dies on AMX; the peer gets localrun's fix
    llm = Llama(path, n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    grammar = LlamaGrammar.from_json_schema(json.dumps(SCHEMA), verbose=False)
    plan = simple_plan(read_gguf(path), n_ctx=1024)
    plan.n_threads = plan.n_threads_batch = threads
    engine = load_engine(path, plan)
    bench_localrun(engine, 8, True)  # warm: the llguidance tokenizer is built once per engine (≈ 0.6 s)

    res: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    for r in range(args.rounds):
        a, na = bench_localrun(engine, args.tokens, False)
        b, nb = bench_localrun(engine, args.tokens, True)
        c, nc = bench_llama_grammar(llm, grammar, args.tokens)
        res["a"].append(a)
        res["b"].append(b)
        res["c"].append(c)
        print(f"round {r + 1}: unconstrained {a:.1f} ({na} tok)  llguidance {b:.1f} ({nb} tok)  "
              f"LlamaGrammar {c:.1f} ({nc} tok) tok/s")
    a, b, c = (max(res[k]) for k in "abc")
    print(f"\nmodel {path}\nthreads {threads}, up to {args.tokens} tokens, best of {args.rounds} (decode tok/s)")
    print(f"  (a) localrun unconstrained:                 {a:7.1f}")
    print(f"  (b) localrun + JSON schema (llguidance):    {b:7.1f}")
    print(f"  (c) llama-cpp-python LlamaGrammar (GBNF):   {c:7.1f}")
    print(f"ratio constrained / unconstrained = {b / a:.3f}  (goal >= 0.9)")
    print(f"ratio llguidance / LlamaGrammar   = {b / c:.3f}  (goal >= 1.5)")
    engine.close()


if __name__ == "__main__":
    main()
