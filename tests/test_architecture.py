"""The layout's rules, checked on the import graph read from the source:

* the pytest side and the shared declarations never import torch;
* the rank side never imports the pytest side (baselines, compare, session, plugin, ...);
* engines (``strategies``) never import the ``worker`` that drives them;
* ``primitives`` is a leaf;
* no import cycle between perfsuite's packages.

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
RANK = (
    "perfsuite.worker",
    "perfsuite.strategies",
    "perfsuite.primitives",
    "perfsuite.models.build",
    "perfsuite.models.hf",
    "perfsuite.models.megatron_gpt",
    "perfsuite.models.module",
    "perfsuite.models.materialise",
)
PYTEST_SIDE = (
    "perfsuite.plugin",
    "perfsuite.session",
    "perfsuite.baselines",
    "perfsuite.compare",
    "perfsuite.report",
    "perfsuite.stats",
    "perfsuite.hookspecs",
    "perfsuite.fingerprint",
    "perfsuite.identity",
    "perfsuite.launch",
    "perfsuite.flops",
    "perfsuite.__main__",
    "perfsuite.doctor",
    "perfsuite.ceilings",
    "perfsuite.cost",
    "perfsuite.envs",
    "perfsuite.abtest",
    "perfsuite.maxbatch",
    "perfsuite.contention",
    "perfsuite.progress",
    "perfsuite.exports",
    "perfsuite.htmlreport",
    "perfsuite.bootstrap",
    "perfsuite.cliargs",
    "perfsuite.gate",
    "perfsuite.coverage",
    "perfsuite.quarantine",
    "perfsuite.definition",
    "perfsuite.options",
    "perfsuite.machine",
    "perfsuite.guards",
    "perfsuite.extras",
    "perfsuite.fitting",
    "perfsuite.trustworthy",
    "perfsuite.modes",
    "perfsuite.settings",
    "perfsuite.results",
    "perfsuite.launching",
    "perfsuite.judging",
    "perfsuite.recording",
    "perfsuite.explain",
    "perfsuite.profilestore",
    "perfsuite.profiling",
    "perfsuite.explaincmd",
    "perfsuite.revab",
    "perfsuite.simulate",
    "perfsuite.collection",
    "perfsuite.tiers",
)
Graph = Mapping[str, set[str]]


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


def side(name: str) -> str:
    if name.startswith(RANK):
        return "rank"
    if name.startswith(PYTEST_SIDE):
        return "pytest"
    return "shared"


def unit(name: str) -> str:
    """The package (or top-level module) a module belongs to."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else name


def violations(graph: Graph) -> list[str]:
    found = []
    for source, targets in graph.items():
        for target in targets:
            if target == "torch" or target.startswith("torch."):
                if side(source) != "rank":
                    found.append(f"{source} ({side(source)} side) imports torch")
            elif not target.startswith("perfsuite."):
                continue
            elif side(source) == "rank" and side(target) == "pytest":
                found.append(f"{source} (rank side) imports {target} (pytest side)")
            elif side(source) == "shared" and side(target) != "shared":
                found.append(f"{source} (shared) imports {target} ({side(target)} side)")
            elif source.startswith("perfsuite.strategies") and target.startswith("perfsuite.worker"):
                found.append(f"{source} (an engine) imports {target} (the worker that drives engines)")
            elif source == "perfsuite.primitives":
                found.append(f"perfsuite.primitives must be a leaf but imports {target}")
    return found + [f"import cycle between packages: {' -> '.join(c)}" for c in package_cycles(graph)]


def package_cycles(graph: Graph) -> list[list[str]]:
    edges: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            a, b = unit(source), unit(target)
            if target.startswith("perfsuite.") and a != b and a != "perfsuite":
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
    assert {"perfsuite.worker.train", "perfsuite.strategies.base", "perfsuite.session"} <= set(graph)
    assert violations(graph) == []


@pytest.mark.parametrize(
    ("planted", "expected"),
    [
        (
            {"perfsuite.worker.runtime": {"perfsuite.baselines"}},
            "perfsuite.worker.runtime (rank side) imports perfsuite.baselines",
        ),
        (
            {"perfsuite.strategies.ddp": {"perfsuite.worker.loop"}},
            "perfsuite.strategies.ddp (an engine) imports perfsuite.worker.loop",
        ),
        ({"perfsuite.strategies.ddp": {"perfsuite.worker.loop"}}, "import cycle between packages"),
        ({"perfsuite.compare": {"torch"}}, "perfsuite.compare (pytest side) imports torch"),
        (
            {"perfsuite.engines.base": {"perfsuite.strategies.base"}},
            "perfsuite.engines.base (shared) imports perfsuite.strategies.base",
        ),
        ({"perfsuite.primitives": {"perfsuite.protocol"}}, "perfsuite.primitives must be a leaf"),
    ],
)
def test_the_rules_catch_a_planted_violation(planted: dict[str, set[str]], expected: str) -> None:
    graph = import_graph()
    for source, targets in planted.items():
        graph[source] = graph[source] | targets
    assert any(expected in v for v in violations(graph)), violations(graph)


def test_the_pytest_process_imports_no_torch() -> None:
    code = (
        "import sys, perfsuite, perfsuite.plugin, perfsuite.__main__, perfsuite.report, perfsuite.engines.builtin;"
        "import perfsuite.workloads.train;"
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
    assert "options --> gate" in drawn and "worker --> shared" in drawn


def test_the_readme_module_table_names_every_module() -> None:
    readme = (PACKAGE.parent / "README.md").read_text()
    table = readme[readme.index("## Where things live") :].split("\n## ")[0]
    named = {name.split("/")[0] for name in re.findall(r"`([\w/]+?)(?:\.py)?/?`", table)}
    tops = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert tops - named - {"__init__"} == set(), "add them to README's 'Where things live'"
