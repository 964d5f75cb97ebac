"""`localrun fit NAME` plans every catalog entry from models.toml alone (no file), on several machines."""

from __future__ import annotations

import json

import pytest

from localrun.catalog import load_catalog

PRESETS = ["laptop-16gb", "nvidia-12gb", "nvidia-24gb", "mac-36gb", "mac-128gb"]


@pytest.fixture(scope="module")
def runner():
    from typer.testing import CliRunner

    return CliRunner()


@pytest.mark.parametrize("entry", load_catalog(), ids=lambda e: e.name)
def test_fit_every_catalog_entry(entry, runner, isolated_home):
    from localrun.cli import app
    from localrun.store import list_local_models

    assert not [m for m in list_local_models(external=False) if m.name == entry.name]  # nothing pulled
    seen = {}
    for preset in PRESETS:
        r = runner.invoke(app, ["fit", entry.name, "--preset", preset, "--json"])
        assert r.exit_code in (0, 1), (preset, r.output)  # 0 fits, 1 does not: both are answers
        plan = json.loads(r.stdout)
        assert plan["fits"] == (r.exit_code == 0), preset
        assert plan["reasons"], preset
        if plan["fits"]:
            if entry.name != "smollm2-135m-instruct":  # that one plans the embedded file and its requants
                assert plan["quant"] in entry.quants, preset
            assert plan["n_layers"] == entry.n_layer and plan["weights_bytes"] > 0, preset
        seen[preset] = plan["fits"]
    # the 128 GB Mac runs every catalog model
    assert seen["mac-128gb"], entry.name
    if entry.params_total < 4e9:
        assert all(seen.values()), (entry.name, seen)
