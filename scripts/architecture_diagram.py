"""Print the mermaid diagram of who imports whom in perfsuite (docs/design/architecture.md).

The graph is read from the source by the same code as tests/test_architecture.py
(every import, function bodies too); a package stands for its modules, and the
torch-free declarations both sides share are one box. The docs hold exactly
this output (tests/test_architecture.py checks it), so after a change in the
imports run:

    python scripts/architecture_diagram.py --write
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "design" / "architecture.md"
#: Top-level modules and packages whose declarations both sides use: one box.
SHARED = ("engines", "files", "layout", "metrics", "models", "nvmlcodes", "processor", "profiles", "protocol", "relations",
          "validation", "workloads")  # fmt: skip
#: Rank-side nodes besides whole packages.
RANK_NODES = {
    "models.build": "modelbuild",
    "models.hf": "modelbuild",
    "models.megatron_gpt": "modelbuild",
    "models.materialise": "modelbuild",
}
RANK = ("modelbuild", "primitives", "strategies/", "worker/")
ENTRY = {"plugin": "plugin (pytest11)", "__main__": "__main__ (CLI)", "": "perfsuite (public API)"}
ENTRY_IDS = {"plugin": "plugin", "__main__": "cli", "": "api"}


def node(module: str) -> str:
    """The diagram node of a ``perfsuite.*`` module."""
    rest = module.removeprefix("perfsuite").removeprefix(".")
    if rest in ENTRY:
        return ENTRY_IDS[rest]
    for prefix, name in RANK_NODES.items():
        if rest == prefix:
            return name
    top = rest.split(".")[0]
    if top in SHARED:
        return "shared"
    is_package = (ROOT / "perfsuite" / top).is_dir()
    return f"{top}/" if is_package else top


def ident(name: str) -> str:
    return name.rstrip("/").replace("/", "")


def edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    found = set()
    for source, targets in graph.items():
        for target in targets:
            if target.startswith("perfsuite"):
                a, b = node(source), node(target)
                if a != b and b not in ENTRY_IDS.values():
                    found.add((a, b))
    return found


def diagram(graph: dict[str, set[str]]) -> str:
    nodes = {node(m) for m in graph}
    pytest_side = sorted(n for n in nodes if n not in {*ENTRY_IDS.values(), "shared", *RANK})
    shared = sorted({m.removeprefix("perfsuite.").split(".")[0] for m in graph if node(m) == "shared"})
    shared_label = ", ".join(f"{s}/" if (ROOT / "perfsuite" / s).is_dir() else s for s in shared)
    lines = ["```mermaid", "flowchart LR", '  subgraph entry["entry points"]']
    lines += [f'    {ENTRY_IDS[k]}["{v}"]' for k, v in ENTRY.items()]
    lines += ["  end", '  subgraph pytestside["pytest process: torch-free"]']
    lines += [f'    {ident(n)}["{n}"]' for n in pytest_side]
    lines += [
        "  end",
        f'  shared["shared declarations, torch-free:<br/>{shared_label}"]',
        '  subgraph rank["ranks: torch"]',
    ]
    labels = {"modelbuild": "models/build, hf, megatron_gpt, materialise"}
    lines += [f'    {ident(n)}["{labels.get(n, n)}"]' for n in RANK]
    lines += ["  end"]
    lines += [f"  {ident(a)} --> {ident(b)}" for a, b in sorted(edges(graph), key=lambda e: (ident(e[0]), ident(e[1])))]
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
