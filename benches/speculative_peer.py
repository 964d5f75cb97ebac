"""llama.cpp's own llama-server as the peer of benches/speculative.py: the same target, the same drafter, the
same threads, context and greedy settings, one slot.

Drafters, as close to localrun's as llama-server's options allow (tools/server/README.md, common/arg.cpp):
  ngram  ``--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m DRAFT_MAX``: the
         continuation of the last 3 tokens' latest match in the context (localrun: the longest of 4..2);
  draft  ``--spec-type draft-simple --model-draft DRAFT --spec-draft-n-max DRAFT_MAX`` (without the type, this
         llama-server loads the draft model and never drafts) (``-td`` the same threads), its defaults for the
         rest (``--spec-draft-p-min`` 0.75: it stops drafting below that draft probability, its own adaptivity);
  off    no speculation.
A request is the prompt as token ids on ``/completion`` (``cache_prompt`` false, ``ignore_eos``), and its
decode tok/s is llama-server's own ``timings.predicted_per_second`` (no HTTP in it), the drafted/accepted
tokens its ``timings.draft_n``/``draft_n_accepted``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_llama_server(given: str | None = None) -> tuple[str | None, str]:
    """(the llama-server binary, or None with the reason the comparison is skipped)."""
    path = given or os.environ.get("LLAMA_SERVER") or "/tmp/peer/build/bin/llama-server"
    if not Path(path).is_file() or not os.access(path, os.X_OK):
        return None, f"no llama-server at {path} (set LLAMA_SERVER or --llama-server)"
    return path, ""


class PeerServer:
    """One llama-server process with one drafter (``kind``: off | ngram | draft); ``stop`` ends it."""

    def __init__(self, binary: str, target: Path, kind: str, *, draft: Path | None, draft_max: int, n_ctx: int,
                 threads: int, flash_attn: bool | None, log: Path) -> None:
        self.kind, self.log = kind, log
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [binary, "-m", str(target), "-c", str(n_ctx), "-np", "1", "-t", str(threads), "-tb", str(threads),
               "--host", "127.0.0.1", "--port", str(port), "-fa", {None: "auto", True: "on", False: "off"}[flash_attn],
               "--no-warmup", "--cache-ram", "0"]
        if kind == "ngram":
            cmd += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                    "--spec-ngram-simple-size-m", str(draft_max)]
        elif kind == "draft":
            cmd += ["--spec-type", "draft-simple", "--model-draft", str(draft), "--spec-draft-n-max", str(draft_max),
                    "-td", str(threads),
                    "-tbd", str(threads), "-ngld", "0"]
        with open(log, "ab") as f:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server ({self.kind}) exited ({self.proc.returncode}); see {self.log}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"llama-server ({self.kind}) not ready after {timeout_s:.0f} s; see {self.log}")

    def complete(self, prompt: list[int], max_tokens: int) -> tuple[list[int], float, int, int]:
        """Greedy completion of ``prompt`` (token ids) → (token ids, decode tok/s, drafted, accepted)."""
        import httpx

        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "top_k": 1, "ignore_eos": True,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        r = httpx.post(self.url + "/completion", json=body, timeout=600)
        r.raise_for_status()
        j = r.json()
        t = j.get("timings", {})
        return (list(j.get("tokens") or []), float(t.get("predicted_per_second", 0.0)),
                int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
