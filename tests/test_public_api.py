"""What a team writes imports only ``perfsuite``: the scenario files, the example team repository,
the files ``init`` writes and the docs' Python snippets name nothing inside the package's layers,
so moving a layer (``spec/`` became ``core/``) breaks none of them."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import perfsuite

ROOT = Path(__file__).resolve().parents[1]
#: What teams copy from: every Python file under these, and the Python blocks of the guides.
WRITTEN_BY_TEAMS = ("bench_tests", "examples", "perfsuite/commands/init/templates")
GUIDES = ("README.md", "docs/guide", "docs/reference", "docs/index.md", "docs/trust.md")


def sources() -> Iterator[tuple[str, str]]:
    for folder in WRITTEN_BY_TEAMS:
        for path in sorted((ROOT / folder).rglob("*.py*")):
            if path.suffix in (".py", ".tmpl"):
                yield str(path.relative_to(ROOT)), path.read_text()
    for place in GUIDES:
        path = ROOT / place
        for page in sorted(path.rglob("*.md")) if path.is_dir() else [path]:
            for n, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
                yield f"{page.relative_to(ROOT)} python block {n + 1}", block


def perfsuite_imports(text: str) -> Iterator[tuple[str, list[str]]]:
    """Each ``perfsuite`` import: the module and the names taken from it."""
    try:
        tree = ast.parse(text)
    except SyntaxError:  # a template's placeholders or a snippet's ellipsis: read its import lines alone
        lines = [
            line.strip()
            for line in text.splitlines()
            if line.strip().startswith(("from perfsuite", "import perfsuite"))
        ]
        tree = ast.parse("\n".join(line for line in lines if not line.endswith("(")))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "perfsuite":
            yield node.module or "", [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            yield from ((alias.name, []) for alias in node.names if alias.name.split(".")[0] == "perfsuite")


def test_what_teams_write_imports_only_the_public_api() -> None:
    found = {where: list(perfsuite_imports(text)) for where, text in sources()}
    assert sum(len(imports) for imports in found.values()) >= 15  # the scan reads what it should
    inside = {where: module for where, imports in found.items() for module, _ in imports if module != "perfsuite"}
    assert inside == {}, "import these names from perfsuite (add them to perfsuite.__all__ if missing)"
    taken = {(where, name) for where, imports in found.items() for _, names in imports for name in names}
    missing = {where: name for where, name in taken if name not in perfsuite.__all__}
    assert missing == {}


@pytest.mark.parametrize("name", perfsuite.__all__)
def test_every_public_name_resolves(name: str) -> None:
    if name == "Recipe":  # resolved lazily: it needs torch, which the pytest process never imports
        pytest.skip("Recipe is resolved in a rank (tests/test_custom_module.py builds one)")
    assert getattr(perfsuite, name) is not None
