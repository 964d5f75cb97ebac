"""`localrun bench` end to end on SmolLM2: in-process, and against a live `localrun serve` over HTTP.

Workloads are tiny (2 requests per level, 8 output tokens): the assertions are about the report's
shape and consistency, never about speed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers import localrun_inprocess

LOCALRUN = [sys.executable, "-m", "localrun"]
DIST_KEYS = ("ttft_s", "itl_s", "tpot_s", "e2e_s", "queue_s")
LEVEL_KEYS = ("concurrency", "requests", "completed", "failed", "duration_s", "prompt_tokens", "completion_tokens",
              "cached_tokens", "requests_per_s", "output_tok_s", "total_tok_s", "prefill_tok_s", "decode_tok_s",
              *DIST_KEYS, "goodput", "prefix_cache_hit_rate", "peak_rss_bytes", "peak_vram_bytes", "energy",
              "per_request")
ENERGY_KEYS = ("joules", "source", "note", "j_per_output_token", "kwh_per_1m_output_tokens", "price_kwh",
               "cost_per_1m_output_tokens")


def bench(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([*LOCALRUN, "bench", *args], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "COLUMNS": "160"})
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def check_report(rep: dict, *, levels: list[int], n_req: int, prompt_tokens: int, max_tokens: int,
                 exact_tokens: bool) -> None:
    """Every metric present and consistent: P50 ≤ P95 ≤ P99, token counts match the requests,
    goodput ≤ throughput."""
    assert rep["schema"] == "localrun.bench/1"
    assert rep["workload"]["prompt_tokens"] == prompt_tokens and rep["workload"]["concurrency"] == levels
    assert rep["hardware"]["cpu"]["physical_cores"] >= 1 and "ram_total_bytes" in rep["hardware"]
    assert [lv["concurrency"] for lv in rep["levels"]] == levels
    for lv in rep["levels"]:
        missing = [k for k in LEVEL_KEYS if k not in lv]
        assert not missing, missing
        assert lv["requests"] == n_req and lv["completed"] == n_req and lv["failed"] == 0, lv["errors"]
        reqs = lv["per_request"]
        assert len(reqs) == n_req and all(r["ok"] for r in reqs)
        assert lv["prompt_tokens"] == sum(r["prompt_tokens"] for r in reqs)
        assert lv["completion_tokens"] == sum(r["completion_tokens"] for r in reqs)
        for r in reqs:
            assert 1 <= r["completion_tokens"] <= max_tokens
            if exact_tokens:
                assert r["prompt_tokens"] == prompt_tokens and r["completion_tokens"] == max_tokens
            assert 0 < r["ttft_s"] <= r["e2e_s"]
        for k in DIST_KEYS:
            d = lv[k]
            assert d["n"] > 0 and None not in (d["p50"], d["p95"], d["p99"]), k
            assert d["min"] <= d["p50"] <= d["p95"] <= d["p99"] <= d["max"], (k, d)
        assert lv["itl_s"]["n"] == sum(r["completion_tokens"] - 1 for r in reqs)
        for k in ("requests_per_s", "output_tok_s", "total_tok_s", "prefill_tok_s", "decode_tok_s"):
            assert lv[k] > 0, k
        assert lv["total_tok_s"] > lv["output_tok_s"]
        g = lv["goodput"]
        assert 0 <= g["requests_per_s"] <= lv["requests_per_s"] + 1e-12
        assert 0 <= g["output_tok_s"] <= lv["output_tok_s"] + 1e-12
        assert 0 <= g["fraction"] <= 1
        assert all(k in lv["energy"] for k in ENERGY_KEYS)
        assert lv["energy"]["joules"] is not None and lv["energy"]["source"]


@pytest.mark.model  # `localrun bench` runs the embedded model in a subprocess
def test_in_process_bench_json_plot_and_calibrate(tmp_path, isolated_home):
    png = tmp_path / "bench.png"
    p = bench("--concurrency", "1,2", "--requests", "2", "--prompt-tokens", "24", "--max-tokens", "8",
              "--shared-prefix", "0.5", "--slo-ttft", "60", "--slo-tpot", "30", "--price-kwh", "0.30",
              "--ctx", "256", "--threads", "1", "--calibrate", "--json", "--plot", str(png))
    rep = json.loads(p.stdout)
    check_report(rep, levels=[1, 2], n_req=2, prompt_tokens=24, max_tokens=8, exact_tokens=True)
    assert rep["mode"] == "in-process" and rep["target"]["backend"] == "llamacpp"
    assert rep["plan"]["n_parallel"] == 2 and rep["plan"]["n_ctx"] >= 256
    for lv in rep["levels"]:
        # the second request of a level reuses the shared half of the prompt from the KV cache
        assert 0 < lv["prefix_cache_hit_rate"] < 1
        assert lv["peak_rss_bytes"] > 50 * 2**20
        assert lv["energy"]["cost_per_1m_output_tokens"] == pytest.approx(
            lv["energy"]["kwh_per_1m_output_tokens"] * 0.30)
    pvm = rep["predicted_vs_measured"]
    for k in ("prefill_tok_s", "decode_tok_s", "ram_bytes"):
        assert pvm[k]["predicted"] > 0 and pvm[k]["measured"] > 0
        assert pvm[k]["ratio"] == pytest.approx(pvm[k]["measured"] / pvm[k]["predicted"])
    cal = rep["calibration"]
    assert cal["key"] == "llamacpp/cpu" and cal["decode_bandwidth_gbps"] > 0 and cal["prefill_gflops"] > 0
    stored = json.loads((isolated_home / "measurements.json").read_text())["entries"]["llamacpp/cpu"]
    assert stored["source"] == "bench --calibrate"
    assert stored["decode_bandwidth_gbps"] == pytest.approx(cal["decode_bandwidth_gbps"])
    # the next plan predicts from the calibration: the measured single-stream decode rate
    from localrun.machine.hardware import HardwareProfile
    from localrun.machine.measurements import planner_measurement
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.search import plan_for_run

    spec = read_gguf(rep["target"]["path"])
    plan = plan_for_run(spec, HardwareProfile.from_dict(rep["hardware"]), n_ctx=rep["plan"]["n_ctx"], n_parallel=2,
                        measurement=planner_measurement("llamacpp"))  # the caller hands the planner its measurement
    assert cal["decode_tok_s"] == pytest.approx(1 / rep["levels"][0]["tpot_s"]["p50"])
    assert plan.decode_tok_s == pytest.approx(cal["decode_tok_s"], rel=0.02)
    assert any("measure" in r for r in plan.reasons)
    # the PNG is a real image of a readable size
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.shape[0] >= 600 and img.shape[1] >= 900
    assert not list(tmp_path.glob(".bench-plot*"))


@pytest.mark.model  # `localrun bench` runs the embedded model in a subprocess
def test_table_output_shows_levels_and_prediction():
    p = bench("--concurrency", "1", "--requests", "1", "--prompt-tokens", "16", "--max-tokens", "4", "--no-warmup",
              "--threads", "1")
    out = p.stdout
    assert "out tok/s" in out and "TTFT" in out and "P50 / P95 / P99" in out
    assert "planner's prediction vs measured" in out and "decode_tok_s" in out
    assert "estimate" in out or "RAPL" in out or "NVML" in out


# ------------------------------------------------------------------------------------------------ HTTP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def live_server(tmp_path, smollm_path):
    """A real `localrun serve` process with SmolLM2 on a free loopback port (2 parallel sequences)."""
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([*LOCALRUN, "serve", str(smollm_path), "--port", str(port), "--parallel", "2",
                             "--ctx", "256", "--threads", "1"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            if proc.poll() is not None:
                pytest.fail("localrun serve exited: " + (tmp_path / "serve.log").read_text()[-2000:])
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("localrun serve did not come up: " + (tmp_path / "serve.log").read_text()[-2000:])
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_http_bench_against_live_localrun_serve(live_server, tmp_path):
    url, pid = live_server
    png = tmp_path / "http.png"
    p = bench("--url", url, "--concurrency", "1,2", "--requests", "2", "--prompt-tokens", "24",
              "--max-tokens", "8", "--slo-ttft", "0.000001", "--json", "--plot", str(png))
    rep = json.loads(p.stdout)
    check_report(rep, levels=[1, 2], n_req=2, prompt_tokens=24, max_tokens=8, exact_tokens=False)
    assert rep["mode"] == "http" and rep["target"]["url"] == url + "/v1"
    assert rep["target"]["server_on_this_machine"] is True
    assert rep["predicted_vs_measured"] is None and rep["plan"] is None
    for lv in rep["levels"]:
        # a 1 µs TTFT SLO: nothing meets it
        assert lv["goodput"]["requests_ok"] == 0 and lv["goodput"]["requests_per_s"] == 0
        assert lv["prefix_cache_hit_rate"] is not None  # localrun serve reports cached prompt tokens
        assert all(r["prompt_tokens"] >= 20 for r in lv["per_request"])  # the server's own count
        assert lv["rss_of"] == f"server pid {pid}" and lv["peak_rss_bytes"] > 50 * 2**20  # found by its port
    assert png.stat().st_size > 20_000
    # the chat endpoint works too
    p = bench("--url", url, "--endpoint", "chat", "--requests", "1", "--prompt-tokens", "12", "--max-tokens", "4",
              "--no-warmup", "--json")
    check_report(json.loads(p.stdout), levels=[1], n_req=1, prompt_tokens=12, max_tokens=4, exact_tokens=False)


def test_bad_input_is_a_clear_error_not_a_traceback():
    p = bench("--url", f"http://127.0.0.1:{_free_port()}", check=False)
    assert p.returncode == 1 and "cannot reach" in p.stderr and "localrun serve" in p.stderr
    assert "Traceback" not in p.stderr
    for args, text in ((["--concurrency", "0"], "concurrency"), (["--calibrate", "--url", "http://x"], "--calibrate"),
                       (["--scenario", "nope"], "unknown scenario"), (["--shared-prefix", "2"], "shared-prefix"),
                       (["--plot", "/no/such/dir/x.png"], "no such directory"), (["--slo-ttft", "-1"], "slo-ttft")):
        p = localrun_inprocess("bench", *args, env={"COLUMNS": "160"})  # the same main(), without 0.4 s of imports
        assert p.returncode == 9, (args, p.stderr)
        assert text in p.stderr and "Traceback" not in p.stderr
    assert not Path("x.png").exists()
