"""Constrained decoding on MLX (mlx[cpu], SmolLM2's GGUF): the llguidance tokenizer built from the Hugging
Face tokenizer gives valid output, and the same request gives the same output as llama.cpp at temperature 0
(same model file, shared vocabulary)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from helpers import mlx_smollm_engine

pytestmark = pytest.mark.model

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from test_constrain_engine import NESTED, REFS  # noqa: E402

from localrun.backends.base import Constraint, Message, SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def mlx_smollm(smollm_path, tmp_path_factory):
    yield from mlx_smollm_engine(smollm_path, tmp_path_factory)


def _chat(eng, params: SamplingParams) -> tuple[str, str]:
    chunks = list(eng.chat([Message("user", "Describe a person as JSON.")], params))
    return "".join(c.text for c in chunks), chunks[-1].finish_reason


@pytest.mark.parametrize("schema", [NESTED, REFS], ids=["nested", "refs"])
def test_mlx_and_llamacpp_agree_at_temperature_0(mlx_smollm, smollm_engine, schema):
    p = SamplingParams(temperature=0, max_tokens=60, constraint=Constraint("json_schema", schema))
    text, finish = _chat(mlx_smollm, p)
    assert finish == "stop"
    jsonschema.validate(json.loads(text), schema)
    assert (text, finish) == _chat(smollm_engine, p)


def test_mlx_output_validates_over_seeds_and_regex_holds(mlx_smollm):
    import re

    for seed in range(5):
        p = SamplingParams(temperature=1.0, seed=seed, max_tokens=60, constraint=Constraint("json_schema", NESTED))
        text, finish = _chat(mlx_smollm, p)
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), NESTED)
    rx = r"[A-Z][a-z]+ is [0-9]{2}\."
    text, finish = _chat(mlx_smollm, SamplingParams(temperature=0, max_tokens=20, constraint=Constraint("regex", rx)))
    assert finish == "stop" and re.fullmatch(rx, text)
