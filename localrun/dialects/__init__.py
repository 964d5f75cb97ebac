"""What a model's chat template says about its output (layer 1: pure, stdlib only).

- ``families``: detect the template family from the template text — how it thinks (``<think>``, ``[THINK]``,
  gpt-oss channels), how it calls tools (Hermes, Llama 3, Mistral, DeepSeek, harmony) — and the template
  kwargs that switch thinking on/off or set its level;
- ``reply``: the streaming reply parser that splits generated text into thinking, content and tool calls;
- ``history``: chat history (tool calls, tool results, earlier thinking) normalised for a family's template.
"""

from localrun.dialects.families import Family, Thinking, detect_family, template_kwargs
from localrun.dialects.reply import Delta, ReplyEvent, ReplyParser, ToolCallArgs, ToolCallEnd, ToolCallStart

__all__ = ["Delta", "Family", "ReplyEvent", "ReplyParser", "Thinking", "ToolCallArgs", "ToolCallEnd",
           "ToolCallStart", "detect_family", "template_kwargs"]
