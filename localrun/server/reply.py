"""One reply pipeline under every chat route (OpenAI, Ollama, Anthropic): request → prompt, chunks → events.

``prepare_chat`` turns the wire-neutral parts of a chat request (messages as dicts, tools, ``tool_choice``,
and the one reasoning control ``think``/``level``/``budget``) into the prompt tokens, the template family
(``dialects.detect_family``) and the ``ReplyOptions`` the parser needs; it also sets the engine's token
control fields on ``SamplingParams`` (thinking budget, ``tool_choice`` constraint).

``reply_events`` runs a job's ``Chunk``s through the family's ``dialects.ReplyParser`` and yields
``Delta`` (channel "thinking" | "content"), ``ToolCallStart``/``ToolCallArgs``/``ToolCallEnd``,
``Logprobs`` (the chunk's token logprobs, after that chunk's deltas) and, last, one ``Finish``. Each route
renders those events; a non-streaming answer is the same events gathered by ``collect_reply``, so
streaming and non-streaming answers agree by construction.

Tools on a template without tool syntax (``Family.tools`` None: SmolLM2's ChatML, ``--chat-template gemma``)
use the generic format (``dialects.generic``, llama-server's fallback): the family becomes
``tools="generic"``, the tools are described in the first system message, the whole answer is
constrained to a tool-call object or ``{"response": ...}`` (``constrain.generic_constraint``) and the
parser reads it back, so every wing gets tool calls without code of its own. ``serve --no-generic-tools``
(``ServeOptions.generic_tools``) turns it off: such requests are refused as before. Past tool calls and
results render as text in that format on any template that does not render ``tool_calls`` itself.

The reasoning control (docs/architecture.md §3): OpenAI ``reasoning_effort``, Ollama ``think`` and Anthropic
``thinking.budget_tokens`` all become ``(think, level, budget)``. ``think=False`` turns thinking off with
the template's toggle (Qwen3 ``enable_thinking``); a template that cannot turn it off (DeepSeek-R1 opens
the block itself) gets a budget of 0 tokens, so the engine closes the block at once. A level the template
takes (gpt-oss ``reasoning_effort``) is passed to it; otherwise a level is a budget (``EFFORT_BUDGET``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import AsyncIterator, Sequence

from starlette.concurrency import run_in_threadpool

from localrun.backends.base import SamplingParams, Stats, TokenLogprob
from localrun.dialects import Delta, Family, ReplyParser, ToolCallArgs, ToolCallEnd, ToolCallStart, detect_family
from localrun.dialects import template_kwargs as family_template_kwargs
from localrun.server.errors import RequestError
from localrun.server.wire import wire_reason

# thinking budget (tokens) for an effort level when the template takes no levels (documented in docs/serve.md, Thinking)
EFFORT_BUDGET = {"minimal": 128, "low": 512, "medium": 2048, "high": 8192}


@dataclass
class ReplyOptions:
    """How to parse one reply. ``thinking``: this request thinks (the template opened the block or the
    model may open one); ``raw_thinking``: keep the thinking markers in the content (OpenAI
    ``reasoning_format: "none"``); ``tools``: the tools offered (None: no tool-call parsing);
    ``tool_choice``: "auto" | "required" | {"type": "function", "function": {"name": ...}} | None."""

    thinking: bool = False
    raw_thinking: bool = False
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None


@dataclass
class Logprobs:
    """The token logprobs of one chunk (OpenAI ``logprobs``), yielded after that chunk's deltas."""

    items: list[TokenLogprob]


@dataclass
class Finish:
    """The end of a reply. ``reason``: "stop" | "length" | "tool_calls" | "loop" | "cancelled" (tool_calls
    when the reply made at least one complete call and ended by itself); ``stats`` the engine's;
    ``reasoning_tokens``: completion tokens generated while the thinking block was open (its close marker
    included); ``token_ids`` the completion's token ids. ``looped``: the loop guard ended it; under a
    constraint ``reason`` is then "length" (``wire_reason``)."""

    reason: str
    stats: Stats
    reasoning_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)  # the completion's tokens (Ollama's ``context``)
    looped: bool = False


@dataclass
class ToolCall:
    """A finished tool call: ``arguments`` the JSON string as generated, ``args`` the parsed object."""

    id: str
    name: str
    arguments: str
    args: dict


@dataclass
class Reply:
    """A whole reply, gathered from the events (``collect_reply``): what a non-streaming answer shows."""

    content: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: Finish | None = None


@lru_cache(maxsize=8)
def family_of(template_source: str | None) -> Family:
    """``dialects.detect_family``, once per template text."""
    return detect_family(template_source)


# ---------------------------------------------------------------------------------------------- request


async def prepare_chat(st, messages: Sequence, *, tools: list[dict] | None, tool_choice: str | dict | None,
                       think: bool | None, level: str | None, budget: int | None, params: SamplingParams,
                       raw_thinking: bool = False, template_kwargs: dict | None = None,
                       parallel_tool_calls: bool = False) -> tuple[str, list[int], Family, ReplyOptions]:
    """A chat request → (prompt text, prompt tokens, family, reply options); sets ``params``' token control.

    ``messages``: dicts (role, content, tool_calls, tool_call_id, name, reasoning_content) or ``Message``s.
    ``tools``: OpenAI-shaped tool definitions (``{"type": "function", "function": {...}}``).
    ``tool_choice``: "none" (tools are not offered; on the generic format they stay described and the
    constraint allows only an answer), "auto"/None, "required" or
    ``{"type": "function", "function": {"name": N}}`` (both enforced by a constraint on the output).
    ``think``/``level``/``budget``: the reasoning control (module docstring); ``budget`` in tokens, None:
    the level's, else ``serve --reasoning-budget``. ``template_kwargs``: the client's own
    (``chat_template_kwargs``), applied over the computed ones. ``parallel_tool_calls``: the generic
    format may make several calls in one answer (its ``tool_calls`` array; llama-server's default: one).
    Raises RequestError (unknown tool name, tools on a template without them under
    ``--no-generic-tools``), ChatTemplateError, ContextOverflowError."""
    family = family_of(st.engine.template_source)
    # the generic format under "none": the tools stay described (the prompt's prefix is the one the turns
    # that may call share, so the KV cache holds) and the constraint allows only an answer
    answer_only = tool_choice == "none" and bool(tools) and family.tools is None and generic_tools_on(st)
    tools, choice = _tool_setup(st, tools, "auto" if answer_only else tool_choice)
    generic = tools is not None and family.tools is None and generic_tools_on(st)
    if generic:
        family = replace(family, tools="generic")
    kwargs = dict(template_kwargs or {})
    t = family.thinking
    if t is not None and t.toggle_kwarg and t.toggle_kwarg in kwargs and think is None:
        think = bool(kwargs[t.toggle_kwarg])  # chat_template_kwargs.enable_thinking is the switch itself
    constrained = choice is not None or generic
    if constrained and t is not None and t.toggle_kwarg:
        think = False  # a forced call is the whole reply: the constraint starts at the first token
    kwargs = {**family_template_kwargs(family, think=think, level=level), **kwargs}
    thinking = t is not None and (think is not False or not t.toggle_kwarg)
    if thinking and not constrained:
        _budget_fields(params, family, think=think, level=level, budget=budget,
                       default_budget=st.options.reasoning_budget)
        if params.constraint is not None:  # a response format: the thinking block comes first
            from localrun.constrain import after_thinking

            params.constraint = after_thinking(params.constraint, t)
    if family.name == "gpt-oss":
        params.render_special = True  # the channel markers are the reply's structure
    if constrained:
        _tool_constraint(params, family, tools, choice, close_thinking=thinking and t.opened_by_template,
                         parallel=parallel_tool_calls, answer_only=answer_only)
    msgs = _history(_history_family(family, st.engine.template_source), messages)
    if generic:
        from localrun.dialects.generic import add_system, instructions

        name = choice["function"]["name"] if isinstance(choice, dict) else None
        msgs = add_system(msgs, instructions(tools, name=name, required=choice == "required",
                                             parallel=parallel_tool_calls))
    template_tools = None if generic else tools

    def work():
        from localrun.server.images import resolve_images  # URLs fetched here, in the worker thread

        ready = resolve_images(st.engine, msgs, allow_urls=st.options.allow_image_urls)
        return st.engine.tokenize_chat(ready, tools=template_tools, template_kwargs=kwargs or None,
                                       parse_special_in_content=st.options.parse_special_in_content)

    text, tokens = await run_in_threadpool(work)
    st.check_fits(tokens)
    opts = ReplyOptions(thinking=thinking, raw_thinking=raw_thinking, tools=tools,
                        tool_choice="none" if answer_only else choice if choice is not None
                        else ("auto" if tools else None))
    return text, tokens, family, opts


def _tool_setup(st, tools: list[dict] | None, tool_choice) -> tuple[list[dict] | None, str | dict | None]:
    """(tools for the template, forced choice: None | "required" | named dict). RequestError on a bad choice."""
    if tool_choice == "none" or (not tools and tool_choice in (None, "auto")):
        return None, None
    if not tools:
        raise RequestError("tool_choice needs 'tools' to choose from", param="tool_choice",
                           hint="send the tools with the request, or leave tool_choice out")
    if not tools_supported(st):
        raise RequestError(f"{st.model_id}'s chat template does not support tools", param="tools",
                           code="tools_unsupported",
                           hint="use a model whose chat template renders `tools` (e.g. Qwen2.5, Llama 3.1), "
                           "send the request without tools, or restart the server without --no-generic-tools")
    if tool_choice in (None, "auto"):
        return tools, None
    if tool_choice == "required":
        return tools, "required"
    name = _choice_name(tool_choice)
    names = [(t.get("function") or {}).get("name") for t in tools]
    if name not in names:
        raise RequestError(f"tool_choice names the function {name!r}, which is not among the tools "
                           f"({', '.join(map(str, names))})", param="tool_choice", code="invalid_value")
    return tools, {"type": "function", "function": {"name": name}}


def generic_tools_on(st) -> bool:
    """Whether tools on a template without tool syntax use the generic format (not ``--no-generic-tools``)."""
    return bool(getattr(st.options, "generic_tools", True))


def tools_supported(st) -> bool:
    """Whether a request with tools is served: the template renders them, or the generic format is on."""
    return bool(st.engine.supports_tools) or generic_tools_on(st)


def _history_family(family: Family, template_source: str | None) -> Family:
    """The family whose shape past tool calls take: a template without tool syntax that does not render
    ``tool_calls`` itself gets them as text in the generic format (whatever the options: history always
    renders)."""
    if family.tools is None and "tool_calls" not in (template_source or ""):
        return replace(family, tools="generic")
    return family


def _choice_name(tool_choice) -> str | None:
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
        if isinstance(tool_choice.get("name"), str):
            return tool_choice["name"]
    raise RequestError(f"tool_choice must be 'none', 'auto', 'required' or "
                       f"{{'type': 'function', 'function': {{'name': ...}}}}, got {tool_choice!r}",
                       param="tool_choice", code="invalid_value")


def _budget_fields(params: SamplingParams, family: Family, *, think: bool | None, level: str | None,
                   budget: int | None, default_budget: int | None) -> None:
    """The engine's thinking-budget fields on ``params`` (SamplingParams' token-control fields)."""
    t = family.thinking
    if budget is None and think is False:
        budget = 0  # no toggle in the template: close the block at once
    if budget is None and level is not None and level not in t.levels:
        budget = EFFORT_BUDGET.get(level)
    if budget is None:
        budget = default_budget
    params.reasoning_budget = budget
    params.budget_close = t.budget_close
    params.think_open, params.think_close = t.open, t.close
    params.starts_in_thinking = t.opened_by_template


def _tool_constraint(params: SamplingParams, family: Family, tools: list[dict], choice, *,
                     close_thinking: bool, parallel: bool = False, answer_only: bool = False) -> None:
    """``params.constraint`` forcing one tool call in the family's syntax (``constrain.tool_call_constraint``,
    docs/architecture.md §2), or, for the generic family under ``tool_choice`` auto (``choice`` None), a
    call or a plain answer (``constrain.generic_constraint``; a JSON ``response_format`` becomes the
    answer's schema). ``close_thinking``: the prompt ends inside the thinking block (DeepSeek-R1), so the
    constraint first writes the family's close (no thinking), then the call."""
    import re

    from localrun.backends.base import Constraint
    from localrun.constrain import generic_constraint, tool_call_constraint

    own = getattr(params, "constraint", None)
    if choice is None:  # the generic format, tool_choice auto
        if params.grammar or (own is not None and own.kind not in ("json_schema", "json_object")):
            raise RequestError("a grammar or regex response format cannot be combined with tools on a template "
                               "without tool syntax (the generic format's answer is JSON)", param="tools",
                               hint="use a JSON response_format, or send the request without tools")
        response = None if own is None else own.source if own.kind == "json_schema" else {"type": "object"}
        c = generic_constraint(tools, parallel=parallel, response=response, answer_only=answer_only)
    elif own is not None or params.grammar:
        raise RequestError("tool_choice 'required' or a named function cannot be combined with response_format",
                           param="tool_choice", hint="drop response_format, or use tool_choice 'auto'")
    else:
        name = choice["function"]["name"] if isinstance(choice, dict) else None
        c = tool_call_constraint(family.tools, tools, name, parallel=parallel and family.tools == "generic")
    if close_thinking:
        grammar = re.sub(r"^start:", "tool_call:", c.source, count=1, flags=re.M)
        c = Constraint("lark", f"start: {json.dumps(family.thinking.budget_close)} tool_call\n{grammar}",
                       param=c.param)
        # the close the constraint writes is the thinking block's: stop strings do not search it
        params.think_open, params.think_close = family.thinking.open, family.thinking.close
        params.starts_in_thinking = True
    params.constraint = c


def _history(family: Family, messages: Sequence) -> list[dict]:
    """Messages → dicts in the shape the family's template reads (``dialects.history``: tool-call arguments
    as object or string, null content, tool results' names, earlier thinking kept or dropped)."""
    from localrun.dialects.history import messages_for_template

    return messages_for_template([m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in messages], family)


# ---------------------------------------------------------------------------------------------- reply


async def reply_events(st, job, family: Family, opts: ReplyOptions, request=None) -> AsyncIterator:
    """The job's chunks as reply events (module docstring), ``Finish`` last. ``request``: watch it for a
    disconnect (non-streaming answers; a stream's own send failure cancels the job). Raises the engine's
    LocalrunErrors, ClientGone."""
    parser = ReplyParser(family, thinking=opts.thinking, tools=bool(opts.tools), raw_thinking=opts.raw_thinking)
    counter = _ReasoningCounter(family, opts)
    called, ids, names = False, [], {}
    async for c in st.chunks(job, request):
        if c.token_id is not None:
            ids.append(c.token_id)
        events = parser.feed(c.text) if c.text else []
        if c.finish_reason is not None:
            events += parser.finish()
        counter.add(c.text, c.token_id is not None, _answer_in(events))
        called = called or any(isinstance(e, ToolCallEnd) for e in events)
        for e in events:
            if isinstance(e, ToolCallStart):
                names[e.index] = e.name
            elif isinstance(e, ToolCallEnd):
                check_arguments(opts.tools, names.get(e.index), e.arguments)
            yield e
        if c.logprobs:
            yield Logprobs(list(c.logprobs))
        if c.finish_reason is not None:
            reason = "tool_calls" if called and c.finish_reason == "stop" else c.finish_reason
            yield Finish(wire_reason(reason, getattr(job, "params", None)), c.stats or Stats(), counter.n_tokens, ids,
                         looped=c.finish_reason == "loop")
            return


def check_arguments(tools: list[dict] | None, name: str | None, args) -> list[str]:
    """A finished call's arguments against its tool's whole ``parameters`` schema (``jsonschema``: the
    keywords constrained decoding could not enforce included, ``constrain.grammar`` docstring) → the
    violations, each logged as a warning. The call still goes to the client, as a hosted API's non-strict
    call would: the agent checks it against the same schema and answers the model with an error result."""
    from localrun.constrain.grammar import argument_errors

    fn = next((t.get("function", t) for t in tools or [] if t.get("function", t).get("name") == name), None)
    errors = argument_errors(fn.get("parameters"), args) if fn else []
    if errors:
        import logging

        logging.getLogger("localrun.server").warning("tool call %s: its arguments do not match the tool's schema "
                                                     "(%s); passed on for the client to answer", name,
                                                     "; ".join(errors))
    return errors


class _ReasoningCounter:
    """Completion tokens inside the thinking block, its markers included, read from the raw text (so
    ``reasoning_format: none`` counts the same): from the open marker (or the prompt, when the template
    opened the block) to the token that completes the close marker."""

    def __init__(self, family: Family, opts: ReplyOptions) -> None:
        self.t = family.thinking
        self.done = not opts.thinking or self.t is None
        self.open = not self.done and self.t.opened_by_template
        self.tail = ""  # the recent raw text: enough to find a marker cut over several tokens
        self.n_tokens = 0

    def add(self, text: str, is_token: bool, answered: bool) -> None:
        if self.done:
            return
        self.tail += text
        if not self.open:
            if self.t.open not in self.tail:
                self.done = answered  # the model answered without thinking
                self.tail = self.tail[-len(self.t.open):]
                return
            self.open = True
            self.tail = self.tail[self.tail.index(self.t.open) + len(self.t.open):]
        self.n_tokens += is_token
        if self.t.close in self.tail:
            self.done = True
        self.tail = self.tail[-len(self.t.close):]


def _answer_in(events) -> bool:
    """Whether ``events`` hold answer text (not just whitespace) or a tool call."""
    return any(not isinstance(e, Delta) or (e.channel == "content" and e.text.strip()) for e in events)


async def collect_reply(events: AsyncIterator) -> Reply:
    """Gather ``reply_events`` into one ``Reply`` (a non-streaming answer)."""
    r = Reply()
    content, thinking, args, calls = [], [], {}, {}
    async for e in events:
        if isinstance(e, Delta):
            (thinking if e.channel == "thinking" else content).append(e.text)
        elif isinstance(e, ToolCallStart):
            calls[e.index] = (e.id, e.name)
            args[e.index] = []
        elif isinstance(e, ToolCallArgs):
            args.setdefault(e.index, []).append(e.text)
        elif isinstance(e, ToolCallEnd):
            cid, name = calls[e.index]
            r.tool_calls.append(ToolCall(cid, name, "".join(args[e.index]) or json.dumps(e.arguments), e.arguments))
        elif isinstance(e, Logprobs):
            r.logprobs.extend(e.items)
        elif isinstance(e, Finish):
            r.finish = e
    r.content, r.thinking = "".join(content), "".join(thinking)
    return r
