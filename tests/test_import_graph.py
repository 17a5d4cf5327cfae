"""The package's layering, read from its import statements (no module is imported).

* Outside ``bcg/sim`` nothing imports a ``bcg.sim`` submodule: the simulator is used through ``bcg.sim`` alone, so
  its modules can be rearranged without touching its users.
* No package imports a layer above it (sim and robots < motion < envs < estimators < agents < evaluation < cli).
* No two modules import each other, directly or through others (function-level imports count).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bcg"

LAYERS = {"robots": 1, "sim": 1, "motion": 2, "envs": 3, "estimators": 4, "agents": 5, "evaluation": 6, "cli": 7}
"""Rank of each top-level part of ``bcg``; modules not named here (errors, files, parsing, ...) are shared
utilities of rank 0, and ``bcg/__init__.py`` may import anything."""


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``path``, at any depth (function-level imports count); a submodule
    imported by name from its package (``from bcg.sim import bridge``) counts as that submodule."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = PACKAGE.parent.joinpath(*node.module.split("."))
            subs = [a.name for a in node.names if (base / f"{a.name}.py").is_file() or (base / a.name).is_dir()]
            out.extend((node.lineno, f"{node.module}.{s}") for s in subs)
            if len(subs) < len(node.names):
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
    return out


def _modules() -> list[tuple[str, Path]]:
    return [(p.relative_to(PACKAGE).as_posix(), p) for p in sorted(PACKAGE.rglob("*.py"))]


def test_nothing_outside_the_simulator_imports_its_submodules():
    found = [f"bcg/{rel}:{line} imports {mod}" for rel, p in _modules() if not rel.startswith("sim/")
             for line, mod in _imports(p) if mod.startswith("bcg.sim.")]
    assert not found, "import these names from bcg.sim instead:\n" + "\n".join(found)


def test_no_layer_imports_one_above_it():
    found = []
    for rel, p in _modules():
        src = LAYERS.get(rel.split("/")[0].removesuffix(".py"), 0)
        if rel == "__init__.py":
            continue
        for line, mod in _imports(p):
            parts = mod.split(".")
            if parts[0] != "bcg" or len(parts) < 2:
                continue
            if LAYERS.get(parts[1], 0) > src:
                found.append(f"bcg/{rel}:{line} imports {mod}")
    assert not found, "upward imports:\n" + "\n".join(found)


def test_the_rules_catch_what_they_forbid(tmp_path):
    """The parser sees imports inside functions, which is where most of the package's late imports are."""
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from bcg.sim.engine import clear_pool\n    import bcg.evaluation.compare\n"
                 "from bcg.sim import bridge, step\n")
    assert sorted(_imports(p)) == [(2, "bcg.sim.engine"), (3, "bcg.evaluation.compare"), (4, "bcg.sim"),
                                   (4, "bcg.sim.bridge")]


def test_no_import_cycles():
    """Modules of ``bcg`` form no cycle of imports (a package's ``__init__`` re-exporting its own submodules aside)."""
    names = {}
    for rel, p in _modules():
        name = "bcg." + rel.removesuffix(".py").replace("/", ".")
        names[name.removesuffix(".__init__")] = p
    graph = {m: {i for _, i in _imports(p) if i in names and i != m and not m.startswith(i + ".")}
             for m, p in names.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(path[path.index(n):] + [n]) if n in path else f"{m} -> {n}")
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
