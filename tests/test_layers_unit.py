"""The package's layering, read from the code: no import cycle between modules, and no module
importing a higher layer. ARCHITECTURE.md's drawing of the layers is this test's table, rendered
(``python tests/test_layers_unit.py --write`` redraws it from the code).

Function-level imports count like top-level ones: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A module (or package) may import its own layer's package internals and any lower
# layer; never a higher one. Packages are named by their folder.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "foundation",
        ["loader", "errors", "lsn", "names", "faults", "logs", "metrics", "progress", "spills", "workload"],
    ),
    ("settings", ["config"]),
    ("services", ["retry", "spark", "embedded"]),
    ("stage locks", ["locks"]),
    ("formats", ["landing", "lake"]),
    ("canonical form", ["canonical"]),
    ("capture", ["capture"]),
    ("other inputs", ["inputs"]),
    ("load", ["load"]),
    ("merge", ["merge"]),
    ("reading and serving the lake", ["maintain", "verify", "status", "dbtgen", "sqlserver"]),
    ("whole-lake operations", ["erase", "backfill", "dbt", "follow"]),
    ("the demo", ["demo"]),
    ("the command", ["cli"]),
]


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (ROOT / "loader").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(path: Path, mods: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "loader":
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "loader")
    return {m for m in found if m in mods}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(p, mods) - {m} for m, p in mods.items()}


def _group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _layer_of() -> dict[str, int]:
    return {g: i for i, (_, groups) in enumerate(LAYERS) for g in groups}


def render() -> str:
    """The layers as ARCHITECTURE.md draws them, highest first, with what each imports below it."""
    graph = _graph()
    below: dict[str, set[str]] = defaultdict(set)
    for m, deps in graph.items():
        below[_group(m)].update(_group(d) for d in deps if _group(d) != _group(m))
    lines = []
    for i, (title, groups) in reversed(list(enumerate(LAYERS))):
        for g in groups:
            uses = ", ".join(sorted(below[g])) or "-"
            lines.append(f"{i:>2} {title:<30} {g:<10} imports: {uses}")
    return "\n".join(lines)


def test_every_module_has_a_layer() -> None:
    layer = _layer_of()
    missing = sorted({_group(m) for m in _modules()} - set(layer))
    assert not missing, f"give these a layer in LAYERS: {missing}"


def test_no_module_imports_a_higher_layer() -> None:
    layer = _layer_of()
    upward = [
        f"{m} -> {d}"
        for m, deps in sorted(_graph().items())
        for d in sorted(deps)
        if _group(d) != _group(m) and layer[_group(d)] >= layer[_group(m)]
    ]
    assert not upward, "imports of the same or a higher layer:\n" + "\n".join(upward)


def test_no_import_cycle() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            # A package's __init__ importing its own modules is not a cycle worth naming.
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_architecture_draws_the_layers_the_code_has() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    start, end = _START, _END
    assert start in text and end in text, "ARCHITECTURE.md lost its layers block"
    drawn = text[text.index(start) + len(start) : text.index(end)]
    assert drawn == render(), "ARCHITECTURE.md's layers differ from the code; the code gives:\n" + render()


_START, _END = "<!-- layers: tests/test_layers_unit.py -->\n```\n", "\n```\n<!-- /layers -->"

if __name__ == "__main__":
    import sys

    doc = ROOT / "ARCHITECTURE.md"
    if sys.argv[1:] == ["--write"]:
        text = doc.read_text()
        doc.write_text(text[: text.index(_START) + len(_START)] + render() + text[text.index(_END) :])
    else:
        print(render())
