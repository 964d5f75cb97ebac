"""The first requests real coding agents send, as they send them (``tests/data/clients/``), pass localrun's
request checks and every tool they declare compiles to a grammar (fast tier, no model).

Each file is one client version's first request, captured through a recording proxy (nothing rewritten)
by ``tests/clients/capture_corpus.py`` and sanitized (paths, dates, ids): Claude Code (Anthropic
Messages), Codex (OpenAI Responses) and Qwen Code (OpenAI chat completions), at the versions the client
tests pin and at older ones users still run. A tool-schema keyword or a hosted tool that ended a session
(``propertyNames`` in Claude Code 2.1.197's ``TaskCreate``, Codex's ``web_search``, a ``oneOf`` of two
string branches in Qwen Code's tools) shows up here before any model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun.backends.base import Constraint
from localrun.constrain import check, generic_constraint, tool_call_constraint
from localrun.model.chat_template import BUILTIN_TEMPLATES, ChatTemplate

CORPUS = sorted((Path(__file__).parent / "data" / "clients").glob("*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_corpus_has_every_client_at_two_versions():
    seen: dict[str, set[str]] = {}
    for p in CORPUS:
        d = _load(p)
        seen.setdefault(d["client"], set()).add(d["version"])
    assert set(seen) >= {"claude-code", "codex", "qwen-code"}, seen
    assert all(len(v) >= 1 for v in seen.values()) and len(seen["claude-code"]) >= 2 and len(seen["codex"]) >= 2


def _chat_view(d: dict) -> tuple[list[dict], list[dict] | None, object]:
    """The request through its wing's own checks → (template messages, OpenAI-shaped tools, tool_choice)."""
    path, body = d["path"].split("?")[0], d["body"]
    if path == "/v1/messages":
        from localrun.server.anthropic import convert as ac
        from localrun.server.anthropic.schemas import MessagesRequest

        req = MessagesRequest.model_validate(body)
        ac.reasoning_from_anthropic(req)
        ac.sampling_from_anthropic(req)
        tools, choice = ac.tools_from_anthropic(req)
        return [m if isinstance(m, dict) else m.to_dict() for m in ac.history_from_anthropic(req)], tools, choice
    if path == "/v1/responses":
        from localrun.server.responses import convert as rc
        from localrun.server.responses.schemas import ResponsesRequest

        req = ResponsesRequest.model_validate(body)
        items = rc.check_items(rc.input_items(req.input), {})
        setup = rc.tool_setup(req.tools, req.tool_choice)
        rc.format_constraint(req.text.format if req.text else None)
        return rc.messages_from_items(req.instructions, items), setup.chat_tools, setup.choice
    assert path == "/v1/chat/completions", path
    from localrun.server.openai import convert as oc
    from localrun.server.openai.schemas import ChatCompletionRequest

    req = ChatCompletionRequest.model_validate(body)
    oc.sampling_from_openai(req, max_tokens=req.max_tokens, logprobs=None)
    msgs = [m if isinstance(m, dict) else m.to_dict() for m in oc.messages_from_openai(req.messages)]
    return msgs, [t.model_dump(exclude_none=True) for t in req.tools or []] or None, req.tool_choice


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_a_real_first_request_passes_and_its_tools_compile(path):
    d = _load(path)
    msgs, tools, _ = _chat_view(d)
    assert msgs and tools, "a first request of an agent carries its prompt and its tools"
    for t in tools:  # each tool's schema, as the constraint engine takes it (lenient unless strict)
        fn = t["function"]
        check(Constraint("json_schema", fn.get("parameters") or {"type": "object"},
                         param=f"tools[{fn['name']}].function.parameters", strict=fn.get("strict") is True))
    check(generic_constraint(tools))  # a template without tool syntax (Gemma, SmolLM2): the whole answer
    check(tool_call_constraint("hermes", tools, None))  # tool_choice required on a Hermes/Qwen template
    from localrun.dialects.generic import add_system, instructions

    gemma = ChatTemplate(BUILTIN_TEMPLATES["gemma"], bos_token="<bos>", eos_token="<eos>")
    text = gemma.render(add_system(msgs, instructions(tools)))  # the built-in template takes the history
    assert text.count("<start_of_turn>user") >= 1
