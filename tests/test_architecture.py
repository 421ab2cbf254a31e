"""The code's structure: folders are layers, no import cycles between modules, and the command lines are leaves.

Function-level imports count: a cycle hidden inside a function still couples two
modules both ways, so the graph is built from every ``import`` statement in the file.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "solvers")
CLI_MODULES = {"model.solve", "model.evaluate", "model.sweep", "model.calibrate", "model.audit", "model.export",
               "model.replay", "model.solve_serving",
               "model.cli_common", "model.cli_json"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (resolved to modules, not names inside them)."""
    files = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # "from pkg import mod" depends on the module; "from mod import name" on mod itself
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                           for a in node.names]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None (iterative DFS with colours)."""
    colour = dict.fromkeys(graph, 0)
    for root in sorted(graph):
        if colour[root]:
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        colour[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child) == 1:
                return path[path.index(child):] + [child]
            elif colour.get(child) == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_detector_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_nothing_imports_a_command_line_module():
    graph = import_graph()
    offenders = sorted(f"{m} imports {t}" for m, ts in graph.items() for t in ts
                       if t in CLI_MODULES and m not in CLI_MODULES)
    assert not offenders, offenders


# The layers, bottom first: a folder may import only folders listed before it (and itself).  Data flows
# load -> histogram -> formulation -> planning -> expand -> evaluation -> report; the base rules (errors and the
# run's clock, the solvers' contract, the cost model, the domain records, windowing and shape sets) lie below
# them, the pipeline and what drives it above, and the command lines on top.
LAYERS = ("base", "solvers.backends", "cost", "domain", "load", "calibration", "histogram", "formulation",
          "packers", "planning", "expand", "evaluation", "serving", "serveplan", "report", "pipeline", "sweeping",
          "distributed", "deploy", "commands")
COMMANDS = {"model", *CLI_MODULES}


def folder_of(module: str) -> str:
    """The layer a module belongs to: its folder under model/ (or solvers/backends), the
    pipeline module on its own, and the command lines (with model/__init__) as one layer."""
    parts = module.split(".")
    if module in COMMANDS:
        return "commands"
    if parts[0] == "solvers":
        return "solvers.backends"  # the solvers' contract and adapters (the package's own file is a docstring)
    return parts[1]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder -> the folders it imports (a module importing its own folder is no arrow)."""
    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        out.setdefault(folder_of(mod), set()).update(folder_of(t) for t in targets)
    return {f: ts - {f} for f, ts in out.items()}


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Every module import that runs from a folder to one at its own rank or above it in LAYERS."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(f"{m} ({folder_of(m)}) imports {t} ({folder_of(t)})" for m, ts in graph.items() for t in ts
                  if folder_of(m) != folder_of(t) and rank[folder_of(t)] >= rank[folder_of(m)])


def test_every_folder_has_a_layer():
    folders = set(folder_graph(import_graph()))
    assert folders <= set(LAYERS), sorted(folders - set(LAYERS))


def test_no_folder_imports_a_folder_above_it():
    arrows = upward_arrows(import_graph())
    assert not arrows, arrows


def test_no_folder_level_cycle():
    cycle = find_cycle(folder_graph(import_graph()))
    assert cycle is None, " -> ".join(cycle)


def test_the_layer_check_sees_an_arrow_up():
    assert upward_arrows({"model.cost.model": {"model.planning.mip"}, "model.planning.mip": set()}) == [
        "model.cost.model (cost) imports model.planning.mip (planning)"]
    assert folder_graph({"model.a.x": {"model.b.y", "model.a.z"}, "model.a.z": set(), "model.b.y": set()}) == {
        "a": {"b"}, "b": set()}


def test_lint_is_clean():
    """The [tool.ruff] rules of pyproject.toml hold (zip without strict= among them)."""
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    done = subprocess.run([ruff, "check", "--no-cache", "model", "solvers", "tests", "scripts"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
