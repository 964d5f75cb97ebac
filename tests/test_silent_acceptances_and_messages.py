"""Silent acceptances and misleading messages (a default nobody was told, a value taken without a word),
each read as the user or HTTP client sees it. No model loads here."""

from __future__ import annotations

import re

import pytest
from helpers import serve_run_kwargs

from localrun.server.errors import RequestError


def _help(*args: str) -> str:
    from typer.testing import CliRunner

    from localrun.cli import app

    r = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    return re.sub(r"[\s│]+", " ", r.output)


@pytest.mark.parametrize("command", ["serve", "chat", "bench"])
def test_spec_help_says_off_by_default_and_why_and_draft_max_16(command):
    text = _help(command)
    assert "Off by default" in text or "off by default" in text
    assert "not lossless" in text and "0.3 nat" in text  # what a user gives up (docs/chat.md, Not exact)
    assert "default 16" in text and "default 8" not in text


def test_serve_speculates_only_when_asked(monkeypatch, tmp_path):
    assert serve_run_kwargs(monkeypatch, tmp_path)["speculation"].mode == "off"
    assert serve_run_kwargs(monkeypatch, tmp_path, "--spec", "ngram")["speculation"].mode == "ngram"


def test_logit_bias_beyond_openais_range_is_a_400_naming_the_value():
    from localrun.server.openai.convert import sampling_from_openai
    from localrun.server.openai.schemas import ChatCompletionRequest

    def bias(b):
        req = ChatCompletionRequest.model_validate({"messages": [], "logit_bias": b})
        return sampling_from_openai(req, max_tokens=None, logprobs=None).logit_bias

    assert bias({"5": -100, "6": 100, "7": 2.5}) == {5: -100.0, 6: 100.0, 7: 2.5}
    with pytest.raises(RequestError) as e:
        bias({"42": 250})
    assert "250" in str(e.value) and "-100 and 100" in str(e.value) and e.value.param == "logit_bias.42"


def test_validation_messages_quote_json_not_python():
    from localrun.server.app import _quoted_input

    assert _quoted_input({"input": True}) == " (got true)"
    assert _quoted_input({"input": None}) == " (got null)"
    assert _quoted_input({"input": "wizard"}) == ' (got "wizard")'


def test_a_content_part_without_a_type_is_named_so():
    from pydantic import ValidationError

    from localrun.server.openai.schemas import ChatCompletionRequest

    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [{"text": "hi"}]}]})
    assert "has no 'type'" in str(e.value) and "None" not in str(e.value)


def test_a_huge_integer_is_a_400_without_pythons_hint():
    from localrun.server.body import parse_json_body

    with pytest.raises(RequestError) as e:
        parse_json_body(b'{"max_tokens": ' + b"9" * 5000 + b"}")
    assert "set_int_max_str_digits" not in str(e.value) and "5000 digits" in str(e.value)
    assert e.value.param == "max_tokens"
    assert parse_json_body(b'{"n": -12, "m": [1, 2]}') == {"n": -12, "m": [1, 2]}


def test_no_chat_template_hint_names_what_a_server_client_can_do():
    from localrun.errors import ChatTemplateError
    from localrun.model.chat_template import render_chat

    with pytest.raises(ChatTemplateError) as e:
        render_chat(None, "/m/base.gguf", [{"role": "user", "content": "hi"}])
    hint = e.value.hint
    assert "chat --raw" in hint and "/v1/completions" in hint and "--chat-template" in hint


def test_fit_vram_label_says_gpu_once():
    from localrun.commands.fit import machine

    label = machine(vram="24GiB").label
    assert "GPU GPU" not in label and "GPU" in label and "24GiB" in label, label
    assert "GPU RTX 4090" in machine(vram="24GiB", gpu="RTX 4090").label


def test_an_empty_input_to_embed_is_a_400_on_both_wire_formats(tmp_path):
    import asyncio
    import sys
    from pathlib import Path

    import httpx

    sys.path.insert(0, str(Path(__file__).parent))
    from fakes import ScriptedEngine

    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    app = create_app(ScriptedEngine(1), Settings(home=tmp_path, models_dir=tmp_path / "models"), ServeOptions(),
                     embedder_factory=lambda engine: None)

    async def body():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fake", timeout=30) as http:
            r = await http.post("/v1/embeddings", json={"model": "m", "input": ""})
            assert r.status_code == 400 and "nothing to embed" in r.json()["error"]["message"], r.text
            r = await http.post("/v1/embeddings", json={"model": "m", "input": ["a cat", ""]})
            assert r.status_code == 400 and "'input[1]' is empty" in r.json()["error"]["message"], r.text
            r = await http.post("/api/embed", json={"model": "m", "input": ""})
            assert r.status_code == 400 and "nothing to embed" in r.json()["error"], r.text

    asyncio.run(body())


def test_legacy_logprobs_keep_one_entry_per_partial_utf8_token():
    """Tokens that are each part of a UTF-8 sequence all show as '\\ufffd': the legacy ``logprobs`` name them by
    their bytes (OpenAI's ``bytes:\\xe2\\x80``), so none collapses into another."""
    from localrun.backends.base import TokenLogprob
    from localrun.server.openai.convert import completion_logprobs

    t = TokenLogprob(token="\ufffd", logprob=-1.0, bytes=[0xE2, 0x80], top=[("\ufffd", -1.0), ("\ufffd", -2.0),
                     ("a", -3.0)], token_id=5, top_ids=[5, 6, 7], top_bytes=[[0xE2, 0x80], [0xE2, 0x81], [97]])
    lp = completion_logprobs([t, t])
    assert lp["tokens"] == ["bytes:\\xe2\\x80"] * 2 and len(lp["token_logprobs"]) == 2
    assert lp["top_logprobs"][0] == {"bytes:\\xe2\\x80": -1.0, "bytes:\\xe2\\x81": -2.0, "a": -3.0}
    no_bytes = TokenLogprob(token="\ufffd", logprob=-1.0, bytes=[0xE2], top=[("\ufffd", -1.0), ("\ufffd", -2.0)],
                            top_ids=[5, 6])  # an engine that does not give the alternatives' bytes
    assert len(completion_logprobs([no_bytes])["top_logprobs"][0]) == 2


def test_rolling_says_what_it_dropped_before_the_answer():
    """``--context-policy rolling`` with a message longer than the context: the notice counts the tokens
    dropped, and comes through ``on_notice`` while the prompt is fitted, before any answer token."""
    from localrun.backends.base import Chunk
    from localrun.chat.session import ChatSession

    events: list[str] = []

    class Eng:
        n_ctx = 64
        model_path = "m.gguf"
        template_source = None
        dialect = None

        def tokenize(self, text, add_special=False, parse_special=False):
            return list(range(len(text.split())))

        def detokenize(self, toks):
            return " ".join("w" for _ in toks)

        def tokenize_chat(self, msgs, template_kwargs=None, **kw):
            return "", [0] * sum(len(m["content"].split()) + 2 for m in msgs)

        def chat_tokens(self, *a, **kw):
            raise AssertionError

        def generate(self, prompt, params, **kw):
            events.append("answer")
            yield Chunk(text="ok", token_id=1, finish_reason="stop")

    from localrun.backends.base import SamplingParams

    s = ChatSession(Eng(), SamplingParams(temperature=0, max_tokens=8), system=None, context_policy="rolling")
    s.on_notice = lambda note: events.append(note)
    list(s.send("word " * 200))
    assert events and events[0].startswith("context full: dropped the first"), events
    assert "of the 200 tokens of your message" in events[0] and "answer" in events[1:]


def test_an_alias_keeps_naming_its_model_after_an_unload(tmp_path):
    """``serve MODEL --alias NAME``: ``/api/chat`` answers NAME while the model is unloaded (it is the default
    model); ``/api/show`` resolves names strictly, so NAME must stay known there too, not 404."""
    import asyncio

    from localrun.config import Settings
    from localrun.server.names import ModelNames

    names = ModelNames(Settings(home=tmp_path, models_dir=tmp_path / "models"), residents={})
    names.alias("mine", "/models/x.gguf")
    assert names.known("mine") == names.known("mine:latest") == "/models/x.gguf"
    assert asyncio.run(names.resolve_strict("mine")) == "/models/x.gguf"
    names.forget()  # the store changed: an alias is not a store name, it stays
    assert names.known("mine") == "/models/x.gguf" and names.known("other") is None
