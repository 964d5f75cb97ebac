"""Heartbeats on streamed replies: something every client counts as activity while a long prompt prefills.

A streamed reply carries nothing between its first event and its first token, and prefilling an agent's
12–15k-token prompt on a CPU takes minutes. Clients give up on a silent stream: Qwen Code after 240 s
without a parsed chunk (``stream-guards.ts``, ``DEFAULT_STREAM_IDLE_TIMEOUT_MS``), Codex after
``stream_idle_timeout_ms`` (300 s) without an SSE event, proxies after their own idle limits. An SSE comment
line is not enough: SDK parsers drop comments before a client's timer sees them. So each wing sends an event
of its own format that a client reads and ignores, every ``HEARTBEAT_S`` seconds without one:

* OpenAI chat completions: a chunk whose delta is empty (``{"delta": {}}``); ``/v1/completions``: a chunk
  with empty ``text``;
* Responses: ``response.in_progress`` again (the response object as it stands);
* Anthropic: ``ping`` (its own streams ping too), and a ``message_delta`` without a stop reason: Claude Code's
  watchdog (``CLAUDE_STREAM_IDLE_TIMEOUT_MS``, at least 300 s) skips pings.

``with_heartbeats`` does the timing for all of them.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, TypeVar

HEARTBEAT_S = 10.0  # seconds without an event before a heartbeat (every client above waits far longer)

T = TypeVar("T")


async def with_heartbeats(events: AsyncIterator[T], interval_s: float = HEARTBEAT_S) -> AsyncIterator[T | None]:
    """``events``, with ``None`` yielded after every ``interval_s`` seconds that pass without one. The
    source is closed (``aclose``) when the consumer stops early, as iterating it directly would."""
    it = events.__aiter__()
    nxt = asyncio.ensure_future(it.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({nxt}, timeout=interval_s)
            if not done:
                yield None
                continue
            try:
                ev = nxt.result()
            except StopAsyncIteration:
                return
            yield ev
            nxt = asyncio.ensure_future(it.__anext__())
    finally:
        if not nxt.done():
            nxt.cancel()
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:
                pass
