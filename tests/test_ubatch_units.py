"""The ubatch rules of llama.cpp's batch splitter as localrun predicts them (``llamacpp/ubatch.py``) and the
run arithmetic of slot placement (``llamacpp/placement.py``); no model. The prediction is checked against
llama.cpp's own count (its eval callback) in tests/test_ubatch.py."""

from __future__ import annotations

from localrun.backends.llamacpp.placement import count_runs, densest_window
from localrun.backends.llamacpp.ubatch import StepTotals, predict_ubatches


def _ids(*per_seq: tuple[int, int]) -> list[int]:
    """Decode-batch order (sequence after sequence): (seq id, tokens) pairs → one id per token."""
    return [s for s, k in per_seq for _ in range(k)]


def test_one_stream_per_sequence_costs_one_ubatch_per_run_of_consecutive_ids():
    one = lambda *ids: _ids(*[(s, 1) for s in ids])  # noqa: E731
    assert predict_ubatches(one(0, 1, 2, 3), 512, unified=False) == 1
    assert predict_ubatches(one(4, 5, 6), 512, unified=False) == 1  # a run need not start at 0
    assert predict_ubatches(one(0, 1, 3, 4), 512, unified=False) == 2
    assert predict_ubatches(one(0, 2, 4), 512, unified=False) == 3
    assert predict_ubatches(one(0, 2, 4), 512, unified=True) == 1


def test_unequal_drafts_split_as_counted_in_spec_docstring():
    # llamacpp/spec.py: 5+5+5+5 → 1, 5+1+1+1 → 2, 5+3+1+5 → 4 (four consecutive sequences)
    assert predict_ubatches(_ids((0, 5), (1, 5), (2, 5), (3, 5)), 512, unified=False) == 1
    assert predict_ubatches(_ids((0, 5), (1, 1), (2, 1), (3, 1)), 512, unified=False) == 2
    assert predict_ubatches(_ids((0, 5), (1, 3), (2, 1), (3, 5)), 512, unified=False) == 4
    assert predict_ubatches(_ids((0, 5), (1, 3), (2, 1), (3, 5)), 512, unified=True) == 1


def test_long_batches_are_cut_at_n_ubatch():
    assert predict_ubatches([7] * 1000, 512, unified=False) == 2
    assert predict_ubatches([7] * 1000, 512, unified=True) == 2
    assert predict_ubatches(list(range(8)), 4, unified=False) == 2
    assert predict_ubatches([], 512, unified=False) == 0


def test_runs_and_the_densest_window():
    assert count_runs([]) == 0
    assert count_runs([3]) == 1
    assert count_runs([0, 1, 3, 4, 7]) == 3
    free = lambda busy: [i for i in range(8) if i not in busy]  # noqa: E731
    assert densest_window([0, 2, 5, 7], free([0, 2, 5, 7]), 8) == 0  # every window of 4 holds two: the lowest
    assert densest_window([5, 6, 7, 1], free([5, 6, 7, 1]), 8) == 4
    assert densest_window([2, 3, 4], free([2, 3, 4]), 8) == 2
    # 0 and 2 finished but are not released yet: they can take no sequence, so the window moves past them
    assert densest_window([1, 3], free([0, 1, 2, 3]), 8) == 3
    assert densest_window([0, 2], [], 3) is None


def test_step_totals():
    t = StepTotals()
    t.add(prefill=False, ubatches=1)
    t.add(prefill=False, ubatches=2)
    t.add(prefill=True, ubatches=1)
    assert t.ubatches_per_decode_step == 1.5
    assert t.to_dict()["prefill_steps"] == 1


def test_metrics_report_steps_ubatches_and_the_kv_layout():
    from types import SimpleNamespace

    from localrun.server.metrics import ServerMetrics

    totals = StepTotals(decode_steps=10, decode_ubatches=10, prefill_steps=3, prefill_ubatches=4, moves=2,
                        moved_bytes=1000)
    engine = SimpleNamespace(step_totals=totals, kv_unified=False, n_ctx=2048, speculation=None)
    view = ServerMetrics().for_model("m", 4, 8192)
    view.watch_speculation(engine)
    text = view.render().decode()
    assert 'localrun_decode_steps_total{model="m"} 10.0' in text
    assert 'localrun_decode_ubatches_total{model="m",source="predicted"} 10.0' in text
    assert 'localrun_prefill_ubatches_total{model="m",source="predicted"} 4.0' in text
    assert 'localrun_kv_moves_total{model="m"} 2.0' in text
    assert 'localrun_kv_unified{model="m"} 0.0' in text
    assert 'localrun_sequence_max_tokens{model="m"} 2048.0' in text
