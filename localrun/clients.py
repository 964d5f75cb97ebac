"""The agents and apps people point at a local runner, and what each needs from it.

One table for ``localrun launch`` (which starts a server for the client) and ``localrun fit --for``
(which plans a model for it). ``n_ctx`` is the context a session needs, tokens: the client's first prompt
plus room for the turns of a session, rounded up to a power of two. ``first_prompt`` is the size of that
first prompt, tokens: Claude Code 2.1 sends 24 tools and a 15–20k-token prompt (seen through the proxy of
``tests/clients/test_claude_code.py``), Codex ≈ 9k (``tests/clients/test_codex.py``), and an
OpenAI-compatible coding CLI's first prompt was reported at 15,874 tokens (opencode's figure is that report,
not measured here; Qwen Code 0.24.4's first request, ``tests/data/clients/``, is about 15k). Both depend on
the tokenizer; these are the sizes with the Gemma-3 and SmolLM2
tokenizers (docs/serve.md "Use it with…").
"""

from __future__ import annotations

from dataclasses import dataclass

from localrun.errors import ConfigError


@dataclass(frozen=True)
class Client:
    name: str
    binary: str
    install: str
    n_ctx: int  # tokens: the context a session needs (first prompt + the turns that follow)
    api: str  # the wire format it speaks
    first_prompt: int  # tokens: its first request's prompt (system prompt + tool schemas)


CLIENTS = {
    "claude": Client("Claude Code", "claude", "npm install -g @anthropic-ai/claude-code", 32768,
                     "Anthropic Messages", 18000),
    "codex": Client("Codex CLI", "codex", "npm install -g @openai/codex", 32768, "OpenAI Responses", 9000),
    "opencode": Client("opencode", "opencode", "npm install -g opencode-ai", 32768, "OpenAI chat completions",
                       16000),
    "qwen": Client("Qwen Code", "qwen", "npm install -g @qwen-code/qwen-code", 32768, "OpenAI chat completions",
                   15000),
}
ALIASES = {"claude-code": "claude", "claude_code": "claude", "codex-cli": "codex", "open-code": "opencode",
           "qwen-code": "qwen", "qwen_code": "qwen"}


def get_client(name: str) -> tuple[str, Client]:
    """(key, Client) for ``name`` (a key of ``CLIENTS`` or an alias such as ``claude-code``, any case).
    Raises ConfigError naming the known clients."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in CLIENTS:
        raise ConfigError(f"unknown client {name!r}", hint=f"use one of: {', '.join(CLIENTS)} (or claude-code)")
    return key, CLIENTS[key]
