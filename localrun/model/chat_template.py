"""Chat templates: the GGUF's own Jinja template (``tokenizer.chat_template``), or a named/file override.

Rendering follows Hugging Face transformers' ``apply_chat_template`` environment (sandboxed Jinja2,
``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, ``tojson``, ``raise_exception``, ``strftime_now``),
as llama-cpp-python's ``Jinja2ChatFormatter`` and llama.cpp's ``common/chat.cpp`` do.
"""

from __future__ import annotations

import json
import re
import secrets
from datetime import datetime
from pathlib import Path
from typing import Callable, Sequence

from localrun.errors import ChatTemplateError

# A few well-known templates for GGUFs that lack one (``--chat-template NAME``). Each renders the same string
# as the official template it stands for (tests/templates/ holds those texts; tests/test_templates.py compares
# them); a role that the format cannot express raises ChatTemplateError instead of being dropped.
_ROLE_ERROR = ('{{ raise_exception("the built-in %s template cannot express a " ~ %s ~ " message; use the '
               'model\'s own template (--chat-template FILE)") }}')

BUILTIN_TEMPLATES: dict[str, str] = {
    # ChatML (SmolLM2, Qwen, Hermes): any role name is written as is
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    # Meta-Llama-3-8B-Instruct: BOS, a header per message (any role: Llama 3.1+ name tool results "ipython")
    "llama3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    # Gemma 3 (-it): a first system message becomes the prefix of the first user turn; assistant → model
    "gemma": (
        "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}"
        "{% set prefix = messages[0]['content'] + '\n\n' %}{% set rest = messages[1:] %}"
        "{% else %}{% set prefix = '' %}{% set rest = messages %}{% endif %}"
        "{% for m in rest %}{% if m['role'] not in ('user', 'assistant') %}"
        + _ROLE_ERROR % ("gemma", "(m['role'] if m['role'] != 'system' else 'system (after the first)')") +
        "{% endif %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
        "{% if loop.first %}{{ prefix }}{% endif %}{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    # Mistral-7B-Instruct-v0.3 ([INST]): the system message goes before the last user message
    "mistral": (
        "{% if messages and messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}"
        "{% set rest = messages[1:] %}{% else %}{% set sys = none %}{% set rest = messages %}{% endif %}"
        "{% set users = rest | selectattr('role', 'equalto', 'user') | list %}"
        "{{ bos_token }}{% for m in rest %}{% if m['role'] == 'user' %}"
        "{% if sys is not none and m is sameas users[-1] %}[INST] {{ sys }}\n\n{{ m['content'] }}[/INST]"
        "{% else %}[INST] {{ m['content'] }}[/INST]{% endif %}"
        "{% elif m['role'] == 'assistant' %} {{ m['content'] | trim }}{{ eos_token }}"
        "{% else %}" + _ROLE_ERROR % ("mistral", "(m['role'] if m['role'] != 'system' else 'system (after the first)')")
        + "{% endif %}{% endfor %}"
        "{% if sys is not none and not users %}"
        "{{ raise_exception('the built-in mistral template writes the system message into a user message; "
        "add one') }}{% endif %}"
    ),
    # Phi-3.5-mini-instruct: system/user/assistant; EOS closes a prompt without a generation prompt
    "phi3": (
        "{% for m in messages %}{% if m['role'] not in ('system', 'user', 'assistant') %}"
        + _ROLE_ERROR % ("phi3", "m['role']") +
        "{% endif %}{% if m['role'] != 'system' or m['content'] %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}"
    ),
}


def load_template(name_or_file: str) -> str:
    """A builtin template name (``chatml``, ``llama3``, ``gemma``, ``mistral``, ``phi3``) or a file path.

    Raises ChatTemplateError naming the choices.
    """
    if name_or_file in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[name_or_file]
    p = Path(name_or_file).expanduser()
    if p.is_file():
        return p.read_text()
    raise ChatTemplateError(
        f"unknown chat template {name_or_file!r}",
        hint=f"use one of {', '.join(BUILTIN_TEMPLATES)} or a path to a Jinja template file",
    )


def template_supports_tools(source: str | None) -> bool:
    """Whether a Jinja chat template renders a ``tools`` list (HF templates that support tool use read it)."""
    return bool(source) and re.search(r"\btools\b", source) is not None


class ChatTemplate:
    """A compiled Jinja chat template. Raises ChatTemplateError on syntax or render errors."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class _IgnoreGeneration(jinja2.ext.Extension):  # HF's {% generation %} tag
            tags = {"generation"}

            def parse(self, parser):
                parser.stream.skip(1)
                return parser.parse_statements(("name:endgeneration",), drop_needle=True)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols, _IgnoreGeneration])
        # a lazy sequence (`tools | map(attribute='function') | tojson`, llama.cpp's DeepSeek-R1 template) is a list
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
            json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                       default=_lazy_list)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._tpl = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template does not compile: {e}",
                                    hint="pass --chat-template chatml (or another name/file)") from None
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._midway_system: bool | None = None  # renders a system message after the first turn (probed once)

    def render(self, messages: Sequence, *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None, template_kwargs: dict | None = None) -> str:
        """Messages (``Message`` or dicts with role/content) → prompt text. ``template_kwargs`` are extra
        variables for the template (``{"enable_thinking": False}``, ``{"reasoning_effort": "high"}``; see
        ``dialects.template_kwargs``). Raises ChatTemplateError."""
        return self._render([_as_dict(m) for m in messages], add_generation_prompt, tools, template_kwargs)

    def render_parts(self, messages: Sequence, *, add_generation_prompt: bool = True,
                     tools: list[dict] | None = None, template_kwargs: dict | None = None
                     ) -> list[tuple[str, bool]]:
        """The rendered prompt cut into ``(text, is_content)`` parts whose concatenation is ``render(...)``.

        ``is_content`` marks the text of a message (content, tool-call arguments) as opposed to what the
        template itself wrote (role markers, BOS, separators). Found by rendering once more with every
        content replaced by a unique placeholder and matching the two renderings (see ``_splice``), so a
        content that holds a marker's text (``<|im_end|>``) stays content. Raises ChatTemplateError, also
        when a template rewrites message text beyond recognition (then no part can be trusted)."""
        msgs = [_as_dict(m) for m in messages]
        text = self._render(msgs, add_generation_prompt, tools, template_kwargs)
        nonce = secrets.token_hex(4)
        contents: list[str] = []
        marked = [_mark_message(m, nonce, contents) for m in msgs]
        if not contents:
            return [(text, False)]
        try:
            skeleton = self._render(marked, add_generation_prompt, tools, template_kwargs)
        except ChatTemplateError:
            skeleton = None
        parts = _splice(text, skeleton, nonce, contents) if skeleton is not None else None
        if parts is None:
            raise ChatTemplateError(
                "the chat template rewrites message text in a way that cannot be told apart from its own "
                "markers, so the prompt cannot be tokenised safely",
                hint="use another template (--chat-template chatml|llama3|gemma|mistral|phi3|FILE), or, for "
                "trusted clients only, --parse-special-in-content")
        return parts

    @property
    def renders_system_midway(self) -> bool:
        """Whether the template renders a system message that comes after a user/assistant turn, in its
        place (ChatML, Llama 3 do; Gemma's raises "roles must alternate", others drop it silently). Probed
        once by rendering such a conversation and finding the system text after the first answer."""
        if self._midway_system is None:
            probe = "\u2063system-probe\u2063"
            msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
                    {"role": "assistant", "content": "A1"}, {"role": "system", "content": probe},
                    {"role": "user", "content": "U2"}]
            try:
                text = self._render_as_is(msgs, True, None, None)
                self._midway_system = text.find(probe) > text.find("A1") >= 0
            except ChatTemplateError:
                self._midway_system = False
        return self._midway_system

    def _render(self, msgs: list[dict], add_generation_prompt: bool, tools: list[dict] | None,
                template_kwargs: dict | None = None) -> str:
        """Render, after merging every system message but the first (a second leading one, e.g. the Responses
        API's ``instructions`` then a ``developer`` message, or one that follows the first turn) into the leading
        system message (in order, joined by a blank line) when the template cannot render them where they
        stand (``renders_system_midway``): never dropped, never a template error."""
        first_turn = next((i for i, m in enumerate(msgs) if m.get("role") != "system"), len(msgs))
        if any(m.get("role") == "system" for m in msgs[1:]) and not self.renders_system_midway:
            lead = [m for m in msgs[:first_turn]]
            late = [m for m in msgs[first_turn:] if m.get("role") == "system"]
            texts = [_text_of(m.get("content")) for m in lead + late]
            merged = {"role": "system", "content": "\n\n".join(t for t in texts if t)}
            msgs = [merged] + [m for m in msgs[first_turn:] if m.get("role") != "system"]
        return self._render_as_is(msgs, add_generation_prompt, tools, template_kwargs)

    def _render_as_is(self, msgs: list[dict], add_generation_prompt: bool, tools: list[dict] | None,
                      template_kwargs: dict | None = None) -> str:
        import jinja2

        # the caller's extras first: the fixed variables below are not theirs to override
        kw = {**(template_kwargs or {}), "messages": msgs, "add_generation_prompt": add_generation_prompt,
              "bos_token": self.bos_token, "eos_token": self.eos_token, "tools": tools or None}
        try:
            return self._tpl.render(**kw)
        except (jinja2.TemplateError, ValueError, TypeError) as e:
            raise ChatTemplateError(f"the chat template rejected these messages: {e}",
                                    hint="check the roles and their order (system first, then user/assistant "
                                    "alternating)") from None


def render_chat(template: "ChatTemplate | None", model_path: str, messages: Sequence, *,
                add_generation_prompt: bool = True, tools: list[dict] | None = None,
                template_kwargs: dict | None = None) -> str:
    """Render ``messages`` with a model's template; a model without one (a base model) is refused with
    ChatTemplateError naming --raw and --chat-template, never rendered into garbage. Shared by the backends."""
    import os

    if template is None:
        raise ChatTemplateError(
            f"{os.path.basename(model_path)} has no chat template (it is probably a base model, "
            "not an instruction-tuned one)",
            hint="complete plain text instead (`localrun chat --raw`; on a server /v1/completions, or /api/generate "
                 "with \"raw\": true), or give the model a template (--chat-template chatml|llama3|gemma|FILE)")
    return template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                           template_kwargs=template_kwargs)


def chat_prompt_tokens(template: "ChatTemplate | None", model_path: str, messages: Sequence,
                       tokenize: Callable[..., list[int]], *, add_generation_prompt: bool = True,
                       tools: list[dict] | None = None, parse_special_in_content: bool = False,
                       template_kwargs: dict | None = None) -> tuple[str, list[int]]:
    """Render ``messages`` and tokenise the prompt → (prompt text, token ids). Shared by the backends.

    Only the template's own text is tokenised with special-token parsing (``<|im_start|>`` → its control
    token); every message's text is tokenised as plain text (``parse_special=False``), so a user cannot
    close their turn by typing ``<|im_end|>``. ``tokenize(text, add_special=, parse_special=)`` is the
    engine's; BOS is added (when the model wants it) to the first part only.
    ``parse_special_in_content=True`` restores the unsafe behaviour (one pass with parsing on) for trusted
    clients that send control tokens on purpose (``serve --parse-special-in-content``).
    ``template_kwargs``: extra template variables (``enable_thinking``, ``reasoning_effort``).
    Raises ChatTemplateError (no template; a template that rejects the messages)."""
    if template is None or parse_special_in_content:
        text = render_chat(template, model_path, messages, add_generation_prompt=add_generation_prompt,
                           tools=tools, template_kwargs=template_kwargs)
        return text, tokenize(text, add_special=True, parse_special=True)
    parts = template.render_parts(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                  template_kwargs=template_kwargs)
    text = "".join(t for t, _ in parts)
    ids: list[int] = []
    first, clean = True, True
    for part, is_content in parts:
        if part:
            ids += tokenize(part, add_special=first, parse_special=not is_content)
            first = False
            if is_content and clean:
                clean = tokenize(part, add_special=False, parse_special=True) == \
                    tokenize(part, add_special=False, parse_special=False)
    if first:  # an empty prompt: let the tokenizer add BOS
        return text, tokenize("", add_special=True, parse_special=False)
    if clean:
        # no message holds control-token text: one pass over the whole text gives the tokens the model
        # was trained on (BPE merges across a part's edge, e.g. "\n" + "  x"), once it is checked to have
        # the same control tokens, in the same order, as the split pass (none formed across an edge)
        whole = tokenize(text, add_special=True, parse_special=True)
        ctl = _control_ids(parts, tokenize)
        if [t for t in whole if t in ctl] == [t for t in ids if t in ctl]:
            return text, whole
    return text, ids


def _control_ids(parts: list[tuple[str, bool]], tokenize) -> set[int]:
    """Ids that the template's own text yields only with special-token parsing (its control tokens)."""
    lit = "".join(t for t, is_content in parts if not is_content)
    return set(tokenize(lit, add_special=False, parse_special=True)) - \
        set(tokenize(lit, add_special=False, parse_special=False))


def _text_of(content) -> str:
    """A message's content as text: a string, or OpenAI-style parts (their ``text`` joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "") for p in content)


def _as_dict(m) -> dict:
    return m.to_dict() if hasattr(m, "to_dict") else dict(m)


def _placeholder(nonce: str, i: int) -> str:
    # private-use code points: no template strips, escapes or splits them, and no marker contains them
    return f"\ue000{nonce}:{i}\ue001"


def _mark_message(m: dict, nonce: str, contents: list[str]) -> dict:
    """A copy of message ``m`` whose text fields (content, tool-call arguments) are placeholders; the
    originals are appended to ``contents``. Empty strings stay (templates test them: ``if content``)."""
    def mark(v):
        if isinstance(v, str) and v:
            contents.append(v)
            return _placeholder(nonce, len(contents) - 1)
        return v

    out = dict(m)
    out["content"] = mark(m.get("content"))
    if m.get("tool_calls"):
        calls = []
        for tc in m["tool_calls"]:
            tc = dict(tc) if isinstance(tc, dict) else tc
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                tc["function"] = {**fn, "arguments": mark(fn["arguments"])}
            calls.append(tc)
        out["tool_calls"] = calls
    return out


def _forms(c: str) -> list[str]:
    """How a template may write content ``c``: as is, trimmed (``| trim``, ``.strip()``), JSON-escaped."""
    forms = [c, c.strip(), c.rstrip(), c.lstrip(), json.dumps(c, ensure_ascii=False)[1:-1], json.dumps(c)[1:-1]]
    return list(dict.fromkeys(forms))


def _splice(text: str, skeleton: str, nonce: str, contents: list[str]) -> list[tuple[str, bool]] | None:
    """Match ``text`` (real contents) against ``skeleton`` (placeholders) → parts, or None.

    The skeleton is literal template text between placeholders. Each placeholder must stand for one of
    its content's ``_forms`` followed by the next literal; where a template transforms content otherwise
    (e.g. cuts a ``<think>`` block out of assistant history), the text up to a later occurrence of the
    next literal is taken as content, trying the farthest occurrence first (a marker's text written
    inside a content then stays content), with a bounded search."""
    import re

    pieces = re.split("\ue000" + nonce + r":(\d+)\ue001", skeleton)
    lits, idx = pieces[0::2], [int(i) for i in pieces[1::2]]
    if not text.startswith(lits[0]):
        return None
    budget = [4096]

    def match(k: int, pos: int) -> list[tuple[str, bool]] | None:
        if k == len(idx):
            return [] if pos == len(text) else None
        budget[0] -= 1
        if budget[0] < 0:
            return None
        nxt, last = lits[k + 1], k + 1 == len(idx)
        ends = []
        for f in _forms(contents[idx[k]]):
            e = pos + len(f)
            if text.startswith(f, pos) and text.startswith(nxt, e) and (not last or e + len(nxt) == len(text)):
                ends.append(e)
        # a transformed content: any later occurrence of the next literal, farthest first
        if last:
            ends += [len(text) - len(nxt)] if text.endswith(nxt) and len(text) - len(nxt) >= pos else []
        elif nxt:
            e = text.rfind(nxt, pos)
            while e >= pos:
                ends.append(e)
                e = text.rfind(nxt, pos, e + len(nxt) - 1)
        for e in dict.fromkeys(ends):
            rest = match(k + 1, e + len(nxt))
            if rest is not None:
                return [(text[pos:e], True), (nxt, False)] + rest
        return None

    tail = match(0, len(lits[0]))
    return None if tail is None else [(lits[0], False)] + tail


def _lazy_list(o):
    """json.dumps ``default``: a generator or other iterable (Jinja's ``map``) → list; else TypeError as usual."""
    if hasattr(o, "__iter__"):
        return list(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _raise(message: str):
    raise ValueError(message)
