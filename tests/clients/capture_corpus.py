"""Capture a coding agent's first request into ``tests/data/clients/`` (the corpus of
``tests/test_client_request_corpus.py``).

    python tests/clients/capture_corpus.py UPSTREAM CLIENT VERSION &   # prints the proxy's URL
    # then point the client at that URL, as installed (scratch HOME), and ask it one question

The proxy (``harness.RewritingProxy`` with no rewrite) forwards every request to ``UPSTREAM`` (a running
``localrun serve``) unchanged and writes the first POST to a chat route as
``tests/data/clients/CLIENT-VERSION.json``: ``{"client", "version", "path", "body"}``, the body sanitized
(``sanitize``): the scratch folders' paths, dates and per-run ids replaced by fixed placeholders, so the
file says what the client sends and nothing about the machine it was captured on.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

ROUTES = ("/v1/messages", "/v1/responses", "/v1/chat/completions")
OUT = Path(__file__).resolve().parent.parent / "data" / "clients"


def sanitize(value, roots: list[str]):
    """``value`` (a request body) with each of ``roots`` (scratch paths; with ``/`` → ``-`` too) →
    ``/home/user``, ISO dates → ``2026-01-01``, UUIDs → zeros (recursively, in keys' values and in text)."""
    if isinstance(value, dict):
        return {k: sanitize(v, roots) for k, v in value.items()}
    if isinstance(value, list):
        return [sanitize(v, roots) for v in value]
    if not isinstance(value, str):
        return value
    for r in sorted(roots, key=len, reverse=True):  # also as Claude Code names a project's folder
        value = value.replace(r, "/home/user").replace(r.replace("/", "-"), "-home-user")
    value = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", "2026-01-01", value)
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                  "00000000-0000-0000-0000-000000000000", value)


def main(upstream: str, client: str, version: str, *roots: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import RewritingProxy

    proxy = RewritingProxy(upstream, lambda path, body: body)
    print(proxy.url, flush=True)
    written = False
    while True:  # keeps forwarding until interrupted (the client's session goes on through it)
        for path, body in proxy.requests:
            if not written and path.split("?")[0] in ROUTES and "count_tokens" not in path:
                OUT.mkdir(parents=True, exist_ok=True)
                out = OUT / f"{client}-{version}.json"
                doc = {"client": client, "version": version, "path": path, "body": sanitize(body, list(roots))}
                out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
                print(f"wrote {out}", flush=True)
                written = True
        time.sleep(0.5)


if __name__ == "__main__":
    main(*sys.argv[1:])
