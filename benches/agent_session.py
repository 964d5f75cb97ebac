"""An agent session as Claude Code or Codex sends it, through `localrun serve` and llama.cpp's llama-server.

Six turns on one conversation: an agent-sized system prompt (instructions, project conventions and eight tool
definitions: ≈ 3,000 tokens) and a first user task; each later turn appends the
assistant's answer as the server returned it (its text, its tool call, or when the model made none a tool
call of the script's, as an agent's next step), the tool's result (a file, a test log, a diff: hundreds of
tokens) and a new user message, and sends the whole conversation again (stateless APIs: OpenAI chat
completions or Anthropic messages, streamed). Per turn: prompt tokens, cached tokens (the prompt tokens the
server did not prefill: ``usage.prompt_tokens_details.cached_tokens`` / ``cache_read_input_tokens``), reuse
= cached / prompt and its ceiling (the previous request's prompt / this one: the new turn's own tokens cannot
be cached), TTFT as the server measures it (localrun: its /metrics TTFT sum, arrival → first token;
llama-server: ``timings.prompt_ms``) and as the client sees it (the first streamed delta: text, tool call or
thinking; a tool call's first delta comes only once its name is parsed).

``--tools system`` (default) puts the tool definitions in the system prompt as text, so both servers get the
same prompt: llama-server drops a request's ``tools`` when the chat template has no tool syntax (SmolLM2's),
while localrun renders them in its generic format. ``--tools request`` sends them as the request's tools.

In the same run, llama.cpp's own llama-server (``--llama-server PATH``, env ``LLAMA_SERVER``; built from the
same vendored llama.cpp by ``benches/build_peers.sh``; skipped with a printed reason when absent) gets its own
session of the same turns: its defaults (``cache_prompt`` on, its RAM prompt cache, its flash-attention
choice), one slot, the same threads and context (``--no-repack`` where the CPU advertises AMX, the fix
localrun applies). Both servers run at once and get each turn in turn (idle while the other works), so load
drifts hit both. Printed: each turn's TTFT ratio localrun / llama-server. The goal: reuse ≥ 0.9 on turns 2–6.

    python benches/agent_session.py [--model PATH] [--api openai|anthropic] [--tools system|request]
                                    [--flash-attn default|on|off] [--threads N] [--ctx 8192]
                                    [--max-tokens 48] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

from kv_tiers_peer import Server, find_llama_server  # noqa: E402

TURNS = 6

# ------------------------------------------------------------------------------------------ the session

SYSTEM_SECTIONS = {
    "Tone and style": [
        "You are an interactive command line agent that helps users with software engineering tasks.",
        "Be concise, direct and to the point. When you run a non-trivial command, explain what it does and why.",
        "Your output is displayed in a terminal; use GitHub-flavoured markdown for formatting.",
        "Only use emojis if the user explicitly asks for it. Avoid filler, preamble and postamble.",
        "Answer the user's question directly, without elaboration, unless the user asks for detail.",
    ],
    "Proactiveness": [
        "Do what has been asked; nothing more, nothing less. Never create files unless they are necessary.",
        "When the user asks how to approach something, answer the question first before taking actions.",
        "Do not add code explanation summaries unless requested by the user.",
    ],
    "Following conventions": [
        "When making changes to files, first understand the file's code conventions: mimic the code style,",
        "use existing libraries and utilities, and follow existing patterns. Never assume that a given library",
        "is available, even if it is well known: check that the codebase already uses it (package.json,",
        "pyproject.toml, Cargo.toml, go.mod). When you create a new component, look at the existing ones first.",
        "Always follow security best practices. Never introduce code that exposes or logs secrets and keys.",
    ],
    "Doing tasks": [
        "Use the TodoWrite tool to plan the task if required. Use the search tools extensively, both in",
        "parallel and sequentially, to understand the codebase and the user's query. Implement the solution",
        "using all tools available to you. Verify the solution if possible with the project's tests; never",
        "assume a specific test framework or test script: check the README or search the codebase.",
        "When you have completed a task, run the lint and typecheck commands (npm run lint, ruff, mypy) if",
        "they were provided to you to ensure your code is correct. NEVER commit changes unless the user asks.",
    ],
    "Tool usage policy": [
        "When doing file search, prefer the Task tool to reduce context usage. When several independent",
        "pieces of information are requested, batch your tool calls together for optimal performance.",
        "When making multiple bash tool calls, send a single message with multiple tool calls to run them",
        "in parallel. Prefer the dedicated tools (Read, Edit, Grep, Glob) over shell commands that do the",
        "same (cat, sed, grep, find): they are faster, their output is smaller and the user can review them.",
    ],
    "Code references": [
        "When referencing specific functions or pieces of code include the pattern file_path:line_number to",
        "allow the user to easily navigate to the source code location.",
    ],
    "Git": [
        "Only create commits when requested by the user. When the user asks, run git status, git diff and",
        "git log in parallel, draft a concise commit message that focuses on the why rather than the what,",
        "and never update the git config, never force push, never skip hooks, never amend a pushed commit.",
        "If the commit fails due to pre-commit hook changes, retry the commit once to include them.",
    ],
}

PROJECT_MEMORY = [  # what CLAUDE.md / AGENTS.md add: the project's own conventions
    ("Build", "make build compiles the gateway; make dev runs it with auto-reload on port 8080."),
    ("Tests", "pytest -q runs the unit tests; tests/integration needs docker compose up -d first."),
    ("Lint", "ruff check . and mypy gateway must be clean before a change is proposed."),
    ("Layout", "gateway/ holds the service: routes.py (HTTP), ratelimit.py (token buckets), auth.py (API keys),"
               " upstream.py (the proxied backends), config.py (settings read from GATEWAY_* variables)."),
    ("Style", "Type hints everywhere; dataclasses over dicts for records; no global state outside config.py;"
              " functions under 40 lines; docstrings say what and why, not how."),
    ("Errors", "Raise GatewayError subclasses with an HTTP status; never return None for a failure; log once,"
               " at the boundary, with the request id."),
    ("Concurrency", "The gateway runs under uvicorn with several worker threads: shared state needs a lock,"
                    " and a lock is never held across an await or an upstream call."),
    ("Commits", "One logical change per commit; the subject in the imperative, at most 72 characters; the"
                " body says why. Never commit generated files, .env files or credentials."),
    ("Reviews", "A change that touches ratelimit.py or auth.py needs a test that fails without it."),
    ("Dependencies", "Add none without asking; the lock file is uv.lock, updated with uv lock, never by hand."),
]

ENVIRONMENT = ("<env>\nWorking directory: /home/user/project\nIs directory a git repo: Yes\nPlatform: linux\n"
               "OS Version: Linux 6.8.0\nToday's date: 2026-12-02\n</env>")


def system_prompt() -> str:
    parts = ["You are a coding agent running in the user's terminal. Use the instructions below and the tools "
             "available to you to assist the user."]
    for title, lines in SYSTEM_SECTIONS.items():
        parts.append(f"\n# {title}\n" + "\n".join(f"- {x}" for x in lines))
    parts.append("\n# Project instructions (CLAUDE.md)\n" + "\n".join(f"- {k}: {v}" for k, v in PROJECT_MEMORY))
    parts.append("\n" + ENVIRONMENT)
    return "\n".join(parts)


def _tool(name: str, desc: str, props: dict, required: list[str]) -> dict:
    return {"name": name, "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required,
                           "additionalProperties": False}}


def _s(desc: str, **kw) -> dict:
    return dict({"type": "string", "description": desc}, **kw)


TOOLS = [
    _tool("Bash", "Executes a bash command in a persistent shell session with an optional timeout, ensuring "
          "proper handling and security measures. Before executing the command: if it creates new directories "
          "or files, first use LS to verify the parent directory exists. Always quote file paths that contain "
          "spaces with double quotes. The command argument is required. You can specify an optional timeout in "
          "milliseconds (up to 600000ms / 10 minutes); if not specified, commands time out after 120000ms. If "
          "the output exceeds 30000 characters, output is truncated before being returned to you. Avoid search "
          "commands like find and grep (use Grep, Glob or Task instead) and read tools like cat, head, tail and "
          "ls (use Read and LS). When issuing multiple commands, use ';' or '&&' to separate them, not newlines. "
          "Try to maintain your current working directory throughout the session by using absolute paths and "
          "avoiding cd.",
          {"command": _s("The command to execute"),
           "timeout": {"type": "number", "description": "Optional timeout in milliseconds (max 600000)"},
           "description": _s("Clear, concise description of what this command does in 5-10 words.")},
          ["command"]),
    _tool("Read", "Reads a file from the local filesystem. You can access any file directly by using this tool. "
          "The file_path parameter must be an absolute path, not a relative path. By default, it reads up to "
          "2000 lines starting from the beginning of the file. You can optionally specify a line offset and "
          "limit (especially handy for long files), but it's recommended to read the whole file by not "
          "providing these parameters. Any lines longer than 2000 characters will be truncated. Results are "
          "returned using cat -n format, with line numbers starting at 1. This tool can read images (PNG, JPG), "
          "PDF files and Jupyter notebooks. It is always better to speculatively read multiple files as a batch.",
          {"file_path": _s("The absolute path to the file to read"),
           "offset": {"type": "number", "description": "The line number to start reading from"},
           "limit": {"type": "number", "description": "The number of lines to read"}},
          ["file_path"]),
    _tool("Edit", "Performs exact string replacements in files. You must use your Read tool at least once in the "
          "conversation before editing. When editing text from Read tool output, ensure you preserve the exact "
          "indentation (tabs/spaces) as it appears AFTER the line number prefix. ALWAYS prefer editing existing "
          "files in the codebase. NEVER write new files unless explicitly required. The edit will FAIL if "
          "old_string is not unique in the file: either provide a larger string with more surrounding context "
          "to make it unique or use replace_all to change every instance of old_string.",
          {"file_path": _s("The absolute path to the file to modify"),
           "old_string": _s("The text to replace"),
           "new_string": _s("The text to replace it with (must be different from old_string)"),
           "replace_all": {"type": "boolean", "description": "Replace all occurrences of old_string"}},
          ["file_path", "old_string", "new_string"]),
    _tool("Write", "Writes a file to the local filesystem. This tool will overwrite the existing file if there is "
          "one at the provided path. If this is an existing file, you MUST use the Read tool first to read the "
          "file's contents. NEVER proactively create documentation files (*.md) or README files.",
          {"file_path": _s("The absolute path to the file to write (must be absolute, not relative)"),
           "content": _s("The content to write to the file")},
          ["file_path", "content"]),
    _tool("Grep", "A powerful search tool built on ripgrep. Supports full regex syntax (e.g. \"log.*Error\", "
          "\"function\\s+\\w+\"). Filter files with the glob parameter (e.g. \"*.js\", \"**/*.tsx\") or the type "
          "parameter (e.g. \"js\", \"py\", \"rust\"). Output modes: \"content\" shows matching lines, "
          "\"files_with_matches\" shows only file paths (default), \"count\" shows match counts. Use the Task "
          "tool for open-ended searches requiring multiple rounds.",
          {"pattern": _s("The regular expression pattern to search for in file contents"),
           "path": _s("File or directory to search in. Defaults to the current working directory."),
           "glob": _s("Glob pattern to filter files (e.g. \"*.js\", \"*.{ts,tsx}\")"),
           "output_mode": _s("Output mode", enum=["content", "files_with_matches", "count"]),
           "-n": {"type": "boolean", "description": "Show line numbers in output"},
           "-i": {"type": "boolean", "description": "Case insensitive search"}},
          ["pattern"]),
    _tool("Glob", "Fast file pattern matching tool that works with any codebase size. Supports glob patterns like "
          "\"**/*.js\" or \"src/**/*.ts\". Returns matching file paths sorted by modification time.",
          {"pattern": _s("The glob pattern to match files against"),
           "path": _s("The directory to search in. Defaults to the current working directory.")},
          ["pattern"]),
    _tool("TodoWrite", "Use this tool to create and manage a structured task list for your current coding session. "
          "This helps you track progress, organize complex tasks, and demonstrate thoroughness to the user. Use "
          "it for complex multi-step tasks (3 or more distinct steps), when the user provides multiple tasks, "
          "and after receiving new instructions. Mark tasks in_progress before beginning work and completed "
          "immediately after finishing; only one task should be in_progress at any time.",
          {"todos": {"type": "array", "description": "The updated todo list", "items": {
              "type": "object", "required": ["content", "status", "id"], "properties": {
                  "content": {"type": "string", "minLength": 1},
                  "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                  "id": {"type": "string"}}}}},
          ["todos"]),
    _tool("WebFetch", "Fetches content from a specified URL and processes it using an AI model. Takes a URL and a "
          "prompt as input, fetches the URL content, converts HTML to markdown, and processes the content with "
          "the prompt. The URL must be a fully-formed valid URL; HTTP URLs will be automatically upgraded to "
          "HTTPS. This tool is read-only and does not modify any files. Results may be summarized if the "
          "content is very large.",
          {"url": _s("The URL to fetch content from", format="uri"),
           "prompt": _s("The prompt to run on the fetched content")},
          ["url", "prompt"]),
]


def _source_file() -> str:
    lines = ['"""Rate limiting for the API gateway: a token bucket per client."""', "", "import time",
             "from dataclasses import dataclass, field", "", "", "@dataclass", "class Bucket:",
             "    capacity: int", "    refill_per_s: float", "    tokens: float = 0.0",
             "    stamp: float = field(default_factory=time.monotonic)", ""]
    for i, name in enumerate(["take", "peek", "refill", "reset", "drain", "resize"]):
        lines += [f"    def {name}(self, n: int = 1) -> bool:",
                  f'        """{name.capitalize()} n tokens; step {i} of the bucket protocol."""',
                  "        now = time.monotonic()",
                  "        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.refill_per_s)",
                  "        self.stamp = now",
                  f"        if self.tokens >= n * {i + 1}:",
                  f"            self.tokens -= n * {i + 1}",
                  "            return True",
                  "        return False", ""]
    return "\n".join(f"{n:6d}\t{x}" for n, x in enumerate(lines, 1))


def _test_log() -> str:
    rows = [f"tests/test_ratelimit.py::test_bucket_{k} PASSED" for k in
            ("take", "peek", "refill", "reset", "drain", "resize", "capacity", "burst")]
    rows += ["tests/test_ratelimit.py::test_bucket_concurrent FAILED", "",
             "=================================== FAILURES ===================================",
             "___________________________ test_bucket_concurrent ____________________________",
             "    def test_bucket_concurrent():", "        b = Bucket(capacity=10, refill_per_s=0.0, tokens=10)",
             "        with ThreadPoolExecutor(8) as ex:",
             "            got = list(ex.map(lambda _: b.take(), range(20)))",
             ">       assert sum(got) == 10", "E       assert 12 == 10",
             "E        +  where 12 = sum([True, True, ...])",
             "", "tests/test_ratelimit.py:88: AssertionError",
             "=========================== short test summary info ============================",
             "FAILED tests/test_ratelimit.py::test_bucket_concurrent - assert 12 == 10",
             "========================= 1 failed, 8 passed in 0.41s =========================="]
    return "\n".join(rows)


# (the script's tool call when the model made none, that tool's result, the next user message)
STEPS = [
    (("Grep", {"pattern": "class Bucket", "output_mode": "files_with_matches"}),
     "gateway/ratelimit.py\ntests/test_ratelimit.py",
     "Open the implementation."),
    (("Read", {"file_path": "/home/user/project/gateway/ratelimit.py"}), _source_file(),
     "Looks right. Now run the tests for it."),
    (("Bash", {"command": "python -m pytest tests/test_ratelimit.py -q", "description": "Run the tests"}),
     _test_log(), "One fails. Why does the concurrent test fail?"),
    (("Edit", {"file_path": "/home/user/project/gateway/ratelimit.py", "old_string": "    def take(",
               "new_string": "    _lock: threading.Lock = field(default_factory=threading.Lock)\n\n    def take("}),
     "The file /home/user/project/gateway/ratelimit.py has been updated. Here's the result of running `cat -n` "
     "on a snippet of the edited file:\n    13\t    _lock: threading.Lock = field(default_factory=threading.Lock)"
     "\n    14\t\n    15\t    def take(self, n: int = 1) -> bool:", "Also take the lock inside take()."),
    (("Bash", {"command": "python -m pytest tests/test_ratelimit.py -q", "description": "Rerun the tests"}),
     _test_log().replace("FAILED", "PASSED").replace("1 failed, 8 passed", "9 passed"),
     "Good. Summarize the change in two sentences."),
]
FIRST_USER = "The gateway lets more requests through than the rate limit allows under load. Find the rate limiter."


# ------------------------------------------------------------------------------------------ the wire


class Session:
    """One conversation on one server, in the OpenAI or Anthropic wire format."""

    def __init__(self, url: str, api: str, max_tokens: int, tools_in: str = "system", metrics: bool = False) -> None:
        self.url, self.api, self.max_tokens, self.tools_in, self.metrics = url, api, max_tokens, tools_in, metrics
        self.system = system_prompt()
        if tools_in == "system":  # what a model without tool syntax is given: the definitions as text
            self.system += "\n\n# Tools\nYou can call these tools:\n" + "\n".join(json.dumps(t) for t in TOOLS)
        self.messages: list[dict] = [{"role": "user", "content": FIRST_USER}]
        self.n_calls = 0

    # ---- requests
    def body(self) -> dict:
        if self.api == "openai":
            body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
                    "max_tokens": self.max_tokens,
                    "messages": [{"role": "system", "content": self.system}] + self.messages}
            if self.tools_in == "request":
                body["tools"] = [{"type": "function", "function": t} for t in TOOLS]
            return body
        body = {"model": "m", "stream": True, "temperature": 0, "max_tokens": self.max_tokens, "system": self.system,
                "messages": self.messages}
        if self.tools_in == "request":
            body["tools"] = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                             for t in TOOLS]
        return body

    def ttft_sum(self) -> float:
        """localrun's /metrics: the sum of its requests' TTFTs (arrival → first token, server side)."""
        import httpx

        text = httpx.get(self.url + "/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("localrun_time_to_first_token_seconds_sum"))

    def turn(self) -> dict:
        """Send the conversation, stream the answer → {ttft, prompt, cached, text, calls, wall}."""
        import httpx

        path = "/v1/chat/completions" if self.api == "openai" else "/v1/messages"
        before = self.ttft_sum() if self.metrics else 0.0
        t0, first = time.perf_counter(), None
        text, calls, usage, timings = [], {}, {}, {}
        with httpx.stream("POST", self.url + path, json=self.body(), timeout=3600,
                          headers={"anthropic-version": "2023-06-01", "x-api-key": "x"}) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{self.url}{path}: {r.status_code} {r.read()[:500]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                got = self._event(ev, text, calls, usage)
                timings = ev.get("timings") or timings
                if got and first is None:
                    first = time.perf_counter() - t0
        wall = time.perf_counter() - t0
        if self.api == "openai":
            prompt = usage.get("prompt_tokens", 0)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        else:
            cached = usage.get("cache_read_input_tokens")
            prompt = usage.get("input_tokens", 0) + (cached or 0)
        if cached is None and timings:  # llama-server's own count
            cached = int(timings.get("cache_n", 0))
        # the server's own TTFT: localrun's /metrics (arrival → first token), llama-server's prompt eval time
        server = self.ttft_sum() - before if self.metrics else (
            timings["prompt_ms"] / 1000 if timings.get("prompt_ms") is not None else None)
        return {"ttft": first if first is not None else wall, "prompt": prompt, "cached": cached or 0,
                "text": "".join(text), "calls": list(calls.values()), "wall": wall, "server_ttft": server}

    def _event(self, ev: dict, text: list, calls: dict, usage: dict) -> bool:
        """Fold one streamed event in; True when it carries generated output."""
        if self.api == "openai":
            if ev.get("usage"):
                usage.update(ev["usage"])
            got = False
            for ch in ev.get("choices") or []:
                d = ch.get("delta") or {}
                if d.get("content"):
                    text.append(d["content"])
                    got = True
                if d.get("reasoning_content"):
                    got = True
                for tc in d.get("tool_calls") or []:
                    c = calls.setdefault(tc.get("index", 0), {"id": "", "name": "", "arguments": ""})
                    fn = tc.get("function") or {}
                    c["id"] = tc.get("id") or c["id"]
                    c["name"] += fn.get("name") or ""
                    c["arguments"] += fn.get("arguments") or ""
                    got = True
            return got
        t = ev.get("type")
        if t == "message_start":
            usage.update(ev["message"].get("usage") or {})
        elif t == "message_delta" and ev.get("usage"):
            usage.update({k: v for k, v in ev["usage"].items() if v is not None})
        elif t == "content_block_start":
            b = ev["content_block"]
            if b.get("type") == "tool_use":
                calls[ev["index"]] = {"id": b.get("id", ""), "name": b.get("name", ""), "arguments": ""}
                return True
        elif t == "content_block_delta":
            d = ev["delta"]
            if d.get("type") == "text_delta" and d.get("text"):
                text.append(d["text"])
                return True
            if d.get("type") == "input_json_delta":
                calls[ev["index"]]["arguments"] += d.get("partial_json", "")
                return True
            if d.get("type") == "thinking_delta":
                return True
        return False

    # ---- the next turn
    def append(self, answer: dict, step: tuple) -> None:
        """The assistant's answer as returned (its tool calls, or the script's call when it made none), the
        tool's result for each call, and the next user message."""
        (name, args), result, user = step
        calls = [c for c in answer["calls"] if c["name"]]
        if not calls:
            calls = [{"id": "", "name": name, "arguments": json.dumps(args)}]
        for c in calls:
            self.n_calls += 1
            c["id"] = c["id"] or f"call_{self.n_calls:04d}"
        if self.api == "openai":
            self.messages.append({"role": "assistant", "content": answer["text"] or None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls]})
            for c in calls:
                self.messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
            if user:
                self.messages.append({"role": "user", "content": user})
            return
        content = ([{"type": "text", "text": answer["text"]}] if answer["text"] else []) + [
            {"type": "tool_use", "id": c["id"], "name": c["name"], "input": _json_or_raw(c["arguments"])}
            for c in calls]
        self.messages.append({"role": "assistant", "content": content})
        blocks = [{"type": "tool_result", "tool_use_id": c["id"], "content": result} for c in calls]
        self.messages.append({"role": "user", "content": blocks + ([{"type": "text", "text": user}] if user else [])})


def _json_or_raw(s: str):
    try:
        v = json.loads(s or "{}")
        return v if isinstance(v, dict) else {"value": v}
    except json.JSONDecodeError:
        return {"raw": s}


# ------------------------------------------------------------------------------------------ the servers


def localrun_server(model: Path, args, home: Path) -> Server:
    env = dict(os.environ, LOCALRUN_HOME=str(home))
    argv = [sys.executable, "-m", "localrun", "serve", str(model), "--port", "{port}", "--parallel", "1",
            "--ctx", str(args.ctx), "--threads", str(args.threads), "--log-level", "warning"]
    if args.flash_attn != "default":
        argv.append("--flash-attn" if args.flash_attn == "on" else "--no-flash-attn")
    return Server("localrun serve", argv, home / "localrun.log", env)


def llama_server(binary: str, model: Path, args, home: Path) -> Server:
    from localrun.backends.llamacpp.lib import cpu_advertises_amx

    argv = [binary, "-m", str(model), "-c", str(args.ctx), "-np", "1", "-t", str(args.threads), "-tb",
            str(args.threads), "--host", "127.0.0.1", "--port", "{port}"]
    if cpu_advertises_amx():
        argv.append("--no-repack")  # llama.cpp's AMX kernels die here; localrun turns them off too
    if args.flash_attn != "default":
        argv += ["-fa", args.flash_attn]
    return Server("llama-server", argv, home / "llama-server.log")


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF path (default: the embedded SmolLM2)")
    ap.add_argument("--api", choices=("openai", "anthropic"), default="openai")
    ap.add_argument("--threads", type=int, default=0, help="default: all cores, 1 on a busy machine")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--flash-attn", choices=("default", "on", "off"), default="default",
                    help="both servers' flash attention (default: each its own: localrun off on a CPU, "
                         "llama-server auto)")
    ap.add_argument("--tools", choices=("system", "request"), default="system",
                    help="system: the tool definitions as text in the system prompt (the same prompt on both servers: "
                         "llama-server drops a request's tools when the chat template has no tool syntax, as "
                         "SmolLM2's); request: as the request's tools (localrun renders them in its generic format)")
    ap.add_argument("--llama-server", default=None, help="llama.cpp's llama-server (default: $LLAMA_SERVER)")
    args = ap.parse_args()
    from localrun.store.resolve import default_model_path

    model = Path(args.model) if args.model else default_model_path()
    peer_bin, why = find_llama_server(args.llama_server)
    if args.threads <= 0:
        args.threads = 1 if os.getloadavg()[0] > (os.cpu_count() or 1) else (os.cpu_count() or 1)
    print(f"agent_session: {model.name}, {args.api} API, tools in the {args.tools}, {TURNS} turns, ctx {args.ctx}, "
          f"threads {args.threads}, flash attention {args.flash_attn}, "
          f"max_tokens {args.max_tokens}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at start"
          + ("" if peer_bin else f"; llama-server comparison skipped: {why}"), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        home = Path(tmp)
        servers = [localrun_server(model, args, home)]
        if peer_bin:
            servers.append(llama_server(peer_bin, model, args, home))
        rows: dict[str, list[dict]] = {}
        try:
            for s in servers:
                s.start()
            sessions = {s.name: Session(s.url, args.api, args.max_tokens, args.tools,
                                        metrics=s.name == "localrun serve") for s in servers}
            for k in range(TURNS):
                for s in servers:
                    sess = sessions[s.name]
                    r = sess.turn()
                    rows.setdefault(s.name, []).append(r)
                    if k < len(STEPS):
                        sess.append(r, STEPS[k])
                line = [f"turn {k + 1}:"]
                for s in servers:
                    r = rows[s.name][k]
                    reuse = r["cached"] / r["prompt"] if r["prompt"] else 0.0
                    made = "tool call " + ",".join(c["name"] for c in r["calls"]) if r["calls"] else "text"
                    kept = ""
                    if k:  # the previous request's prompt is all a prefix cache can hold of this one, and more
                        prev = rows[s.name][k - 1]["prompt"]
                        kept = (f", ceiling {prev / r['prompt']:.2f}: previous prompt "
                                + ("all kept" if r["cached"] >= prev else f"{prev - r['cached']} tokens short")
                                + (f" +{r['cached'] - prev} of the answer" if r["cached"] > prev else ""))
                    line.append(f"{s.name}: {r['prompt']} prompt, {r['cached']} cached (reuse {reuse:.2f}{kept}), "
                                f"TTFT {_s(r['server_ttft'])} (first delta {r['ttft']:.3f} s, {made});")
                if peer_bin:
                    a, b = rows[servers[0].name][k], rows[servers[1].name][k]
                    line.append(f"TTFT localrun/llama-server {_ratio(a['server_ttft'], b['server_ttft'])} "
                                f"(first delta {a['ttft'] / b['ttft']:.2f}×)")
                print("  " + " ".join(line), flush=True)
        except Exception:
            for s in servers:
                if s.log.is_file():
                    print(f"--- {s.name} log tail:\n{s.log.read_text(errors='replace')[-3000:]}")
            raise
        finally:
            for s in servers:
                s.stop()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    for name, rs in rows.items():
        later = [r["cached"] / r["prompt"] if r["prompt"] else 0.0 for r in rs[1:]]
        worst = min(later) if later else 0.0
        ceiling = [p["prompt"] / r["prompt"] if r["prompt"] else 0.0 for p, r in zip(rs, rs[1:])]
        short = sum(max(0, p["prompt"] - r["cached"]) for p, r in zip(rs, rs[1:]))
        print(f"  {name}: reuse on turns 2–{len(rs)} min {worst:.2f}, mean {sum(later) / max(1, len(later)):.2f} "
              f"(goal ≥ 0.9: {'met' if worst >= 0.9 else 'NOT met'}; ceiling min {min(ceiling, default=0):.2f}: "
              f"the new turn's own tokens; previous prompts " + ("all reused" if not short else
                                                                  f"{short} tokens short in all") +
              f"); TTFT turn 1 {_s(rs[0]['server_ttft'])}, turns 2–{len(rs)} "
              + " ".join(_s(r["server_ttft"]) for r in rs[1:]))
    if peer_bin and len(rows) == 2:
        a, b = (rows[s.name] for s in servers)
        print("  TTFT localrun / llama-server per turn (server side): "
              + " ".join(_ratio(x["server_ttft"], y["server_ttft"]) for x, y in zip(a, b))
              + "; first streamed delta: " + " ".join(f"{x['ttft'] / y['ttft']:.2f}×" for x, y in zip(a, b)))


def _s(x: float | None) -> str:
    return "?" if x is None else f"{x:.3f} s"


def _ratio(a: float | None, b: float | None) -> str:
    return "?" if not a or not b else f"{a / b:.2f}×"


if __name__ == "__main__":
    main()
