"""`localrun fit` shows the KV-cache tiers (issue 17 item 6): the RAM budget serve picks, the disk budget,
and how long a full context's snapshot takes to restore from each tier; on injected hardware profiles."""

from __future__ import annotations

import json

import pytest
from helpers import localrun_inprocess

from localrun.machine.presets import get_preset
from localrun.model.gguf_info import read_gguf
from localrun.offload.kv_tiers import (
    RAM_CAP_BYTES,
    default_cache_ram_bytes,
    plan_kv_tiers,
    restore_seconds,
)
from localrun.offload.search import plan_for_run

GIB = 1 << 30


def _fit_json(*args: str) -> dict:
    r = localrun_inprocess("fit", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_fit_json_has_the_tiers_of_the_chosen_plan(deepseek_header_path, tmp_path):
    d = _fit_json(str(deepseek_header_path), "--preset", "nvidia-12gb", "--ctx", "8192", "--cache-dir", str(tmp_path),
                  "--cache-disk", "20GiB", "--disk", "nvme")
    t = d["kv_tiers"]
    assert t["snapshot_tokens"] == d["n_ctx"] == 8192
    assert t["snapshot_bytes"] == d["kv_cache_bytes"] > 0  # one sequence: the whole KV cache
    hw = get_preset("nvidia-12gb")
    assert t["ram_bytes"] == default_cache_ram_bytes(hw.ram_available_bytes, d["ram_bytes"]) > 0
    assert t["ram_source"].startswith("default")
    assert t["disk_dir"] == str(tmp_path) and t["disk_bytes"] == 20 * GIB and t["disk_kind"] == "nvme"
    assert t["snapshots_on_disk"] == 20 * GIB // t["snapshot_bytes"]
    assert 0 < t["restore_ram_s"] < t["restore_disk_s"]
    want = restore_seconds(t["snapshot_bytes"], disk_read_gbps=t["disk_read_gbps"])
    assert t["restore_disk_s"] == pytest.approx(want)


def test_fit_table_says_the_tiers(deepseek_header_path):
    r = localrun_inprocess("fit", str(deepseek_header_path), "--preset", "laptop-16gb", "--ctx", "4096",
                           "--cache-ram", "512MiB")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "KV tiers" in ln)
    assert "RAM 512.0 MiB" in line and "disk off (serve --cache-dir DIR)" in line
    assert "snapshot of 4096 tokens" in line and "from RAM" in line and "from disk" in line


def test_a_slower_disk_restores_slower_and_more_parallel_sequences_mean_smaller_snapshots(deepseek_header_path):
    spec = read_gguf(deepseek_header_path)
    hw = get_preset("nvidia-12gb")
    plan = plan_for_run(spec, hw, n_ctx=8192)
    nvme = plan_kv_tiers(plan, hw.ram_available_bytes, disk_kind="nvme", cache_dir="/c")
    hdd = plan_kv_tiers(plan, hw.ram_available_bytes, disk_kind="hdd", cache_dir="/c")
    measured = plan_kv_tiers(plan, hw.ram_available_bytes, disk_kind="hdd", cache_dir="/c",
                             measured_disk_read_gbps=10.0)
    assert hdd.restore_disk_s > 3 * nvme.restore_disk_s and hdd.restore_ram_s == nvme.restore_ram_s
    assert measured.disk_read_source == "measured" and measured.restore_disk_s < hdd.restore_disk_s
    par = plan_for_run(spec, hw, n_ctx=8192, n_parallel=4)
    four = plan_kv_tiers(par, hw.ram_available_bytes)
    assert four.snapshot_bytes == par.kv_cache_bytes // 4 and four.disk_bytes == 0 and four.disk_dir is None


def test_default_ram_budget_is_a_share_of_what_is_left_and_capped():
    assert default_cache_ram_bytes(256 * GIB) == RAM_CAP_BYTES  # a big machine: llama-server's 8 GiB
    assert default_cache_ram_bytes(8 * GIB, 4 * GIB) == 1 * GIB  # a quarter of the 4 GiB the plan leaves
    assert default_cache_ram_bytes(4 * GIB, 6 * GIB) == 0  # the model alone overcommits: no RAM tier
    assert default_cache_ram_bytes(3 * GIB + 12345) % (1 << 20) == 0


def test_bad_cache_sizes_are_refused_with_the_flag():
    r = localrun_inprocess("fit", "--preset", "laptop-16gb", "--cache-disk", "lots")
    assert r.returncode != 0 and "--cache-disk" in r.stderr and "Traceback" not in r.stderr


def test_serve_cache_ram_auto_means_the_default():
    from localrun.commands.serve import parse_kv_tiers

    assert parse_kv_tiers("auto", None, "8GiB") == {"ram_bytes": None, "disk_dir": None, "disk_bytes": 0}
    assert parse_kv_tiers("0", None, "8GiB") is None
