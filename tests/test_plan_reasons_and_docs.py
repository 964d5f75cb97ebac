"""Small promises the pages and the planner's words make: a plan says each fact once (chat's /stats joins its
reasons on one line), the README names every GPU vendor the probes detect, and the peers' build script asks
pip for llama-cpp-python's source only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localrun.machine.presets import get_preset
from localrun.model.catalog import get_entry
from localrun.model.synthetic import spec_from_entry
from localrun.offload.search import plan_for_run

ROOT = Path(__file__).resolve().parents[1]


def _cpu_box(ram_gib: float):
    hw = get_preset("laptop-16gb")
    hw.cpu.physical_cores = 2
    hw.ram_total_bytes = int((ram_gib + 2) * (1 << 30))
    hw.ram_available_bytes = int(ram_gib * (1 << 30))
    return hw


@pytest.mark.parametrize("ram_gib", [5.5, 7, 60])
def test_a_plan_states_its_kv_cache_size_once(ram_gib):
    """/stats printed "…; KV cache 180.0 MiB; KV cache 180.0 MiB (f16; …)": the chosen-context reason ended with
    the size the KV reason that follows it gives. The context reason now says why that context, only."""
    plan = plan_for_run(spec_from_entry(get_entry("llama-3.1-8b-instruct"), "Q4_K_M"), _cpu_box(ram_gib))
    line = "; ".join(plan.reasons)  # what chat's /stats prints after "plan: "
    assert any(r.startswith("context ") for r in plan.reasons)  # the searched context says why
    sizes = re.findall(r"KV cache (\d[\d.,]* [KMGT]?i?B)", line)
    assert len(sizes) == 1, line


def test_readme_names_every_gpu_vendor_the_planner_detects():
    from localrun.machine import gpus_linux

    text = " ".join((ROOT / "README.md").read_text().split())
    sentence = next(s for s in text.split(". ") if "The planner detects" in s)
    for vendor in ("NVIDIA", "AMD", "Intel", "Apple"):
        assert vendor in sentence, sentence
    assert "unified-memory" in sentence
    assert callable(gpus_linux.probe_amd) and callable(gpus_linux.probe_intel)  # the probes it names exist


def test_peer_build_downloads_only_llama_cpp_python_as_source():
    """``--no-binary :all:`` made pip build every build dependency from source (>10 minutes on 2 cores)."""
    script = (ROOT / "benches" / "build_peers.sh").read_text()
    assert "--no-binary :all:" not in script
    assert re.search(r"download --no-binary llama-cpp-python --no-deps", script)
