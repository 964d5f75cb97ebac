"""The package's import graph: no import circle, and no arrow from a lower layer up to a higher one.

Layers, bottom to top (README "How the code is laid out"):

0. foundation: ``errors``, ``units``, ``config``, ``render`` — import nothing above them;
1. model, machine, store and planner: ``model/`` (GGUF reader, catalog, chat templates), ``machine/``
   (hardware, presets, measurements), ``store/`` (resolve, pull, download, info), ``offload/`` (pure),
   ``dialects/`` (template families, the reply parser; pure);
2. ``backends/`` — the Engine / BatchEngine contract and its implementations;
3. ``loading`` — MODEL → plan → loaded engine;
4. on top of an engine: ``server/``, ``bench/``, ``chat/`` (session, REPL, slash-command help);
5. the CLI: ``cli``, ``commands/``.

Run ``python tests/test_import_graph.py`` to print the graph (modules per layer, the arrows that point up).
Only ``localrun`` modules count; an import inside a function (the lazy imports that keep ``--help`` fast)
is an arrow too, but only top-level imports can form an import circle.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "localrun"

LAYERS = {
    0: ("localrun", "localrun.errors", "localrun.units", "localrun.config", "localrun.render"),
    1: ("localrun.model", "localrun.machine", "localrun.store", "localrun.offload", "localrun.dialects"),
    2: ("localrun.backends", "localrun.constrain"),
    3: ("localrun.loading",),
    4: ("localrun.server", "localrun.bench", "localrun.chat"),
    5: ("localrun.cli", "localrun.__main__", "localrun.commands"),
}
LAYER_NAMES = {0: "foundation", 1: "model/machine/store/planner", 2: "backends", 3: "loading",
               4: "server/bench/chat", 5: "CLI"}


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name → file (a package is its ``__init__``)."""
    out = {}
    for f in sorted(ROOT.rglob("*.py")):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def layer_of(mod: str) -> int:
    best, layer = "", -1
    for n, prefixes in LAYERS.items():
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > len(best):
                best, layer = p, n
    return layer


def _targets(node: ast.AST, mod: str, is_pkg: bool, known: dict) -> list[str]:
    """The localrun modules an import statement names."""
    names = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
        names = subs + ([base] if len(subs) < len(node.names) else [])  # `from pkg import sub` names sub
    # the module named (as pylint's cyclic-import does: a package's __init__ that re-exports its
    # submodules is not a circle with them, though importing a.b.c runs a/__init__ first)
    return [n for n in names if n in known and n != mod]


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


@functools.lru_cache(maxsize=1)
def trees() -> dict[str, ast.Module]:
    """Every module parsed once per test run (the tests below share it)."""
    return {mod: ast.parse(path.read_text(), str(path)) for mod, path in modules().items()}


@functools.lru_cache(maxsize=1)
def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """→ (top-level imports, all imports incl. those inside functions), each ``module → {modules}``."""
    known = modules()
    top: dict[str, set[str]] = {m: set() for m in known}
    every: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        tree = trees()[mod]
        is_pkg = path.name == "__init__.py"
        for stmt in tree.body:  # module level, outside `if TYPE_CHECKING:`
            if _is_type_checking(stmt):
                continue
            for node in ast.walk(stmt):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not isinstance(stmt, (ast.FunctionDef,
                                                                                           ast.AsyncFunctionDef,
                                                                                           ast.ClassDef)):
                    top[mod].update(_targets(node, mod, is_pkg, known))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                every[mod].update(_targets(node, mod, is_pkg, known))
    return top, every


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Arrows from a module to one in a higher layer."""
    return sorted((a, b) for a, bs in graph.items() for b in bs if layer_of(b) > layer_of(a))


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer_of(m) < 0] == []


def test_no_import_circle():
    top, _ = import_graph()
    assert cycles(top) == []


# arrows up that are allowed (issue 12 removed the last three: store/info now plans a model itself, the
# MLX-folder test lives in store/resolve, and chat/ holds the REPL's help): keep it empty
KNOWN_UP: set[tuple[str, str]] = set()


def test_no_arrow_points_up():
    """Not even a lazy import inside a function: a backend never reaches into the server or bench,
    loading never into a command."""
    _, every = import_graph()
    assert set(upward(every)) - KNOWN_UP == set()


def test_the_planner_imports_only_the_model_and_the_foundation():
    """``offload/`` is pure: it may read a ModelSpec and a HardwareProfile's data, never a backend."""
    _, every = import_graph()
    for mod, deps in every.items():
        if mod.startswith("localrun.offload"):
            assert all(layer_of(d) <= 1 for d in deps), (mod, deps)


def report() -> str:
    top, every = import_graph()
    lines = []
    for n in sorted(LAYERS, reverse=True):
        mods = [m for m in modules() if layer_of(m) == n]
        lines.append(f"layer {n} ({LAYER_NAMES[n]}, {len(mods)} modules): " + ", ".join(
            m.removeprefix("localrun.") for m in mods))
    cyc = cycles(top)
    lines.append(f"import circles (top-level imports): {len(cyc)}")
    lines += ["  " + " <-> ".join(c) for c in cyc]
    lazy = cycles(every)
    lines.append(f"import circles counting imports inside functions: {len(lazy)}")
    lines += ["  " + " <-> ".join(c) for c in lazy]
    up = upward(every)
    lines.append(f"arrows pointing up a layer (any import, lazy ones included): {len(up)}")
    lines += [f"  {a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})" for a, b in up]
    n_top = sum(len(v) for v in top.values())
    n_all = sum(len(v) for v in every.values())
    lines.append(f"arrows: {n_top} top-level, {n_all} in all")
    return "\n".join(lines)


def private_reach_ins() -> list[str]:
    """``x._name`` where ``_name`` is a private attribute or method that another localrun module defines
    (``self._name = …``, or ``def _name`` / ``_name = …`` in a class body) and this module does not, and
    ``from localrun.m import _name``: each one a seam read from outside (issue 12: the engine contract is
    public; nothing reaches into another module's underscore names)."""
    defined: dict[str, set[str]] = {}
    parsed = trees()
    for mod, tree in parsed.items():
        names = defined.setdefault(mod, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and isinstance(node.ctx, ast.Store) and _private(node.attr):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                        names.add(item.name)
                    elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        names.update(t.id for t in targets if isinstance(t, ast.Name) and _private(t.id))
    found = []
    for mod, tree in parsed.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("localrun"):
                found += [f"{mod}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in defined[mod]:
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                owners = sorted(m for m, names in defined.items() if node.attr in names and m != mod)
                if owners:
                    found.append(f"{mod}:{node.lineno}: .{node.attr} (defined in {', '.join(owners)})")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_reaches_into_another_modules_private_names():
    assert private_reach_ins() == []


if __name__ == "__main__":
    print(report())


# llama.cpp's model loader, context constructor and default-params constructors: only
# ``backends/llamacpp_params.py`` calls them, so every model localrun loads (engine, draft model, embedding
# context, dry run) gets the same placement (AMX off), load mode, threads and offload.
LLAMA_LOADERS = frozenset({"llama_model_load_from_file", "llama_load_model_from_file", "llama_init_from_model",
                           "llama_new_context_with_model", "llama_model_default_params",
                           "llama_context_default_params", "llama_model_load_from_splits"})
PARAMS_MODULE = "localrun.backends.llamacpp_params"


def llama_loader_calls() -> list[str]:
    """``module:line: name`` for every use of a ``LLAMA_LOADERS`` name outside ``PARAMS_MODULE``."""
    found = []
    for mod, path in modules().items():
        if mod == PARAMS_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in LLAMA_LOADERS:
                found.append(f"{mod}:{node.lineno}: {name}")
    return found


def test_every_llama_cpp_load_goes_through_llamacpp_params():
    assert PARAMS_MODULE in modules()
    assert llama_loader_calls() == []
