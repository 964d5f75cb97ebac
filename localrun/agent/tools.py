"""The ``Tool`` record and the built-in tools (``chat --tools read,write,shell``; all off unless asked).

Sets (``BUILTIN_SETS``):

* ``read``: ``read_file`` (a text file, by lines), ``list_folder`` (a folder's entries), ``search_text`` (a
  regular expression over the text files under a folder) — they never ask;
* ``write``: ``write_file`` (a whole file) and ``edit_file`` (replace one exact passage) — they ask first,
  showing the change as a unified diff (``difflib``);
* ``shell``: ``run_shell`` (``/bin/sh -c`` in the working directory, a timeout, the output capped) — asks first.

Paths are relative to the working directory (``root``); a tool's failure (no such file, a passage not
found, a timeout) is its result text, for the model to read, never an exception out of ``run``.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

BUILTIN_SETS = ("read", "write", "shell")
SHELL_TIMEOUT_S = 30.0  # default, and the most a call may ask for is SHELL_TIMEOUT_MAX_S
SHELL_TIMEOUT_MAX_S = 300.0
SHELL_OUTPUT_CAP = 16_000  # characters of a command's output kept (head and tail)
READ_LINES = 400  # lines read_file returns at most per call
MAX_OFFSET = 10**9  # read_file's offset at most: a bound keeps a small model's constrained call from writing digits
SEARCH_HITS = 50  # lines search_text returns at most


class ToolFailed(Exception):
    """A tool could not do what was asked; the message is the result the model reads."""


@dataclass
class Tool:
    """One tool the model may call.

    ``parameters``: its arguments' JSON Schema (an object schema); ``run(args) -> str`` does it (raises
    ToolFailed, or any exception, for a failure the model is told about); ``asks``: it writes or runs, so
    the user approves each call (``approvals``); ``preview(args) -> str``: what is shown before that
    question (a unified diff for a write); ``source``: "built-in" or the MCP server's name; ``remote``:
    the name the MCP server knows it by."""

    name: str
    description: str
    parameters: dict
    run: Callable[[dict], str]
    asks: bool = False
    preview: Callable[[dict], str] | None = None
    source: str = "built-in"
    remote: str = ""
    meta: dict = field(default_factory=dict)

    def definition(self) -> dict:
        """The OpenAI tool definition (what the template or the generic format describes)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def _obj(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def builtin_tools(sets: list[str], root: str | os.PathLike | None = None) -> list[Tool]:
    """The built-in tools of ``sets`` (names from BUILTIN_SETS), working under ``root`` (default: the
    current directory). Raises ValueError naming an unknown set."""
    bad = [s for s in sets if s not in BUILTIN_SETS]
    if bad:
        raise ValueError(f"unknown tool set {bad[0]!r} (known: {', '.join(BUILTIN_SETS)})")
    fs = _Files(Path(root or os.getcwd()))
    out: list[Tool] = []
    file = {"type": "string", "description": "a file name, relative to the working directory"}
    if "read" in sets:
        out += [
            Tool("read_file", "Read a text file (up to 400 lines from line `offset`, 1-based).",
                 _obj({"path": file, "offset": {"type": "integer", "minimum": 1, "maximum": MAX_OFFSET}}, ["path"]),
                 fs.read),
            Tool("list_folder", "List the files and folders in a folder (folders end with /).",
                 _obj({"path": {"type": "string", "description": '"." is the working directory'}}, ["path"]),
                 fs.list),
            Tool("search_text", "Search the text files under a folder for a regular expression; "
                 "returns path:line: text for each matching line.",
                 _obj({"pattern": {"type": "string"}, "path": {"type": "string"}}, ["pattern"]), fs.search),
        ]
    if "write" in sets:
        out += [
            Tool("write_file", "Write a whole text file (created or replaced).",
                 _obj({"path": file, "content": {"type": "string"}}, ["path", "content"]),
                 fs.write, asks=True, preview=fs.write_diff),
            Tool("edit_file", "Replace one exact passage `old` of a text file with `new`.",
                 _obj({"path": file, "old": {"type": "string"}, "new": {"type": "string"}},
                      ["path", "old", "new"]), fs.edit, asks=True, preview=fs.edit_diff),
        ]
    if "shell" in sets:
        out.append(Tool("run_shell", "Run a shell command in the working directory; returns its exit status "
                        "and output.", _obj({"command": {"type": "string"},
                                             "timeout_s": {"type": "number", "minimum": 1,
                                                           "maximum": SHELL_TIMEOUT_MAX_S}}, ["command"]),
                        fs.shell, asks=True, preview=lambda a: f"$ {a.get('command', '')}"))
    return out


class _Files:
    """The built-in tools' work, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, p: str) -> Path:
        return (self.root / os.path.expanduser(p or ".")).resolve()

    def _text(self, p: Path) -> str:
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise ToolFailed(f"no such file: {p}") from None
        except IsADirectoryError:
            raise ToolFailed(f"{p} is a folder: use list_folder") from None
        except OSError as e:
            raise ToolFailed(f"cannot read {p}: {e.strerror or e}") from None
        if b"\0" in data[:4096]:
            raise ToolFailed(f"{p} is not a text file")
        return data.decode("utf-8", errors="replace")

    def read(self, a: dict) -> str:
        p = self.path(a["path"])
        lines = self._text(p).splitlines()
        start = max(1, int(a.get("offset") or 1))
        part = lines[start - 1:start - 1 + READ_LINES]
        more = len(lines) - (start - 1 + len(part))
        tail = f"\n[{more} more lines: read_file with offset {start + len(part)}]" if more > 0 else ""
        return "\n".join(part) + tail

    def list(self, a: dict) -> str:
        p = self.path(a.get("path") or ".")
        if not p.is_dir():
            raise ToolFailed(f"no such folder: {p}")
        names = sorted((e.name + ("/" if e.is_dir() else "")) for e in p.iterdir())
        return "\n".join(names) if names else "(empty folder)"

    def search(self, a: dict) -> str:
        try:
            rx = re.compile(a["pattern"])
        except re.error as e:
            raise ToolFailed(f"not a regular expression: {e}") from None
        base = self.path(a.get("path") or ".")
        files = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        if not files:
            raise ToolFailed(f"no such file or folder: {base}")
        hits: list[str] = []
        for f in files:
            if not f.is_file() or any(part.startswith(".") for part in f.relative_to(self.root).parts
                                      if f.is_relative_to(self.root)):
                continue
            try:
                text = self._text(f)
            except ToolFailed:
                continue
            for i, line in enumerate(text.splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{_rel(f, self.root)}:{i}: {line[:200]}")
                    if len(hits) >= SEARCH_HITS:
                        return "\n".join(hits) + f"\n[stopped at {SEARCH_HITS} matches]"
        return "\n".join(hits) if hits else "no match"

    def _old(self, p: Path) -> str:
        return self._text(p) if p.exists() else ""

    def write_diff(self, a: dict) -> str:
        p = self.path(a["path"])
        return unified_diff(self._old(p), a["content"], _rel(p, self.root))

    def write(self, a: dict) -> str:
        p = self.path(a["path"])
        if not p.parent.is_dir():
            raise ToolFailed(f"the folder {p.parent} does not exist")
        try:
            p.write_text(a["content"])
        except OSError as e:
            raise ToolFailed(f"cannot write {p}: {e.strerror or e}") from None
        return f"wrote {len(a['content'])} characters to {_rel(p, self.root)}"

    def _edited(self, a: dict) -> tuple[Path, str, str]:
        p = self.path(a["path"])
        old = self._text(p)
        n = old.count(a["old"]) if a["old"] else 0
        if n != 1:
            raise ToolFailed(f"the passage `old` occurs {n} times in {_rel(p, self.root)}; it must occur once "
                             "(quote more of it, or use write_file)")
        return p, old, old.replace(a["old"], a["new"], 1)

    def edit_diff(self, a: dict) -> str:
        try:
            p, old, new = self._edited(a)
        except ToolFailed as e:
            return f"(no change: {e})"
        return unified_diff(old, new, _rel(p, self.root))

    def edit(self, a: dict) -> str:
        p, _, new = self._edited(a)
        p.write_text(new)
        return f"edited {_rel(p, self.root)}"

    def shell(self, a: dict) -> str:
        timeout = min(float(a.get("timeout_s") or SHELL_TIMEOUT_S), SHELL_TIMEOUT_MAX_S)
        try:
            r = subprocess.run(["/bin/sh", "-c", a["command"]], cwd=self.root, capture_output=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode("utf-8", "replace") + (e.stderr or b"").decode("utf-8", "replace")
            return f"timed out after {timeout:g} s\n" + cap_text(out, SHELL_OUTPUT_CAP)
        out = r.stdout.decode("utf-8", "replace") + r.stderr.decode("utf-8", "replace")
        return f"exit {r.returncode}\n" + cap_text(out, SHELL_OUTPUT_CAP)


def unified_diff(old: str, new: str, name: str) -> str:
    """``old`` → ``new`` as a unified diff (``difflib.unified_diff``, 3 lines of context)."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 f"a/{name}", f"b/{name}")
    text = "".join(x if x.endswith("\n") else x + "\n" for x in lines)
    return text.rstrip("\n") or "(no change)"


def cap_text(text: str, cap: int) -> str:
    """``text`` cut to about ``cap`` characters: its head and tail, with a note of what was cut."""
    if len(text) <= cap:
        return text
    head, tail = text[: cap * 3 // 4], text[-(cap // 4):]
    return f"{head}\n[… cut {len(text) - len(head) - len(tail)} of {len(text)} characters …]\n{tail}"


def _rel(p: Path, root: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)
