"""The stored responses: one SQLite file (the standard library's ``sqlite3``), by default
``<localrun home>/responses.db`` (``serve --responses-db``), kept across restarts.

A row holds a response as the client saw it (``response``), this request's input items (``input``) and the
response it continued (``previous_id``): a conversation is the chain of its rows (``conversation``), so
each turn is stored once, however long the conversation grows. ``owner`` is a SHA-256 of the API key the client
sent: when the server requires keys, a response is only ever found by the key that created it (another
key gets a 404, as for a response that does not exist).

Retention: responses older than ``max_age_s`` (30 days, as OpenAI keeps them) and all but the newest
``max_rows`` are deleted when a response is stored.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    model TEXT NOT NULL,
    previous_id TEXT,
    input TEXT NOT NULL,
    response TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created_at);
"""


# Fields of the response object that rows stored by an older localrun lack (the Open Responses schema requires
# them). top_logprobs was 0 (none are returned); the penalties were not recorded: their default (0) is given,
# which is what ran unless that request set one.
_ADDED_FIELDS = {"completed_at": None, "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_logprobs": 0,
                 "safety_identifier": None, "prompt_cache_key": None}


def _current(response: dict) -> dict:
    """A stored response in today's shape: the fields an older row lacks added (``_ADDED_FIELDS``), and a
    null ``temperature``/``top_p`` (the client sent none, so llama.cpp's default ran, ``SamplingParams``)
    given that default."""
    from localrun.backends.base import SamplingParams

    for k, v in _ADDED_FIELDS.items():
        response.setdefault(k, v)
    for k in ("temperature", "top_p"):
        if response.get(k) is None:
            response[k] = getattr(SamplingParams, k)
    return response


def owner_of(api_key: str | None) -> str:
    """The ``owner`` column for a client's API key (None: no key sent)."""
    return hashlib.sha256((api_key or "").encode()).hexdigest()


class ResponseStore:
    """Stored responses in the SQLite file ``path``. ``scoped``: the server requires API keys, so each
    response is visible to its own key only. Thread-safe (one connection behind a lock); each call is one
    short transaction."""

    def __init__(self, path: Path, *, scoped: bool, max_rows: int = 10_000, max_age_s: float = 30 * 86400) -> None:
        self.path = Path(path)
        self.scoped = scoped
        self.max_rows = max_rows
        self.max_age_s = max_age_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    def put(self, response: dict, *, owner: str, input_items: list[dict]) -> None:
        """Store ``response`` (its ``id``, ``model``, ``previous_response_id``), then apply the retention."""
        row = (response["id"], owner, time.time(), response.get("model") or "", response.get("previous_response_id"),
               json.dumps(input_items), json.dumps(response))
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)", row)
            self._db.execute("DELETE FROM responses WHERE created_at < ?", (time.time() - self.max_age_s,))
            self._db.execute("DELETE FROM responses WHERE id NOT IN (SELECT id FROM responses ORDER BY created_at "
                             "DESC LIMIT ?)", (self.max_rows,))

    def get(self, rid: str, owner: str) -> dict | None:
        """``{"response", "input", "previous_id"}`` of ``rid`` as ``owner`` may see it; None when not found."""
        with self._lock:
            r = self._db.execute("SELECT owner, response, input, previous_id FROM responses WHERE id = ?",
                                 (rid,)).fetchone()
        if r is None or (self.scoped and r[0] != owner):
            return None
        return {"response": _current(json.loads(r[1])), "input": json.loads(r[2]), "previous_id": r[3]}

    def conversation(self, rid: str, owner: str, max_turns: int = 100_000) -> list[dict] | None:
        """Every item of the conversation ending with ``rid``, oldest first: each turn's input, then its
        output. None when ``rid`` or a response it continued is not found (deleted, expired, another key's)."""
        turns, seen = [], set()
        while rid is not None and rid not in seen and len(turns) < max_turns:
            seen.add(rid)
            row = self.get(rid, owner)
            if row is None:
                return None
            turns.append(row["input"] + row["response"].get("output", []))
            rid = row["previous_id"]
        return [item for turn in reversed(turns) for item in turn]

    def delete(self, rid: str, owner: str) -> bool:
        """Delete ``rid`` (if ``owner`` may see it). → whether it was there."""
        with self._lock:
            if self.scoped:
                cur = self._db.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (rid, owner))
            else:
                cur = self._db.execute("DELETE FROM responses WHERE id = ?", (rid,))
        return cur.rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._db.close()
