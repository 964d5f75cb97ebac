"""The workload of ``agent_session.py``: an agent's system prompt, its tool definitions, and the steps of a
six-turn coding session (the tool calls an agent makes, their results, the user's next messages).

The base system prompt and eight tools are ≈ 3,000 tokens. Real agents send far more on every request:
Claude Code 2.1 sends 24 tools with large schemas and a 15–20k-token prompt, and MCP servers add their own
tools. ``system_text(tools_in, agent_tokens)`` pads the prompt to ``agent_tokens`` with MCP-style tool
definitions (``mcp_tools``), so that a session's prompts are the size the prefix cache meets in use.
"""

from __future__ import annotations

import itertools
import json

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


MCP_SERVERS = {
    "github": ["create_issue", "list_issues", "get_issue", "update_issue", "add_issue_comment", "create_pull_request",
               "list_pull_requests", "merge_pull_request", "get_file_contents", "push_files", "search_code",
               "create_branch", "list_commits", "get_pull_request_diff"],
    "jira": ["create_ticket", "search_tickets", "transition_ticket", "add_worklog", "link_tickets", "get_sprint"],
    "postgres": ["query", "list_tables", "describe_table", "explain", "list_indexes", "table_stats"],
    "browser": ["navigate", "click", "type", "screenshot", "evaluate", "wait_for", "get_console_logs", "close"],
    "slack": ["post_message", "list_channels", "get_thread", "add_reaction", "search_messages", "upload_file"],
    "sentry": ["list_issues", "get_event", "resolve_issue", "list_releases", "get_stacktrace", "assign_issue"],
}


def mcp_tools():
    """Tool definitions as MCP servers expose them to an agent (``mcp__SERVER__VERB``), each with a
    description and a schema of a few typed parameters, in a fixed order (the servers again as ``github2`` …
    once all are listed: as many as asked for)."""
    for copy in itertools.count(1):
        for server, verbs in MCP_SERVERS.items():
            server = server if copy == 1 else f"{server}{copy}"
            yield from _mcp_server_tools(server, verbs)


def _mcp_server_tools(server: str, verbs: list[str]):
    for verb in verbs:
        what = verb.replace("_", " ")
        yield _tool(f"mcp__{server}__{verb}",
                    f"{what.capitalize()} through the {server} MCP server. Use it when the user asks to {what} "
                    f"in {server}; prefer it over shell commands that reach {server}'s API directly. The call is "
                    f"made with the user's {server} credentials and is logged. Results longer than 25000 "
                    "characters are truncated; ask for a narrower result (a filter, a page) instead.",
                    {"target": _s(f"The {server} resource to {what} (an id, a name or a URL)"),
                     "query": _s("A filter in the server's own syntax; empty for all"),
                     "page": {"type": "integer", "description": "The page of results, from 1", "minimum": 1},
                     "fields": {"type": "array", "items": {"type": "string"},
                                "description": "The fields to return; all when omitted"}},
                    ["target"])


def tool_list(agent_tokens: int = 0) -> list[dict]:
    """``TOOLS``, then MCP tools until the system text with them is ≈ ``agent_tokens`` tokens (≈ 3.6
    characters a token for English and JSON); none beyond ``TOOLS`` when ``agent_tokens`` is 0."""
    tools = list(TOOLS)
    size = len(system_prompt()) + sum(len(json.dumps(t)) for t in tools)
    for t in mcp_tools():
        if size / 3.6 >= agent_tokens:
            break
        tools.append(t)
        size += len(json.dumps(t))
    return tools


def system_text(tools: list[dict], tools_in: str) -> str:
    """The system prompt, with the tool definitions as text when ``tools_in`` is ``system``."""
    text = system_prompt()
    if tools_in == "system":  # what a model without tool syntax is given: the definitions as text
        text += "\n\n# Tools\nYou can call these tools:\n" + "\n".join(json.dumps(t) for t in tools)
    return text
