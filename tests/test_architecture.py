"""The layout's rules, checked on the import graph read from the source. Each folder of
``perfsuite/`` is a layer, and may import only the folders below it:

* ``core/``: torch-free declarations both sides share; imports only ``core/``;
* ``rank/``: inside a torchrun worker; ``core/`` (and torch);
* ``launch/``, ``store/``: starting ranks and knowing the machine; what is kept between runs: ``core/``;
* ``judge/``: what a measurement says: ``store/``, ``launch/``, ``core/``;
* ``gate/``: one scenario's life: ``judge/`` and below;
* ``reports/``: what a run leaves: ``judge/`` and below;
* ``plugin/``: pytest's side: ``reports/``, ``gate/`` and below;
* ``commands/`` (and ``__main__``): everything but ``rank/``;
* ``perfsuite/__init__.py`` (the public API): ``core/``, and ``Recipe`` from ``rank/`` lazily (it
  imports torch, so only a team's model module in a rank resolves it).

Only ``rank/`` imports torch; engines (``rank/strategies``) never import the worker that drives
them; ``rank/primitives`` is a leaf; no import cycle between packages. No import hides from
this: the graph is every ``import`` statement, function bodies too.

The rules are a function of the graph, so a test can also show that they
catch a planted violation.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import perfsuite

PACKAGE = Path(perfsuite.__file__).parent
#: Each folder, and the folders it may import (itself included).
ALLOWED: Mapping[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "rank": frozenset({"rank", "core"}),
    "launch": frozenset({"launch", "core"}),
    "store": frozenset({"store", "core"}),
    "judge": frozenset({"judge", "store", "launch", "core"}),
    "gate": frozenset({"gate", "judge", "store", "launch", "core"}),
    "reports": frozenset({"reports", "judge", "store", "launch", "core"}),
    "plugin": frozenset({"plugin", "reports", "gate", "judge", "store", "launch", "core"}),
    "commands": frozenset({"commands", "plugin", "reports", "gate", "judge", "store", "launch", "core"}),
}
#: The one import across the layers: the public API's lazy ``Recipe`` (see the module docstring).
LAZY_API = ("perfsuite", "perfsuite.rank.models.module")
Graph = Mapping[str, set[str]]


def folder(module: str) -> str:
    """The layer a ``perfsuite`` module belongs to (the package root is the public API, ``core``'s face)."""
    if module == "perfsuite":
        return "core"
    if module == "perfsuite.__main__":
        return "commands"
    return module.split(".")[1]


def module_names() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path, name: str, modules: Iterable[str]) -> set[str]:
    """Every module ``name`` imports (anywhere in the file, function bodies too)."""
    known = set(modules)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports(path, name, modules) for name, path in modules.items()}


def unit(name: str) -> str:
    """The package a module belongs to (``perfsuite.rank.worker``); a module of a folder itself is its own
    unit (the folders' layering above already keeps cycles out between folders)."""
    parts = name.split(".")
    if len(parts) > 3 and (PACKAGE / parts[1] / parts[2] / "__init__.py").is_file():
        return ".".join(parts[:3])
    return name


def violations(graph: Graph) -> list[str]:
    found = []
    for source, targets in graph.items():
        for target in targets:
            if target == "torch" or target.startswith("torch."):
                if folder(source) != "rank":
                    found.append(f"{source} ({folder(source)}/) imports torch")
            elif not target.startswith("perfsuite.") or (source, target) == LAZY_API:
                continue
            elif folder(target) not in ALLOWED[folder(source)]:
                found.append(f"{source} ({folder(source)}/) imports {target} ({folder(target)}/)")
            elif source.startswith("perfsuite.rank.strategies") and target.startswith("perfsuite.rank.worker"):
                found.append(f"{source} (an engine) imports {target} (the worker that drives engines)")
            elif source == "perfsuite.rank.primitives":
                found.append(f"perfsuite.rank.primitives must be a leaf but imports {target}")
    return found + [f"import cycle between packages: {' -> '.join(c)}" for c in package_cycles(graph)]


def package_cycles(graph: Graph) -> list[list[str]]:
    edges: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            a, b = unit(source), unit(target)
            if target.startswith("perfsuite.") and a != b and a != "perfsuite" and (source, target) != LAZY_API:
                edges.setdefault(a, set()).add(b)
    cycles, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycles.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for start in sorted(edges):
        visit(start, [])
    return cycles


def test_the_real_import_graph_follows_the_rules() -> None:
    graph = import_graph()
    assert {"perfsuite.rank.worker.train", "perfsuite.rank.strategies.base", "perfsuite.gate.session"} <= set(graph)
    assert violations(graph) == []


@pytest.mark.parametrize(
    ("planted", "expected"),
    [
        (
            {"perfsuite.rank.worker.runtime": {"perfsuite.gate.session"}},
            "perfsuite.rank.worker.runtime (rank/) imports perfsuite.gate.session (gate/)",
        ),
        (
            {"perfsuite.rank.worker.runtime": {"perfsuite.store.baselines"}},
            "perfsuite.rank.worker.runtime (rank/) imports perfsuite.store.baselines (store/)",
        ),
        ({"perfsuite.core.metrics": {"torch"}}, "perfsuite.core.metrics (core/) imports torch"),
        ({"perfsuite.judge.compare": {"torch"}}, "perfsuite.judge.compare (judge/) imports torch"),
        (
            {"perfsuite.core.engines.base": {"perfsuite.rank.strategies.base"}},
            "perfsuite.core.engines.base (core/) imports perfsuite.rank.strategies.base (rank/)",
        ),
        (
            {"perfsuite.judge.compare": {"perfsuite.gate.session"}},
            "perfsuite.judge.compare (judge/) imports perfsuite.gate.session (gate/)",
        ),
        (
            {"perfsuite.rank.strategies.ddp": {"perfsuite.rank.worker.loop"}},
            "perfsuite.rank.strategies.ddp (an engine) imports perfsuite.rank.worker.loop",
        ),
        ({"perfsuite.rank.strategies.ddp": {"perfsuite.rank.worker.loop"}}, "import cycle between packages"),
        ({"perfsuite.rank.primitives": {"perfsuite.core.protocol"}}, "perfsuite.rank.primitives must be a leaf"),
        ({"perfsuite.core.metrics": {"perfsuite.rank.models.module"}}, "perfsuite.core.metrics (core/) imports"),
    ],
)
def test_the_rules_catch_a_planted_violation(planted: dict[str, set[str]], expected: str) -> None:
    graph = import_graph()
    for source, targets in planted.items():
        graph[source] = graph[source] | targets
    assert any(expected in v for v in violations(graph)), violations(graph)


def test_the_pytest_process_imports_no_torch() -> None:
    code = (
        "import sys, perfsuite, perfsuite.plugin.hooks, perfsuite.__main__, perfsuite.reports.summary, perfsuite.core.engines.builtin;"
        "import perfsuite.core.workloads.train;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'deepspeed'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_docs_diagram_is_the_real_import_graph() -> None:
    # docs/design/architecture.md holds exactly what the generator draws from the source.
    sys.path.insert(0, str(PACKAGE.parent / "scripts"))
    import architecture_diagram

    drawn = architecture_diagram.current(architecture_diagram.DOC.read_text())
    assert drawn == architecture_diagram.diagram(import_graph()), (
        "the diagram is out of date: python scripts/architecture_diagram.py --write"
    )
    assert "plugin --> gate" in drawn and "rank --> core" in drawn and "rank --> gate" not in drawn


def test_the_top_level_holds_only_the_folders_and_the_two_entry_modules() -> None:
    modules = {p.name for p in PACKAGE.glob("*.py")}
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert modules == {"__init__.py", "__main__.py"}
    assert folders == set(ALLOWED)


def test_the_readme_module_table_has_a_row_per_folder() -> None:
    readme = (PACKAGE.parent / "README.md").read_text()
    table = readme[readme.index("## Where things live") :].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [re.match(r"\| `(\w+)/`", row).group(1) for row in rows if re.match(r"\| `(\w+)/`", row)] == list(ALLOWED)


def test_what_users_copy_imports_only_from_perfsuite_itself() -> None:
    # Module paths below `perfsuite` are internal and may move: the docs, examples/ and the init
    # templates a team copies name only the public API (`from perfsuite import Recipe, HardwareProfile`).
    root = PACKAGE.parent
    copied = [*root.glob("examples/**/*.py"), *PACKAGE.glob("commands/init/templates/*.tmpl"), root / "README.md"]
    copied += [p for p in root.glob("docs/**/*.md") if "lab" not in p.parts and "gpu-runs" not in p.parts]
    deep = [
        f"{p.relative_to(root)}: {line.strip()}"
        for p in copied
        for line in p.read_text().splitlines()
        if re.search(r"^\s*(from perfsuite\.\w|import perfsuite\.\w)", line)
    ]
    assert deep == []
