"""`localrun fit NAME` plans every catalog entry from models.toml alone (no file), on several machines.

The command's body (``commands.fit.run_fit``: plan, print the JSON, return the exit status) runs in-process:
160 plans through ``CliRunner`` spent a third of their time rebuilding typer's command tree. The CLI's own
parsing of ``fit NAME --preset … --json`` and its exit codes are tested in test_fit.py."""

from __future__ import annotations

import json

import pytest

from localrun.model.catalog import load_catalog

PRESETS = ["laptop-16gb", "nvidia-12gb", "nvidia-24gb", "mac-36gb", "mac-128gb",
           # issue 30: AMD, Intel, APUs (the GTT pool), NVIDIA unified memory, a mixed-vendor box over Vulkan
           "amd-24gb", "amd-16gb", "intel-arc-12gb", "strix-halo-128gb", "dgx-spark-128gb", "laptop-780m-32gb",
           "jetson-orin-64gb", "nvidia-24gb+amd-16gb"]
UNIFIED_128 = ("strix-halo-128gb", "dgx-spark-128gb")  # one pool of ≈ 96-118 GiB: a 70B runs on the GPU


@pytest.mark.parametrize("entry", load_catalog(), ids=lambda e: e.name)
def test_fit_every_catalog_entry(entry, isolated_home, capsys):
    from localrun.commands.fit import run_fit
    from localrun.store.resolve import list_local_models

    assert not [m for m in list_local_models(external=False) if m.name == entry.name]  # nothing pulled
    seen = {}
    for preset in PRESETS:
        code = run_fit(entry.name, preset=preset, json_out=True)
        out = capsys.readouterr().out
        assert code in (0, 1), (preset, out)  # 0 fits, 1 does not: both are answers
        plan = json.loads(out)
        assert plan["fits"] == (code == 0), preset
        assert plan["reasons"], preset
        if plan["fits"]:
            if entry.name != "smollm2-135m-instruct":  # that one plans the embedded file and its requants
                assert plan["quant"] in entry.quants, preset
            assert plan["n_layers"] == entry.n_layer and plan["weights_bytes"] > 0, preset
        seen[preset] = plan["fits"]
        if preset in UNIFIED_128 and plan["fits"] and entry.params_total < 80e9:
            assert plan["n_gpu_layers"] == entry.n_layer + 1, (preset, plan["reasons"])  # all layers + output
            assert "unified pool" in " ".join(plan["reasons"]), preset
    # the 128 GB Mac runs every catalog model
    assert seen["mac-128gb"], entry.name
    if entry.params_total < 4e9:
        assert all(seen.values()), (entry.name, seen)
