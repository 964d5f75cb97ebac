"""Template families: how a model thinks and calls tools, read from its chat template's text.

The family decides how a reply is split (``reply.ReplyParser``), what the engine forces when a thinking
budget runs out (``Thinking.budget_close``) and which template kwargs turn thinking on/off or set its level.
Detection reads the Jinja source only (never the model's name), the way llama.cpp's ``common/chat.cpp``
(``common_chat_templates_apply``) picks a format from marker strings in the template:

- thinking: ``<|channel|>analysis`` (gpt-oss "harmony"), ``[THINK]…[/THINK]`` (Magistral / Ministral
  reasoning), ``<|channel>thought…<channel|>`` (Gemma 4), ``</think>`` (DeepSeek-R1 and its distills, QwQ,
  Qwen3, Qwen3.5/3.6, DeepSeek-V3.1);
- tools: ``to=functions.`` (harmony), ``tool▁calls▁begin`` (DeepSeek), ``[TOOL_CALLS]`` (Mistral),
  ``<|tool_call>call:`` (Gemma 4), ``<tool_call>`` with ``<function=`` (Qwen3.5/3.6's XML calls, llama.cpp's
  "Qwen3-Coder" format), ``<tool_call>`` (Hermes / Qwen), ``<|python_tag|>`` or ``"parameters"`` in a Llama-3
  header template (Llama 3.x).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Thinking:
    """How a family's replies think.

    ``open``/``close``: the block's markers (``"<think>"``/``"</think>"``, ``"[THINK]"``/``"[/THINK]"``,
    harmony ``"<|channel|>analysis<|message|>"``/``"<|end|>"``). ``opened_by_template``: with thinking on,
    the generation prompt already ends inside the block (DeepSeek-R1-Distill-Qwen-32B, QwQ, DeepSeek-V3.1).
    ``toggle_kwarg``: the template kwarg that turns thinking off/on (``"enable_thinking"``), None if none.
    ``levels``/``level_kwarg``: effort levels the template takes (gpt-oss ``("low", "medium", "high")`` via
    ``"reasoning_effort"``). ``budget_close``: the text the engine forces when a budget runs out — the close
    marker plus the transition the template writes after a past turn's thinking (Qwen3 ``"\\n</think>\\n\\n"``;
    harmony ``"<|end|><|start|>assistant<|channel|>final<|message|>"``). ``drops_history``: the template
    drops earlier turns' thinking from the prompt (DeepSeek-R1, Qwen3, Qwen3.5, Gemma 4, gpt-oss), even with
    ``keep_kwarg`` passed. ``keep_kwarg``: the template kwarg that keeps every earlier turn's thinking in the
    prompt (Qwen3.6 ``"preserve_thinking"``); ``template_kwargs`` always passes it as true, so the prompt of
    one turn stays a prefix of the next.
    """

    open: str
    close: str
    opened_by_template: bool
    toggle_kwarg: str | None
    levels: tuple[str, ...]
    level_kwarg: str | None
    budget_close: str
    drops_history: bool
    keep_kwarg: str | None = None


@dataclass(frozen=True)
class Family:
    """A template family: ``name`` ("deepseek-r1", "deepseek-v3", "qwen3", "qwen3.5", "qwq", "gpt-oss",
    "magistral", "gemma4", "hermes", "llama3", "mistral", "plain"), its ``thinking`` (None: the model does not
    think), its tool-call syntax ``tools``: "hermes" | "qwen-xml" | "gemma4" | "llama3" | "mistral" |
    "deepseek" | "harmony" | None, and how
    its template wants past tool calls (``history_args``, ``null_content``). Detection never says
    "generic": the server gives that syntax to a template without one (``dialects.generic``)."""

    name: str
    thinking: Thinking | None
    tools: str | None
    # how the template reads a past assistant turn's tool calls (history.messages_for_template):
    history_args: str = "object"  # "object": it writes arguments | tojson; "string": it concatenates them
    null_content: bool = False  # it tests `content is none` to render a tool-call turn (keep None, not "")


PLAIN = Family("plain", None, None)

HARMONY_ANALYSIS = "<|channel|>analysis<|message|>"
HARMONY_FINAL = "<|start|>assistant<|channel|>final<|message|>"


def detect_family(template_source: str | None) -> Family:
    """The family of a chat template, from its Jinja text (None or "" → ``PLAIN``). Never raises."""
    src = template_source or ""
    if not src:
        return PLAIN
    fam = _detect(src)
    return replace(fam, history_args=_history_args(src),
                   null_content=_null_content(src))


def _detect(src: str) -> Family:
    tools = _tool_syntax(src)
    if "<|channel|>" in src and "analysis" in src:
        return Family("gpt-oss", _harmony_thinking(src), tools)
    if "<|channel>" in src and "<channel|>" in src:
        return Family("gemma4", _gemma4_thinking(src), tools)
    if "[THINK]" in src and "[/THINK]" in src:
        return Family("magistral", Thinking("[THINK]", "[/THINK]", False, None, (), None, "[/THINK]", False),
                      tools)
    if "</think>" in src:
        return Family(_think_family_name(src, tools), _think_thinking(src), tools)
    names = {"hermes": "hermes", "llama3": "llama3", "mistral": "mistral", "deepseek": "deepseek-v3",
             "harmony": "gpt-oss"}
    return Family(names.get(tools or "", "plain"), None, tools)


def template_kwargs(family: Family, *, think: bool | None, level: str | None) -> dict:
    """Kwargs for the chat template: ``{"enable_thinking": bool}`` where the template has a toggle,
    ``{"reasoning_effort": level}`` where it takes levels, ``{"preserve_thinking": True}`` where the template
    can keep earlier turns' thinking (Qwen3.6: the prompt then stays a prefix turn after turn).
    ``think=None`` means the model's default, which is thinking on (as llama-server passes
    ``enable_thinking: true`` by default: templates such as DeepSeek-V3.1's default to off). A level the
    template does not take is ignored (the caller maps it onto a budget); ``think=False`` with levels but no
    toggle picks the lowest level. Never raises."""
    t = family.thinking
    out: dict = {}
    if t is None:
        return out
    if t.toggle_kwarg:
        out[t.toggle_kwarg] = think is not False
    if t.keep_kwarg:
        out[t.keep_kwarg] = True
    if t.level_kwarg and t.levels:
        if think is False and not t.toggle_kwarg:
            out[t.level_kwarg] = t.levels[0]
        elif level in t.levels:
            out[t.level_kwarg] = level
    return out


# --- detection helpers ---------------------------------------------------------------------------------

def _tool_syntax(src: str) -> str | None:
    if "to=functions." in src or ("<|call|>" in src and "<|channel|>" in src):
        return "harmony"
    if "tool▁calls▁begin" in src or "tool_calls_begin" in src:
        return "deepseek"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|tool_call>call:" in src:
        return "gemma4"
    if "<tool_call>" in src and "<function=" in src:
        return "qwen-xml"
    if "<tool_call>" in src:
        return "hermes"
    if "<|python_tag|>" in src or ("<|start_header_id|>" in src and '"parameters"' in src):
        return "llama3"
    return None


def _history_args(src: str) -> str:
    """"string" when the template concatenates tool-call arguments as text (DeepSeek-R1's original
    template: ``+ tool['function']['arguments'] +``), else "object" (``arguments | tojson``, or both)."""
    if re.search(r"arguments'?\]?\s*\|\s*tojson|arguments\s+is\s+(not\s+)?string", src):
        return "object"
    return "string" if re.search(r"arguments'?\]?\s*\+", src) else "object"


def _null_content(src: str) -> bool:
    """The template branches on ``role == 'assistant' and content is [not] none`` (DeepSeek-R1's) to write
    a tool-call turn: a null content must stay None there (elsewhere "" is what templates can read)."""
    return re.search(r"'assistant'\s+and\s+message\['content'\]\s+is\s+(?:not\s+)?none", src) is not None


def _generation_prompt_tail(src: str) -> str:
    """The template text after its last ``add_generation_prompt`` test (what the prompt ends with)."""
    i = src.rfind("add_generation_prompt")
    return src[i:] if i >= 0 else ""


def _unescape(lit: str) -> str:
    return lit.replace("\\n", "\n").replace("\\t", "\t")


def _think_thinking(src: str) -> Thinking:
    tail = _generation_prompt_tail(src)
    # a generation prompt that writes an empty block (thinking switched off) does not open one
    opened = "<think>" in re.sub(r"<think>(?:\\n|\s)*</think>", "", tail)
    toggle = "enable_thinking" if "enable_thinking" in src else ("thinking" if re.search(
        r"\bthinking\s+is\s+defined", src) else None)
    keep = "preserve_thinking" if re.search(r"preserve_thinking\s+is\s+defined", src) else None
    return Thinking("<think>", "</think>", opened, toggle, (), None, _think_budget_close(src),
                    _drops_history(src) and keep is None, keep)


def _think_budget_close(src: str) -> str:
    """The close marker with the transition the template writes after a past turn's thinking, e.g. Qwen3's
    ``'\\n</think>\\n\\n'``; templates that never render past thinking get what the DeepSeek-R1 models emit
    (``"\\n</think>\\n\\n"``, model card's "<think>\\n" … "\\n</think>\\n\\n")."""
    for m in re.finditer(r"(['\"])((?:(?!\1).)*</think>(?:(?!\1).)*)\1", src):
        lit = m.group(2)
        if "<think>" in lit or lit == "</think>":
            continue  # an empty block or a bare close (thinking off), a test or split on the close tag
        if re.fullmatch(r"(?:\\n|\s)*</think>(?:\\n|\s)*", lit):
            return _unescape(lit)
    return "\n</think>\n\n"


def _drops_history(src: str) -> bool:
    """The template cuts past assistant content at ``</think>`` (DeepSeek-R1, QwQ, Qwen3, DeepSeek-V3.1)."""
    return re.search(r"split\(\s*['\"]</think>['\"]", src) is not None


def _think_family_name(src: str, tools: str | None) -> str:
    if tools == "deepseek":
        # V3.1 writes NAME<｜tool▁sep｜>ARGS; R1 writes TYPE<｜tool▁sep｜>NAME and a fenced JSON block
        return "deepseek-v3" if re.search(r"\['name'\]\s*\+\s*'<｜tool▁sep｜>'", src) else "deepseek-r1"
    if "<|im_start|>" in src and tools == "qwen-xml":
        return "qwen3.5"
    if "<|im_start|>" in src:
        return "qwen3" if "enable_thinking is defined" in src else "qwq"
    if "<｜Assistant｜>" in src:
        return "deepseek-r1"
    return "think"


def _harmony_thinking(src: str) -> Thinking:
    levels: tuple[str, ...] = ()
    level_kwarg = None
    if "reasoning_effort" in src:
        # the harmony format's three levels (openai/harmony: ReasoningEffort); the template names only its default
        level_kwarg, levels = "reasoning_effort", ("low", "medium", "high")
    # gpt-oss renders a past turn's analysis only while a tool-call chain is open (no final message yet)
    return Thinking(HARMONY_ANALYSIS, "<|end|>", False, None, levels, level_kwarg,
                    "<|end|>" + HARMONY_FINAL, True)


def _gemma4_thinking(src: str) -> Thinking:
    """Gemma 4: ``enable_thinking`` writes ``<|think|>`` into the system turn and the model opens
    ``<|channel>thought\\n…<channel|>`` itself (with thinking off the generation prompt writes the empty channel).
    The template renders a past turn's thinking only on tool-call turns after the last user message
    (``'<|channel>thought\\n' + thinking + '\\n<channel|>'``) and strips channels from past content."""
    toggle = "enable_thinking" if "enable_thinking" in src else None
    close = "\n<channel|>" if "\\n<channel|>" in src else "<channel|>"
    return Thinking("<|channel>thought", "<channel|>", False, toggle, (), None, close, True)
