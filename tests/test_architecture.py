"""The packages' layers (docs/authoring.md, "Architecture"): the judge imports nothing built
around it, a feature imports only the layers below its own, no import statement names a kata's
grader or the reference, and no import cycle, counting the imports made inside functions."""
import ast
import importlib

import pytest

from graders.engine.manifest import ROOT

LAYERS = ("engine", "practice", "classroom", "authoring")   # each may import those before it


def kit_modules() -> dict[str, object]:
    """{dotted name: path} of cli.py and every module of the layers: all the kit but its graders."""
    found = {"cli": ROOT / "cli.py"}
    for layer in LAYERS:
        for path in sorted((ROOT / "graders" / layer).glob("*.py")):
            found[f"graders.{layer}" + ("" if path.stem == "__init__" else f".{path.stem}")] = path
    return found


def imported(name: str, path) -> set[str]:
    """What ``name`` imports, at the top or inside a function, relative imports resolved; for
    ``from X import y`` both X and X.y (y may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def layer_of(name: str) -> str | None:
    """The layer a module of the kit belongs to; "grader" for a kata's grader, "reference" for the
    answers, None for anything else."""
    parts = name.split(".")
    if parts[0] == "reference":
        return "reference"
    if parts[0] != "graders" or len(parts) == 1:
        return None
    return parts[1] if parts[1] in LAYERS else "grader"


def problems(graph: dict[str, set[str]]) -> list[str]:
    """What breaks the layers in ``graph`` ({module: modules it imports}), one sentence each."""
    found = []
    for name, targets in sorted(graph.items()):
        layer = layer_of(name)
        for target in sorted(targets):
            to = layer_of(target)
            if to == "grader":
                found.append(f"{name} imports the kata grader {target}: plots and features get a kata's "
                             "data from its manifest or the engine, never from its grader")
            elif to == "reference":
                found.append(f"{name} imports {target}: only the oracles reach the reference, at run time, "
                             "for the kata the manifest names")
            elif layer in LAYERS and to in LAYERS and LAYERS.index(to) > LAYERS.index(layer):
                found.append(f"{name} ({layer}) imports {target} ({to}), a layer above its own")
    edges = {name: {t for t in targets if t in graph} for name, targets in graph.items()}
    found += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(edges)]
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected set of two or more modules (or a self-import)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):   # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while not members or members[-1] != node:
                members.append(stack.pop())
                on_stack.discard(members[-1])
            if len(members) > 1 or node in edges[node]:
                found.append(path_through(edges, set(members), node))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def path_through(edges, members: set[str], start: str) -> list[str]:
    """A cycle from ``start`` back to it inside ``members`` (breadth first: the shortest)."""
    paths = [[start]]
    while paths:
        path = paths.pop(0)
        for nxt in sorted(edges[path[-1]] & members):
            if nxt == start:
                return path + [start]
            if nxt not in path:
                paths.append(path + [nxt])
    raise AssertionError(f"no cycle through {start}")


@pytest.mark.parametrize("name", sorted(kit_modules()))
def test_every_module_imports(name):
    importlib.import_module(name)


def test_the_kit_keeps_its_layers_and_has_no_import_cycle():
    graph = {name: imported(name, path) for name, path in kit_modules().items()}
    assert len(graph) > 30 and sum(map(len, graph.values())) > 100, "the scan found too little to judge"
    assert problems(graph) == []


@pytest.mark.parametrize("graph, expected", [
    ({"graders.engine.runner": {"graders.practice.history"}, "graders.practice.history": set()},
     "graders.engine.runner (engine) imports graders.practice.history (practice), a layer above its own"),
    ({"graders.practice.watch": {"graders.classroom.batch"}, "graders.classroom.batch": set()},
     "graders.practice.watch (practice) imports graders.classroom.batch (classroom), a layer above its own"),
    ({"graders.practice.plots": {"graders.mha", "graders"}},
     "graders.practice.plots imports the kata grader graders.mha"),
    ({"graders.practice.interview": {"reference.softmax"}},
     "graders.practice.interview imports reference.softmax"),
    ({"graders.classroom.a": {"graders.classroom.b"}, "graders.classroom.b": {"graders.classroom.c"},
      "graders.classroom.c": {"graders.classroom.a"}},
     "import cycle: graders.classroom.a -> graders.classroom.b -> graders.classroom.c -> graders.classroom.a"),
])
def test_each_kind_of_break_is_named(graph, expected):
    found = problems(graph)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_relative_and_function_level_imports_are_seen(tmp_path):
    path = tmp_path / "runner.py"
    path.write_text("from . import bundle\nfrom ..practice.plots import PLOTS\n"
                    "def f():\n    from graders import mha\n", encoding="utf-8")
    found = imported("graders.engine.runner", path)
    assert {"graders.engine.bundle", "graders.practice.plots", "graders.mha"} <= found
