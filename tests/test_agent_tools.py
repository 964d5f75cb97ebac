"""Agent mode without a model: the built-in tools on a scratch folder, the approval rule and ledger, the
result cap (a 10 MB result), where compaction cuts the history, and the tool-call constraint each template
family gets (the generic format where the template has no tool syntax)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun.agent.approvals import Approvals
from localrun.agent.compact import cut_index
from localrun.agent.toolbox import Toolbox
from localrun.agent.tools import builtin_tools
from localrun.backends.base import Message


@pytest.fixture
def folder(tmp_path) -> Path:
    (tmp_path / "notes.txt").write_text("alpha\nthe secret word is pineapple\nomega\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "code.py").write_text("print('pineapple')\n")
    return tmp_path


def test_read_set_reads_lists_and_searches(folder):
    tb = Toolbox(["read"], root=str(folder))
    assert set(tb.tools) == {"read_file", "list_folder", "search_text"}
    assert not any(t.asks for t in tb.tools.values())
    assert tb.call("list_folder", {"path": "."}).text == "notes.txt\nsub/"
    assert tb.call("read_file", {"path": "notes.txt", "offset": 2}).text == "the secret word is pineapple\nomega"
    hits = tb.call("search_text", {"pattern": "pine"}).text.splitlines()
    assert hits == ["notes.txt:2: the secret word is pineapple", "sub/code.py:1: print('pineapple')"]
    r = tb.call("read_file", {"path": "missing.txt"})
    assert r.error and r.text.startswith("error: no such file")
    # numbers are bounded, so a small model's constrained call cannot write digits until it is cut (Gemma-3 did)
    assert "maximum" in tb.check("read_file", {"path": "notes.txt", "offset": 10**12})


def test_write_set_asks_and_shows_a_diff_first(folder):
    tb = Toolbox(["write"], root=str(folder))
    w, e = tb.tools["write_file"], tb.tools["edit_file"]
    assert w.asks and e.asks
    diff = e.preview({"path": "notes.txt", "old": "pineapple", "new": "mango"})
    assert "--- a/notes.txt" in diff and "-the secret word is pineapple" in diff and "+the secret word is mango" in diff
    assert (folder / "notes.txt").read_text().count("pineapple") == 1  # a preview writes nothing
    assert tb.call("edit_file", {"path": "notes.txt", "old": "pineapple", "new": "mango"}).text == "edited notes.txt"
    assert "mango" in (folder / "notes.txt").read_text()
    assert "+hello" in w.preview({"path": "new.txt", "content": "hello\n"})
    r = tb.call("edit_file", {"path": "notes.txt", "old": "absent", "new": "x"})
    assert r.error and "occurs 0 times" in r.text


def test_shell_runs_in_the_folder_with_a_timeout(folder):
    tb = Toolbox(["shell"], root=str(folder))
    assert tb.call("run_shell", {"command": "ls sub; echo oops >&2; exit 3"}).text == "exit 3\ncode.py\noops\n"
    assert tb.tools["run_shell"].run({"command": "sleep 5", "timeout_s": 0.2}).startswith("timed out after 0.2 s")


def test_unknown_sets_are_refused():
    with pytest.raises(ValueError, match="unknown tool set 'net'"):
        builtin_tools(["read", "net"])


def test_a_10_mb_result_is_cut_with_a_note(tmp_path):
    (tmp_path / "huge.txt").write_text("y" * 10_000_000)
    tb = Toolbox(["read"], root=str(tmp_path))
    r = tb.call("read_file", {"path": "huge.txt"})
    assert r.cut and r.full_chars == 10_000_000 and not r.error
    assert len(r.text) < tb.result_cap + 100 and "[… cut 9992000 of 10000000 characters …]" in r.text


def test_approvals_yes_always_no_with_reason_and_the_ledger(folder):
    tool = Toolbox(["write"], root=str(folder)).tools["write_file"]
    answers = iter(["n not that file", "y", "a"])
    asked = []

    def ask(name, preview):
        asked.append(name)
        return next(answers)

    ap = Approvals(ask=ask)
    no = ap.decide(tool, {"path": "a"})
    assert not no.allowed and no.reason == "not that file"
    assert ap.decide(tool, {"path": "b"}).verdict == "yes"
    assert ap.decide(tool, {"path": "c"}).verdict == "always"
    assert ap.decide(tool, {"path": "d"}).verdict == "session"  # not asked again
    assert asked == ["write_file"] * 3
    lines = ap.lines()
    assert len(lines) == 5 and "not that file" in lines[0] and lines[-1] == "allowed for this session: write_file"
    assert not Approvals().decide(tool, {}).allowed  # no terminal: declined, with a reason naming the flag
    assert "--auto-approve" in Approvals().decide(tool, {}).reason
    assert Approvals(yes_all=True).decide(tool, {}).allowed


def test_compaction_cuts_at_a_user_turn_so_tool_pairs_stay_whole():
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    msgs = [Message("user", "1"), Message("assistant", "a"),
            Message("user", "2"), Message("assistant", "", tool_calls=call), Message("tool", "r"),
            Message("assistant", "b"),
            Message("user", "3"), Message("assistant", "", tool_calls=call)]  # unfinished: no result yet
    assert cut_index(msgs, 2) == 2  # the last two user turns kept, the call of turn 2 with its result
    assert cut_index(msgs, 1) == 6
    assert cut_index(msgs[:2], 2) == 0  # one turn only: nothing older to summarize


def test_compaction_keeps_fewer_turns_rather_than_summarize_only_its_last_summary():
    """Found in the tmux run: after a compaction, a turn whose tool steps filled the window had only the last
    summary before its two kept user turns; the policy then dropped the summary and the whole turn before it.
    Now the older turn is folded into the summary and only the current turn is kept whole."""
    from types import SimpleNamespace

    from localrun.agent.compact import Undo, older_cut

    pair = [Message("user", "[Summary of the earlier conversation]\n…"), Message("assistant", "Understood.")]
    msgs = pair + [Message("user", "add milk"), Message("assistant", "", tool_calls=[]), Message("tool", "no"),
                   Message("user", "an essay"), Message("assistant", "{}")]
    session = SimpleNamespace(compacted=[Undo([], pair, [])])
    assert cut_index(msgs, 2) == 2  # two user turns kept: only the summary is older
    assert older_cut(session, msgs, [], 2) == 5  # so the last one alone is kept
    assert older_cut(SimpleNamespace(compacted=[]), msgs, [], 2) == 2  # no compaction yet: the summary is a turn
    assert older_cut(session, msgs[:5], [], 2) == 0  # the summary and one turn: nothing to fold in


def test_a_summary_cut_at_max_tokens_is_unwrapped_from_the_generic_format():
    """Found in the tmux run: SmolLM2's summary, cut at its max_tokens inside {"response": "…"}, became the
    summary message as raw JSON."""
    from localrun.agent.compact import unwrap_response

    assert unwrap_response('{"response": "The user asked \\"why\\" and') == 'The user asked "why" and'
    assert unwrap_response('{"response": "caf\\u00') == "caf"  # a cut escape is dropped
    assert unwrap_response('{"response": "whole"}') == "whole"
    assert unwrap_response("plain words") == "plain words"


@pytest.mark.parametrize("template,syntax", [
    ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}", "generic"),
    ("{% if tools %}<tools>{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}<tool_call>", "hermes"),
])
def test_each_family_gets_a_call_constraint_in_its_syntax(template, syntax):
    """The step's constraint for a forced call: the template's own syntax, or the generic format."""
    from types import SimpleNamespace

    from localrun.agent.step import Stepper
    from localrun.dialects import detect_family

    session = SimpleNamespace(family=detect_family(template), engine=SimpleNamespace(template_source=template))
    tools = Toolbox(["read"]).definitions()
    st = Stepper(session, tools)
    assert st.family.tools == syntax
    setup = SimpleNamespace(thinking=False)
    forced = st.constraint("read_file", setup)
    assert forced.kind == "lark" and '"read_file"' in forced.source
    auto = st.constraint("auto", setup)
    assert (auto is not None) == (syntax == "generic")  # the generic answer is always one JSON object


def test_a_schema_llguidance_cannot_enforce_leaves_the_step_unconstrained_but_checked():
    """Lenient: under tool_choice auto the step runs without the constraint (and says why); a forced call
    cannot be made without it, so that is an error; the arguments are still validated with jsonschema."""
    from types import SimpleNamespace

    from localrun.agent.step import Stepper
    from localrun.agent.tools import Tool
    from localrun.dialects import detect_family
    from localrun.errors import ConstraintError

    schema = {"type": "object", "properties": {"word": {"type": "string", "pattern": "(?<=x)y"}}, "required": ["word"]}
    odd = Tool("tag", "Tag a word.", schema, lambda a: "tagged")
    tb = Toolbox([])
    tb.tools["tag"] = odd
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    st = Stepper(SimpleNamespace(family=detect_family(chatml), engine=SimpleNamespace(template_source=chatml)),
                 tb.definitions())
    c, why = st.lenient_constraint("auto", SimpleNamespace(thinking=False))
    assert c is None and "(?<=x)y" in why
    with pytest.raises(ConstraintError):
        st.lenient_constraint("tag", SimpleNamespace(thinking=False))
    assert "does not match" in tb.check("tag", {"word": "zz"})
    assert tb.check("tag", {"word": "xy"}) is None


TEMPLATES = sorted((Path(__file__).parent / "data" / "templates").rglob("*.jinja"))


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_an_agent_history_renders_with_every_template_and_a_call_can_be_forced(path):
    """A turn with a tool call and its result renders through each real template (its own tool syntax, or the
    generic format's text where it has none), the tools in the prompt, and a forced call's grammar builds."""
    from localrun.agent.step import Call, Stepper
    from localrun.backends.base import SamplingParams
    from localrun.chat.session import ChatMessage, ChatSession
    from localrun.model.chat_template import ChatTemplate

    source = path.read_text()

    class Renderer:  # the chat template alone (what an engine's tokenize_chat renders), no model
        template_source, n_ctx, model_path, backend = source, 4096, str(path), "none"
        has_chat_template = True

        def tokenize_chat(self, messages, *, tools=None, template_kwargs=None, **kw):
            self.text = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(
                messages, tools=tools, template_kwargs=template_kwargs)
            return self.text, list(range(len(self.text)))

    s = ChatSession(engine := Renderer(), SamplingParams(), context_policy="compact")
    call = Call("call_0123456789abcdef01234567", "list_folder", {"path": "."})
    s.messages = [ChatMessage("user", "What is here?"), ChatMessage("assistant", "", tool_calls=[call.as_history()]),
                  ChatMessage("tool", "notes.txt", tool_call_id=call.id, name=call.name),
                  ChatMessage("assistant", "There is notes.txt."), ChatMessage("user", "Read it.")]
    st = Stepper(s, Toolbox(["read"]).definitions())
    st.prompt(s.conversation(), constrained=True)
    setup = s.setup(constrained=True)
    assert "list_folder" in engine.text and "notes.txt" in engine.text and "read_file" in engine.text
    forced = st.constraint("read_file", setup)
    assert forced.kind == "lark" and "read_file" in forced.source
    t = st.family.thinking
    if setup.thinking and t is not None and t.opened_by_template:  # DeepSeek-R1: the call comes after the close
        assert forced.source.startswith("start: " + json.dumps(t.budget_close))


def test_the_loop_drops_whole_old_turns_when_compaction_is_off():
    """Without compaction, what does not fit loses its oldest whole turns (a call never parted from its result),
    the current turn always kept; said in one note."""
    from localrun.agent.loop import AgentLoop, Note
    from localrun.agent.step import Call, Stepper
    from localrun.backends.base import SamplingParams
    from localrun.chat.session import ChatMessage, ChatSession
    from localrun.model.chat_template import ChatTemplate

    source = (Path(__file__).parent / "data" / "templates" / "SmolLM2-135M-Instruct.gguf.jinja").read_text()

    class Renderer:  # one token per character: the chat template alone, no model
        template_source, n_ctx, model_path, backend, supports_tools = source, 1200, "x.gguf", "none", False

        def tokenize_chat(self, messages, *, tools=None, template_kwargs=None, **kw):
            text = ChatTemplate(source).render(messages, tools=tools, template_kwargs=template_kwargs)
            return text, list(range(len(text)))

    s = ChatSession(Renderer(), SamplingParams(max_tokens=16), system=None, context_policy="truncate-oldest")
    call = Call("call_1", "list_folder", {"path": "."})
    for i in range(3):
        s.messages += [ChatMessage("user", f"question {i} " + "x" * 150),
                       ChatMessage("assistant", "", tool_calls=[call.as_history()]),
                       ChatMessage("tool", "y" * 100, tool_call_id=call.id, name=call.name),
                       ChatMessage("assistant", "done")]
    loop = AgentLoop(s, Toolbox([]), None)
    notes = list(loop._fit(Stepper(s, None)))
    assert [type(n) for n in notes] == [Note] and "dropped the 8 oldest message(s)" in notes[0].text
    assert [m.role for m in s.messages] == ["user", "assistant", "tool", "assistant"]
    assert s.messages[0].content.startswith("question 2")
