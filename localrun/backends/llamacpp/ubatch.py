"""How many passes over the weights one ``llama_decode`` costs: llama.cpp cuts a batch into ubatches and
computes one graph per ubatch (docs/architecture.md §1, "One pass per step").

* ``predict_ubatches``: the count, from the batch alone, by the rules of src/llama-batch.cpp. One KV stream
  (``kv_unified``) → ``split_simple``: ``ceil(n_tokens / n_ubatch)``. One stream per sequence →
  ``split_equal(n_ubatch, sequential=true)`` (src/llama-kv-cache.cpp ``init_batch``): each ubatch takes the
  same number of tokens from every sequence of ONE run of consecutive sequence ids, so a decode batch over
  sequences {0, 1, 3, 4} costs two passes and {0, 2, 4} three.
* ``UbatchCounter``: the count as llama.cpp ran it, from the context's eval callback
  (``llama_context_params.cb_eval``, asked once per graph node by ggml-backend.cpp
  ``ggml_backend_sched_compute_splits``): one ubatch = one node named ``embd`` (the input embeddings, of
  tokens or of an image, that every llama.cpp model graph starts with, src/llama-graph.cpp
  ``build_inp_embd``). A Python call per
  graph node costs about a millisecond per ubatch on a small model, so it is a diagnostic, on only when
  ``LOCALRUN_COUNT_UBATCHES=1`` is set when the context is created; the engine's totals use the
  prediction otherwise (the tests check that the two agree).
* ``StepTotals``: the engine's counters since it loaded (decode and prefill steps, their ubatches,
  sequences moved to keep the running ids consecutive), read by ``/metrics``.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import asdict, dataclass
from typing import Sequence

ENV_COUNT = "LOCALRUN_COUNT_UBATCHES"
EMBED_NODE = b"embd"  # src/llama-graph.cpp build_inp_embd: cb(cur, "embd", -1)


def predict_ubatches(seq_ids: Sequence[int], n_ubatch: int, unified: bool) -> int:
    """Ubatches llama.cpp makes of a batch whose token ``i`` belongs to sequence ``seq_ids[i]`` (one
    sequence per token, batch order), ``n_ubatch`` tokens at most each. ``unified``: one KV stream.
    Mirrors ``llama_batch_allocr::split_simple`` / ``split_equal(n_ubatch, sequential=!unified)`` of
    src/llama-batch.cpp (no coupled sequences, no ``n_keep_tail``). 0 for an empty batch."""
    n = len(seq_ids)
    if n == 0:
        return 0
    n_ubatch = max(1, int(n_ubatch))
    if unified or len(set(seq_ids)) == 1:  # split_simple, or split_equal over one sequence
        return -(-n // n_ubatch)
    by_seq: dict[int, list[int]] = {}
    for i, s in enumerate(seq_ids):
        by_seq.setdefault(s, []).append(i)
    used = [False] * n
    cursor = {s: 0 for s in by_seq}
    n_used = count = 0
    while n_used < n:
        cur: list[int] = []
        last = -1
        for i in range(n):  # the sequences of this ubatch: a run of consecutive ids, in batch order
            if used[i]:
                continue
            s = seq_ids[i]
            if s not in cur and (not cur or s == last + 1):
                cur.append(s)
                last = s
                if len(cur) > n_ubatch:
                    break
        if not cur:
            break
        per = 0
        while all(cursor[s] < len(by_seq[s]) for s in cur):  # the same number of tokens from each
            for s in cur:
                used[by_seq[s][cursor[s]]] = True
                cursor[s] += 1
                n_used += 1
            per += 1
            if (per + 1) * len(cur) > n_ubatch:
                break
        count += 1
    return count


@dataclass
class StepTotals:
    """An engine's step counters since it loaded. ``*_ubatches``: passes over the weights (predicted, or
    measured when ``measured``); ``moves``: sequences whose KV was copied to another sequence id to keep the
    running ids consecutive, ``moved_bytes`` their state bytes."""

    decode_steps: int = 0
    decode_ubatches: int = 0
    prefill_steps: int = 0
    prefill_ubatches: int = 0
    moves: int = 0
    moved_bytes: int = 0
    measured: bool = False

    def add(self, *, prefill: bool, ubatches: int) -> None:
        if prefill:
            self.prefill_steps += 1
            self.prefill_ubatches += ubatches
        else:
            self.decode_steps += 1
            self.decode_ubatches += ubatches

    @property
    def ubatches_per_decode_step(self) -> float:
        return self.decode_ubatches / self.decode_steps if self.decode_steps else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "ubatches_per_decode_step": self.ubatches_per_decode_step}


class UbatchCounter:
    """The eval callback that counts the graphs llama.cpp computes (see the module docstring). ``install``
    sets it on a ``llama_context_params`` before the context is created; keep this object alive as long as
    the context. ``take()`` → graphs computed since the last ``take``."""

    def __init__(self, C) -> None:
        from localrun.backends.llamacpp.lib import ggml_lib

        base = ggml_lib("ggml-base")
        self._name = base.ggml_get_name
        self._name.restype = ctypes.c_char_p
        self._name.argtypes = [ctypes.c_void_p]
        self.count = 0

        def on_node(tensor, ask, _user) -> bool:
            if ask and self._name(tensor) == EMBED_NODE:
                self.count += 1
            return False  # never ask for the node's data: the graph runs in one piece

        self._cb = C.ggml_backend_sched_eval_callback(on_node)

    @staticmethod
    def wanted() -> bool:
        """Whether ``LOCALRUN_COUNT_UBATCHES`` asks for the measured count."""
        return os.environ.get(ENV_COUNT, "") not in ("", "0")

    def install(self, cparams) -> None:
        cparams.cb_eval = self._cb
        cparams.cb_eval_user_data = None

    def take(self) -> int:
        n, self.count = self.count, 0
        return n
