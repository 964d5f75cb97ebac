"""``after_thinking``: a response constraint (JSON schema, JSON object, regex, Lark or GBNF grammar) that
lets a thinking model write its thinking block first.

A constraint applies from the first generated token. On a template that opens the thinking block in the
prompt (QwQ, DeepSeek-R1, Qwen3 with thinking on) the model is inside the block then: an unwrapped schema
would make it write the answer as its thinking (the reply parser then finds no content), and a thinking
budget's forced close (``budget_close``, e.g. ``"\\n</think>\\n\\n"``) would break the constraint. llama.cpp
builds such grammars the same way (common/chat.cpp: the reasoning block as an optional or, when the
template opened it, required prefix of the response grammar).

The wrapped grammar: the thinking text up to and with the first close marker, blank space, then the
response's own grammar; the block is required when the template opened it, optional (with its open
marker) otherwise.
"""

from __future__ import annotations

import json
import re

from localrun.backends.base import Constraint
from localrun.constrain.grammar import gbnf_to_lark, json_options


def _lark_regex(rx: str) -> str:
    """``rx`` (Rust regex syntax) as a Lark regex literal ``/.../`` (an unescaped ``/`` escaped)."""
    return "/" + re.sub(r"(?<!\\)/", r"\\/", rx) + "/"


def _answer_rule(c: Constraint) -> tuple[str, str]:
    """(the answer's expression in the wrapper's ``start`` rule, extra Lark rules it needs)."""
    if c.kind in ("json_object", "json_schema"):
        schema = {"type": "object"} if c.kind == "json_object" else c.source
        return "%json " + json.dumps(dict(schema, **{"x-guidance": json_options(c.strict)})), ""
    if c.kind == "regex":
        return "LR_ANSWER", f"LR_ANSWER: {_lark_regex(c.source)}\n"
    src = gbnf_to_lark(c.source, param=c.param) if c.kind == "gbnf" else c.source
    return "lr_answer", re.sub(r"^(\s*)start(\s*):", r"\1lr_answer\2:", src, count=1, flags=re.M) + "\n"


def after_thinking(c: Constraint, thinking) -> Constraint:
    """``c`` (a response's constraint) behind the thinking block of ``thinking`` (a ``dialects.Thinking``:
    ``open``, ``close``, ``opened_by_template``) → a ``lark`` Constraint with ``c``'s ``param`` and
    ``strict``. ``c`` is returned unchanged when its source is not of the expected type (the compiler's
    own check then names the problem) or the family has no markers. Raises ConstraintError when a GBNF
    grammar cannot be converted."""
    if not (thinking and thinking.open and thinking.close):
        return c
    if (c.kind == "json_schema" and not isinstance(c.source, dict)) or (
            c.kind in ("regex", "lark", "gbnf") and not (isinstance(c.source, str) and c.source)):
        return c
    if c.kind not in ("json_object", "json_schema", "regex", "lark", "gbnf"):
        return c
    answer, rules = _answer_rule(c)
    head, think = thinking_prefix(thinking)
    return Constraint("lark", f"start: {head} {answer}\n{rules}{think}", param=c.param, strict=c.strict)


def thinking_prefix(thinking) -> tuple[str, str]:
    """(the Lark expression for the thinking block and the blank space after it, the terminals it uses):
    the text up to and with the first close marker (a lexeme that ends at it), then blank space; required
    when the template opened the block (the model is inside it), optional with its open marker otherwise."""
    close = re.escape(thinking.close).replace("/", "\\/")
    rules = f'LR_THINK: /(?s:.*){close}/ & ~/(?s:.*{close}.+)/\nLR_GAP: /[ \\t\\n]*/\n'
    head = "LR_THINK LR_GAP" if thinking.opened_by_template else \
        f"({json.dumps(thinking.open, ensure_ascii=False)} LR_THINK LR_GAP)?"
    return head, rules
