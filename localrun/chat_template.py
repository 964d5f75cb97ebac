"""Chat templates: the GGUF's own Jinja template (``tokenizer.chat_template``), or a named/file override.

Rendering follows Hugging Face transformers' ``apply_chat_template`` environment (sandboxed Jinja2,
``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, ``tojson``, ``raise_exception``, ``strftime_now``),
as llama-cpp-python's ``Jinja2ChatFormatter`` and llama.cpp's ``common/chat.cpp`` do.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Sequence

from localrun.errors import ChatTemplateError

# A few well-known templates for GGUFs that lack one (``--chat-template NAME``).
BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "gemma": (
        "{{ bos_token }}{% set sys = '' %}{% for m in messages %}{% if m['role'] == 'system' %}"
        "{% set sys = m['content'] + '\n\n' %}{% else %}<start_of_turn>"
        "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{% if loop.index0 == 1 %}{{ sys }}{% endif %}"
        "{{ m['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "mistral": (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
        "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    ),
    "phi3": (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
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
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
            json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
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

    def render(self, messages: Sequence, *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> str:
        """Messages (``Message`` or dicts with role/content) → prompt text."""
        import jinja2

        msgs = [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in messages]
        try:
            return self._tpl.render(messages=msgs, add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token, eos_token=self.eos_token, tools=tools or None)
        except (jinja2.TemplateError, ValueError, TypeError) as e:
            raise ChatTemplateError(f"the chat template rejected these messages: {e}",
                                    hint="check the roles and their order (system first, then user/assistant "
                                    "alternating)") from None


def render_chat(template: "ChatTemplate | None", model_path: str, messages: Sequence, *,
                add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
    """Render ``messages`` with a model's template; a model without one (a base model) is refused with
    ChatTemplateError naming --raw and --chat-template, never rendered into garbage. Shared by the backends."""
    import os

    if template is None:
        raise ChatTemplateError(
            f"{os.path.basename(model_path)} has no chat template (it is probably a base model, "
            "not an instruction-tuned one)",
            hint="use --raw for plain text completion, or --chat-template chatml|llama3|gemma|FILE")
    return template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)


def _raise(message: str):
    raise ValueError(message)
