"""The package's layering, read from its source: imports go down the data flow, never up, never round.

Each subpackage has a rank in the flow (spec -> graph -> cost -> schedule -> estimator -> planner |
measure -> outputs -> cli); a module may import its own subpackage and any of lower rank. Siblings of
one rank (the planner and the measurement side) do not import each other. Imports inside functions
count: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "simulator"

RANK = {
    "spec": 0, "graph": 1, "cost": 2, "schedule": 3, "estimator": 4, "planner": 5, "measure": 5,
    "outputs": 6, "cli": 7, "bench": 8, "__main__": 8,
}
MAX_TOP_LEVEL_ENTRIES = 12


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> nx.DiGraph:
    """simulator's modules and the imports between them (every import statement, wherever it stands)."""
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # ``from simulator.x import y``: y may be a module or a name in x
                targets = [f"{node.module}.{a.name}" for a in node.names]
            for target in targets:
                if target.startswith("simulator."):
                    found = _resolve(target, modules)
                    if found and found != name:
                        graph.add_edge(name, found)
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_imports_have_no_cycles():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_every_subpackage_has_a_rank():
    layers = {_layer(m) for m in _modules()} - {""}
    assert layers <= set(RANK), f"subpackages or modules without a place in the flow: {sorted(layers - set(RANK))}"


def test_imports_go_down_the_flow():
    upward = []
    for src, dst in import_graph().edges:
        a, b = _layer(src), _layer(dst)
        if a == b or b == "" and a == "":
            continue
        if b == "" or RANK[b] >= RANK[a]:
            upward.append(f"{src} -> {dst}")
    assert not upward, "imports that go up or sideways: " + ", ".join(sorted(upward))


def test_top_level_stays_small():
    entries = [p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= MAX_TOP_LEVEL_ENTRIES, sorted(entries)


def test_each_subpackage_says_what_it_owns():
    for sub in RANK:
        init = PACKAGE / sub / "__init__.py"
        if init.exists():
            doc = ast.get_docstring(ast.parse(init.read_text()))
            assert doc and "import" in doc, f"simulator/{sub}/__init__.py should say what it owns and may import"


def test_no_module_shares_a_name_with_a_public_function():
    import simulator

    for name in simulator.__all__:
        assert not (PACKAGE / f"{name}.py").exists() and not (PACKAGE / name).is_dir(), name
