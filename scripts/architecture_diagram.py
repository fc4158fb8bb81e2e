"""Print the mermaid diagram of perfsuite's folders and who imports whom (docs/design/architecture.md).

The graph is read from the source by the same code as tests/test_architecture.py
(every import, function bodies too); a folder of ``perfsuite/`` stands for its
modules, and the two entry modules stand apart. The docs hold exactly this
output (tests/test_architecture.py checks it), so after a change in the imports
run:

    python scripts/architecture_diagram.py --write
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "design" / "architecture.md"
#: The entry modules, each a node of its own.
ENTRY = {"perfsuite": ("api", "perfsuite (public API)"), "perfsuite.__main__": ("cli", "__main__ (CLI)")}
#: The folders outside the pytest process's box: the ranks', and what both sides share.
RANK, SHARED = "rank", "core"
#: The one arrow across the layers: the public API's Recipe, resolved in a rank only.
LAZY = ("api", RANK)


def node(module: str) -> str:
    """The diagram node of a ``perfsuite`` module: its entry node, else its folder."""
    if module in ENTRY:
        return ENTRY[module][0]
    return module.split(".")[1]


def edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    found = set()
    for source, targets in graph.items():
        for target in targets:
            if target.startswith("perfsuite"):
                a, b = node(source), node(target)
                if a != b:
                    found.add((a, b))
    return found


def diagram(graph: dict[str, set[str]]) -> str:
    folders = sorted({node(m) for m in graph} - {n for n, _ in ENTRY.values()} - {RANK, SHARED})
    lines = ["```mermaid", "flowchart TB", '  subgraph entry["entry points"]']
    lines += [f'    {ident}["{label}"]' for ident, label in ENTRY.values()]
    lines += ["  end", '  subgraph pytestside["pytest process: torch-free"]']
    lines += [f'    {name}["{name}/"]' for name in folders]
    lines += ["  end", '  subgraph ranks["ranks: torch"]', f'    {RANK}["{RANK}/"]', "  end"]
    lines += [f'  {SHARED}["{SHARED}/: shared, torch-free"]']
    lines += [
        f"  {a} -.->|Recipe, lazily| {b}" if (a, b) == LAZY else f"  {a} --> {b}" for a, b in sorted(edges(graph))
    ]
    return "\n".join([*lines, "```"])


def current(text: str) -> str:
    found = re.search(r"```mermaid\n.*?\n```", text, re.S)
    return found.group(0) if found else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"replace the diagram in {DOC.relative_to(ROOT)}")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from test_architecture import import_graph  # type: ignore[import-not-found]  # the graph the layer rules use

    text = diagram(import_graph())
    if args.write:
        DOC.write_text(DOC.read_text().replace(current(DOC.read_text()), text))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
