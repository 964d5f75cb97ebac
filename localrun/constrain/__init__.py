"""Constrained decoding on llguidance: the output matches a JSON schema, a regex or a grammar, token by
token, on both engines.

* ``grammar``: a ``backends.base.Constraint`` → llguidance's grammar text (``compile_grammar``), checked
  up front (``check``): a schema keyword llguidance cannot enforce is a ``ConstraintError`` naming the
  keyword and its JSON Pointer, never dropped.
* ``vocab``: the llguidance tokenizer for an engine's own vocabulary (llama.cpp: the GGUF token pieces;
  MLX: the Hugging Face tokenizer), built once per engine (≈ 0.6 s for a 49k vocabulary).
* ``control``: ``GrammarControl``, the per-generation token control (forced tokens, mask, accept,
  complete) the engines apply; its next mask is computed in a worker thread while the forward pass runs.
* ``tools``: ``tool_call_constraint``: force a parseable tool call in a template family's syntax
  (``tool_choice: required`` / a named function); ``generic_constraint``: the generic format's whole
  answer (a tool call or a plain answer) for a template without tool syntax.
* ``thinking``: ``after_thinking``: a response constraint behind a thinking model's thinking block.

``backends.control.build_control`` compiles a request's constraint with ``control.token_control``
(importing it on the first constrained request); nothing here imports ``backends.control`` back.
llguidance is imported inside the functions that need it (a compiled extension).
"""

from localrun.constrain.control import GrammarControl, token_control
from localrun.constrain.grammar import JSON_OPTIONS, check, compile_grammar, gbnf_to_lark
from localrun.constrain.thinking import after_thinking
from localrun.constrain.tools import generic_constraint, tool_call_constraint
from localrun.constrain.vocab import tokenizer_for

__all__ = ["after_thinking", "GrammarControl", "JSON_OPTIONS", "check", "compile_grammar", "gbnf_to_lark",
           "token_control", "generic_constraint", "tokenizer_for", "tool_call_constraint"]
