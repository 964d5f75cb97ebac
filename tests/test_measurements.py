"""Measured speeds: load detection, forgetting them, and one speed source for fit, show, pull and chat/serve."""

from __future__ import annotations

import json
from collections import namedtuple

import pytest

from localrun.machine.measurements import (
    forget_measurements,
    get_measurement,
    load_fractions,
    planner_measurement,
    save_measurement,
)

Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")


def _t(user=0.0, system=0.0, idle=0.0, steal=0.0):
    return Times(user, 0.0, system, idle, 0.0, 0.0, 0.0, steal, 0.0, 0.0)


def test_load_fractions_flag_other_processes_and_steal():
    # 2 cores for 10 s = 20 CPU-seconds; we used 9.5, something else 8, idle the rest
    busy = load_fractions(_t(), _t(user=17.5, idle=2.5), own_cpu_s=9.5, wall_s=10, n_cpu=2)
    assert busy["others_cpu_frac"] == pytest.approx(0.4) and busy["busy"]
    idle = load_fractions(_t(), _t(user=10.0, idle=10.0), own_cpu_s=9.8, wall_s=10, n_cpu=2)
    assert idle["others_cpu_frac"] < 0.05 and not idle["busy"]
    stolen = load_fractions(_t(), _t(user=10.0, idle=5.0, steal=5.0), own_cpu_s=10.0, wall_s=10, n_cpu=2)
    assert stolen["steal_frac"] == pytest.approx(0.25) and stolen["busy"]


def test_load_meter_measures_this_machine():
    from localrun.machine.measurements import LoadMeter

    with LoadMeter() as m:
        sum(i * i for i in range(300_000))
    r = m.result()
    assert 0.0 <= r["others_cpu_frac"] <= 1.0 and 0.0 <= r["steal_frac"] <= 1.0 and isinstance(r["busy"], bool)


def test_forget_and_under_load_entries():
    save_measurement("llamacpp", "cpu", decode_bandwidth_gbps=10.0, prefill_gflops=50.0, source="hw --measure")
    assert planner_measurement()["decode_bandwidth_gbps"] == 10.0
    save_measurement("llamacpp", "cpu", decode_bandwidth_gbps=2.0, under_load=True)
    assert get_measurement("llamacpp", "cpu")["under_load"] and planner_measurement() is None
    save_measurement("llamacpp", "cpu", decode_bandwidth_gbps=11.0)  # a later clean one clears the flag
    assert planner_measurement()["decode_bandwidth_gbps"] == 11.0
    save_measurement("mlx", "cpu", decode_bandwidth_gbps=5.0)
    assert forget_measurements("mlx/cpu") == ["mlx/cpu"] and get_measurement("llamacpp", "cpu")
    assert forget_measurements() == ["llamacpp/cpu"] and planner_measurement() is None
    assert forget_measurements() == []


def test_hw_forget_command():
    from typer.testing import CliRunner

    from localrun.cli import app

    save_measurement("llamacpp", "cpu", decode_bandwidth_gbps=1.0, prefill_gflops=1.0)
    r = CliRunner().invoke(app, ["hw", "--forget"])
    assert r.exit_code == 0 and "forgot llamacpp/cpu" in r.output and get_measurement("llamacpp", "cpu") is None


def test_fit_and_show_use_the_same_plan_and_speed(gemma_path, monkeypatch):
    """One speed source: with a stored measurement, `fit` and `show` print the same decode rate (show used
    a 1.2 × file-size rule and table speeds before), and the pull choice comes from the same planner."""
    from typer.testing import CliRunner

    from localrun.cli import app

    save_measurement("llamacpp", "cpu", decode_bandwidth_gbps=3.0, prefill_gflops=20.0, source="hw --measure")
    run = CliRunner().invoke
    fit = json.loads(run(app, ["fit", str(gemma_path), "--json"]).stdout)
    show = json.loads(run(app, ["show", str(gemma_path), "--json"]).stdout)
    assert fit["speed_source"].startswith("measured") and show["fit"]["speed_source"] == fit["speed_source"]
    assert show["fit"]["decode_tok_s"] == pytest.approx(fit["decode_tok_s"])
    assert show["fit"]["n_ctx"] == fit["n_ctx"] and show["fit"]["ram_bytes"] == fit["ram_bytes"]
    assert show["file"]["architecture"] == "gemma3" and show["file"]["complete"] is True
    monkeypatch.setenv("COLUMNS", "300")
    text = run(app, ["show", "gemma-3-270m"]).stdout
    for internal in ("est_bytes", "budget_bytes", "n_ctx_train", "pull_would_choose", "{", "n_params"):
        assert internal not in text, internal
    assert "trained for 32,768 tokens" in text and "pull would choose" in text and "tok/s" in text
    from localrun.store.info import _rate

    assert f"decode ≈ {_rate(fit['decode_tok_s'])} tok/s" in run(app, ["show", str(gemma_path)]).stdout
