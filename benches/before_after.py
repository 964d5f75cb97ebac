"""Did a refactor cost speed? Decode and serve throughput of this tree against an earlier commit, in one run.

The earlier commit (``--before REV``) is unpacked with ``git archive`` into a temporary folder; each round
runs the same bench from both trees, alternating which goes first, each with its own tree first on
``PYTHONPATH`` (the installed llama-cpp-python and models are shared, so only localrun's code differs):

* ``benches/decode.py --rounds 1``: localrun's ``generate`` tok/s and llama.cpp's tight loop in the same
  process; the per-round ratio localrun / tight loop cancels most of the machine's noise;
* ``benches/serve_concurrency.py --only localrun --levels 1,8``: aggregate tok/s of `localrun serve` at 1 and
  8 streams.

Printed: after / before for each, the median over rounds (goal ≥ 0.97, issue of the wings refactor).

    python benches/before_after.py [--before a551fcc] [--rounds 3] [--levels 1,8] [--skip-serve]
                                   [--after-serve-arg=ARG ...]

The default of ``--spec`` changed from ``auto`` to ``off`` after a551fcc (speculation is not exact yet), and
prompt lookup is what made a551fcc's single stream fast on this bench's prompts: compare serve like with like
with ``--after-serve-arg=--spec --after-serve-arg=auto``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def unpack(rev: str, dest: Path) -> Path:
    """The tree of ``rev`` (``git archive``) under ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run_in(tree: Path, args: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree))
    p = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


def decode_round(tree: Path, tokens: int, threads: int | None) -> tuple[float, float]:
    """(localrun tok/s, localrun / tight loop) of one decode.py round."""
    out = run_in(tree, ["benches/decode.py", "--rounds", "1", "--tokens", str(tokens)]
                 + (["--threads", str(threads)] if threads else []))
    c = float(re.search(r"\(c\) localrun LlamaCppEngine\.generate:\s+([\d.]+)", out).group(1))
    b = float(re.search(r"\(b\) llama_decode \+ llama\.cpp sampler \(tight loop\):\s+([\d.]+)", out).group(1))
    return c, c / b


def serve_round(tree: Path, levels: str, threads: int | None, scratch: Path,
                extra: list[str] = ()) -> dict[int, float]:
    """{streams: aggregate tok/s} of one serve_concurrency.py run (localrun only); ``extra``: arguments for
    that tree's `localrun serve` (``--localrun-arg``)."""
    out_json = scratch / f"serve-{os.getpid()}-{len(list(scratch.iterdir()))}.json"
    run_in(tree, ["benches/serve_concurrency.py", "--only", "localrun", "--levels", levels, "--json", str(out_json)]
           + (["--threads", str(threads)] if threads else []) + [f"--localrun-arg={a}" for a in extra])
    runs = json.loads(out_json.read_text())["runs"]
    return {lv["level"]: lv["tok_s"] for lv in runs["localrun"]["levels"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="a551fcc", help="the earlier commit (default: the last before the wings)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--after-serve-arg", action="append", default=[], metavar="ARG",
                    help="an argument for the working tree's `localrun serve` only, to compare like with like "
                         "across a changed default (e.g. --after-serve-arg=--spec --after-serve-arg=auto: "
                         "speculation was on by default before 90a0ff5)")
    args = ap.parse_args(argv)

    print(f"before_after: {args.before} against the working tree, {args.rounds} rounds, "
          f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
    with tempfile.TemporaryDirectory(prefix="localrun-before-") as tmp:
        before = unpack(args.before, Path(tmp) / "before")
        scratch = Path(tmp) / "out"
        scratch.mkdir()
        trees = {"before": before, "after": ROOT}
        dec: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        srv: dict[str, list[dict[int, float]]] = {"before": [], "after": []}
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for name in order:
                dec[name].append(decode_round(trees[name], args.tokens, args.threads))
                print(f"round {r + 1} {name:6s} decode {dec[name][-1][0]:6.1f} tok/s "
                      f"({dec[name][-1][1]:.3f} of the tight loop)", flush=True)
            if not args.skip_serve:
                for name in order:
                    extra = args.after_serve_arg if name == "after" else []
                    srv[name].append(serve_round(trees[name], args.levels, args.threads, scratch, extra))
                    print(f"round {r + 1} {name:6s} serve " + ", ".join(
                        f"{k} streams {v:6.1f} tok/s" for k, v in sorted(srv[name][-1].items())), flush=True)
    med = statistics.median
    print(f"\nafter / before (median of {args.rounds} rounds; goal ≥ 0.97):")
    for i, what in enumerate(("decode tok/s", "decode, share of the tight loop")):
        ratio = med(a[i] for a in dec["after"]) / med(b[i] for b in dec["before"])
        print(f"  {what + ':':34s}{ratio:.3f}")
    if not args.skip_serve:
        for level in sorted(srv["after"][0]):
            a = med(x[level] for x in srv["after"])
            b = med(x[level] for x in srv["before"])
            print(f"  serve {level:>2} streams aggregate tok/s: {a / b:.3f}  ({b:.1f} → {a:.1f})")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
