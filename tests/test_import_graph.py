"""The package's import graph: no import circle, and no arrow from a lower layer up to a higher one.

Layers, bottom to top (docs/architecture.md §6):

0. foundation: ``errors``, ``units``, ``config``, ``render`` — import nothing above them;
1. model, machine, store and planner: ``model/`` (GGUF reader, catalog, chat templates), ``machine/``
   (hardware, presets, measurements), ``store/`` (resolve, pull, download, info), ``offload/`` (pure),
   ``dialects/`` (template families, the reply parser; pure);
2. ``backends/`` — the Engine / BatchEngine contract and its implementations;
3. ``loading`` — MODEL → plan → loaded engine; ``agent/`` — tools, MCP client, approvals, the agent loop and
   compaction (it calls the engine contract; chat/ and server/ use it, so it sits below them);
4. on top of an engine: ``server/``, ``bench/``, ``chat/`` (session, REPL, slash-command help);
5. the CLI: ``cli``, ``commands/``.

Run ``python tests/test_import_graph.py`` to print the graph (modules per layer, the arrows that point up).
Only ``localrun`` modules count; an import inside a function (the lazy imports that keep ``--help`` fast)
is an arrow too, and counts for import circles as well (``test_no_import_circle_counting_lazy_imports``).
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
    3: ("localrun.loading", "localrun.agent"),
    4: ("localrun.server", "localrun.bench", "localrun.chat"),
    5: ("localrun.cli", "localrun.__main__", "localrun.commands"),
}
LAYER_NAMES = {0: "foundation", 1: "model/machine/store/planner", 2: "backends", 3: "loading/agent",
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
# ``backends/llamacpp/params.py`` calls them, so every model localrun loads (engine, draft model, embedding
# context, dry run) gets the same placement (AMX off), load mode, threads and offload.
LLAMA_LOADERS = frozenset({"llama_model_load_from_file", "llama_load_model_from_file", "llama_init_from_model",
                           "llama_new_context_with_model", "llama_model_default_params",
                           "llama_context_default_params", "llama_model_load_from_splits",
                           "mtmd_init_from_file", "mtmd_context_params_default"})
PARAMS_MODULE = "localrun.backends.llamacpp.params"


def llama_loader_calls() -> list[str]:
    """``module:line: name`` for every use of a ``LLAMA_LOADERS`` name outside ``PARAMS_MODULE``."""
    found = []
    for mod, tree in trees().items():
        if mod == PARAMS_MODULE:
            continue
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in LLAMA_LOADERS:
                found.append(f"{mod}:{node.lineno}: {name}")
    return found


def test_every_llama_cpp_load_goes_through_llamacpp_params():
    assert PARAMS_MODULE in modules()
    assert llama_loader_calls() == []


# the backend wings (issue 26): ``backends/llamacpp/`` and ``backends/mlx/`` are imported only from inside
# ``backends/``; everything else goes through the names ``localrun.backends`` exports
WINGS = ("localrun.backends.llamacpp", "localrun.backends.mlx")


def _in(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def wing_reach_ins() -> list[str]:
    """``module -> wing module`` for every import (lazy ones and ``TYPE_CHECKING`` ones included) of a wing
    from outside ``localrun.backends``, and ``module: 'name'`` for a wing's dotted name written in a string
    there (``importlib.import_module``, a module list): each one a seam around the backends' front door."""
    _, every = import_graph()
    found = [f"{a} -> {b}" for a, bs in every.items() if not _in(a, "localrun.backends")
             for b in sorted(bs) if any(_in(b, w) for w in WINGS)]
    for mod, tree in trees().items():
        if _in(mod, "localrun.backends"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and any(w in node.value for w in WINGS):
                found.append(f"{mod}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_outside_backends_imports_a_backend_wing():
    assert wing_reach_ins() == []


def test_the_two_wings_do_not_import_each_other():
    _, every = import_graph()
    a, b = WINGS
    crossed = [(m, d) for m, ds in every.items() for d in ds
               if (_in(m, a) and _in(d, b)) or (_in(m, b) and _in(d, a))]
    assert crossed == []


def test_no_import_circle_counting_lazy_imports():
    """No circle even counting the imports inside functions (and under ``TYPE_CHECKING``): speculation takes
    the engine through ``base.SpeculationTarget`` instead of importing the engine class, and the constraint
    compiler is looked up by ``backends.control`` without ``constrain/`` importing it back."""
    _, every = import_graph()
    assert cycles(every) == []


def test_importing_the_backends_package_imports_no_backend():
    """``import localrun.backends`` (what the CLI, the planner and the server import) loads neither wing nor
    llama_cpp, mlx or numpy: a fresh interpreter."""
    import subprocess

    code = ("import sys, localrun.backends, localrun.cli\n"
            "print([m for m in sys.modules if m.split('.')[0] in ('llama_cpp', 'mlx', 'mlx_lm', 'numpy')\n"
            "       or m.startswith(('localrun.backends.llamacpp', 'localrun.backends.mlx'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# the wire-format wings (issue 26): each folder under ``server/`` (``openai/``, ``ollama/``, ``anthropic/``, and
# any later one such as ``responses/``) imports the serving core (``server/*.py``), the backends' public API,
# dialects and errors; never another wire-format folder, not even inside a function
SERVER_WINGS_AT_LEAST = ("localrun.server.openai", "localrun.server.ollama", "localrun.server.anthropic")


def server_wings() -> list[str]:
    """Every wire-format folder: a package directly under ``localrun.server``."""
    return sorted(m for m, path in modules().items()
                  if path.name == "__init__.py" and m.startswith("localrun.server.") and m.count(".") == 2)


def cross_server_wing_imports() -> list[str]:
    """``module -> module`` for every import (lazy and ``TYPE_CHECKING`` ones included) from one wire-format
    folder into another, and ``module:line: 'name'`` for another folder's dotted name written in a string
    (``importlib.import_module``)."""
    wings = server_wings()

    def wing_of(mod: str) -> str | None:
        return next((w for w in wings if _in_pkg(mod, w)), None)

    _, every = import_graph()
    found = [f"{a} -> {b}" for a, bs in every.items() if wing_of(a)
             for b in sorted(bs) if wing_of(b) not in (None, wing_of(a))]
    for mod, tree in trees().items():
        home = wing_of(mod)
        if home is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [f"{mod}:{node.lineno}: {node.value!r}" for w in wings if w != home
                          and any(w + end in node.value + " " for end in (" ", ".", "'", '"', "`"))]
    return found


def _in_pkg(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def test_no_wire_format_wing_imports_another():
    wings = server_wings()
    assert set(SERVER_WINGS_AT_LEAST) <= set(wings), wings
    assert cross_server_wing_imports() == []


def test_every_registered_wire_format_is_a_wing_folder():
    """``server/wings.py`` registers wire formats by folder name: each one is a folder under ``server/``."""
    from localrun.server.wings import WINGS as REGISTERED

    assert {f"localrun.server.{w}" for w in REGISTERED} <= set(server_wings())
