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


# Two backends, two sets of kernels: llama.cpp's CPU matmuls quantize the activations to 8 bits for Q4_1
# weights (and round differently from one CPU to the next), MLX multiplies in float32. Measured here (AMD
# EPYC, AVX-512): the same token's logprob differs by up to 0.32 nats between them (typically < 0.1), so
# where the schema leaves a near-tie (an "age": 25 against 30, measured gaps 0.03-0.06 nats on both sides)
# the greedy paths may part.
NEAR_TIE = 0.5  # nats: a parting is a fault unless both backends rank the two tokens within this


def _trace(eng, params: SamplingParams) -> tuple[str, str, list[tuple[int, dict[int, float]]]]:
    """(text, finish reason, per token: (id, {id: logprob}) for it and the top 20 of the model's own logprobs,
    before the schema's mask)."""
    chunks = list(eng.chat([Message("user", "Describe a person as JSON.")], params))
    steps = [(x.token_id, {**dict(zip(x.top_ids, (lp for _, lp in x.top))), x.token_id: x.logprob})
             for c in chunks for x in c.logprobs or []]
    return "".join(c.text for c in chunks), chunks[-1].finish_reason, steps


@pytest.mark.parametrize("schema", [NESTED, REFS], ids=["nested", "refs"])
def test_mlx_and_llamacpp_agree_at_temperature_0(mlx_smollm, smollm_engine, schema):
    """Same constrained greedy path on both backends, token for token, up to a near-tie: where they part,
    each backend's own logprobs must put the other's token within ``NEAR_TIE`` of its own choice (checked),
    and both texts stay valid."""
    p = SamplingParams(temperature=0, max_tokens=60, logprobs=20, constraint=Constraint("json_schema", schema))
    m_text, m_finish, m_steps = _trace(mlx_smollm, p)
    l_text, l_finish, l_steps = _trace(smollm_engine, p)
    for text, finish in ((m_text, m_finish), (l_text, l_finish)):
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), schema)
    assert m_steps and l_steps
    for i, ((m_tok, m_top), (l_tok, l_top)) in enumerate(zip(m_steps, l_steps)):
        if m_tok != l_tok:
            for own, other, top, name in ((m_tok, l_tok, m_top, "mlx"), (l_tok, m_tok, l_top, "llama.cpp")):
                gap = top[own] - top.get(other, float("-inf"))
                assert gap < NEAR_TIE, (f"step {i}: {name} chose {own} over {other} by {gap:.3f} nats, not a near-tie; "
                                        f"mlx {m_text!r}, llama.cpp {l_text!r}")
            return  # a near-tie parted them: what follows is another path
    assert (m_text, len(m_steps)) == (l_text, len(l_steps))


def test_mlx_output_validates_over_seeds_and_regex_holds(mlx_smollm):
    import re

    for seed in range(2):  # the schema's validity over many seeds is test_constrain_engine's (llama.cpp, same mask)
        p = SamplingParams(temperature=1.0, seed=seed, max_tokens=60, constraint=Constraint("json_schema", NESTED))
        text, finish = _chat(mlx_smollm, p)
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), NESTED)
    rx = r"[A-Z][a-z]+ is [0-9]{2}\."
    text, finish = _chat(mlx_smollm, SamplingParams(temperature=0, max_tokens=20, constraint=Constraint("regex", rx)))
    assert finish == "stop" and re.fullmatch(rx, text)


def test_mlx_dry_steers_within_json_mode(mlx_smollm):
    """DRY on MLX (``backends.dry``) runs before the constraint's mask, so it steers among the tokens the
    grammar allows: the JSON-mode answer that repeats one word without DRY repeats less with it, and both
    stay inside the grammar (16 tokens each: the loop is under way by then)."""
    from test_constrained_loops import JSON_MODE, LOOPS, _loop_count, _prefix_of

    ask = [Message("user", LOOPS[0]["content"])]
    out = {}
    for dry in (0.0, 0.8):
        chunks = list(mlx_smollm.chat(ask, SamplingParams(temperature=0, max_tokens=16, dry_multiplier=dry,
                                                          constraint=JSON_MODE)))
        text, finish = "".join(c.text for c in chunks), chunks[-1].finish_reason
        if finish == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert finish == "length" and _prefix_of(JSON_MODE, text), text
        out[dry] = text
    print(out)
    assert out[0.8] != out[0.0] and _loop_count(out[0.8]) < _loop_count(out[0.0])
