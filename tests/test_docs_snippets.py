"""The docs stay true: every shell command README.md and docs/ show either runs
here, or says in the page source why it does not.

The convention, for README.md and every page under docs/ (except
docs/gpu-runs/, the committed reports of past runs, kept as they were written):

* every fenced block names its language, so a command cannot hide in an
  untagged block; output and log lines are ``text``;
* a block tagged ``sh`` (or ``bash``, ``shell``, ``console``) is run by
  :func:`test_shell_snippet`, unless the line before it (blank lines aside) is
  the HTML comment ``<!-- not-run: REASON -->``. Mark a block not-run when it
  takes longer than about 30 s on cpu (``make bench``, ``make test``,
  ``make env-ort``, selftests, a bootstrap with a real budget), needs a GPU,
  the network or a second environment; the reason says which. Such a block's
  test is skipped with ``not run: REASON``, so ``pytest -rs`` lists them all.

A run block runs as one bash script (``set -euo pipefail``) and must exit 0
within :data:`LIMIT_S`. It runs in a scratch folder that links the checkout's
``bench_tests``, ``baselines``, ``docs`` and
``pyproject.toml``, so what a command writes (a report, pytest's caches)
lands there, with ``python`` and ``pytest`` being this interpreter and this
checkout's ``perfsuite`` first on the import path. The blocks run today take
about 15 s in all (``--help``, ``doctor --no-smoke``, ``bootstrap
--dry-run``, ``summary`` and ``report`` on a committed results file): CI's
budget is 15 minutes, so keep the run blocks to seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SHELL = {"sh", "bash", "shell", "console"}
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<reason>.*?)\s*-->$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
#: What the scratch folder links from the checkout.
LINKED = ("bench_tests", "baselines", "docs", "pyproject.toml")
LIMIT_S = 60


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason, when marked not-run

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    pages = sorted(p for p in (ROOT / "docs").rglob("*.md") if "gpu-runs" not in p.relative_to(ROOT / "docs").parts)
    return [ROOT / "README.md", *pages]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one markdown file, with the not-run reason before each."""
    lines = path.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start = m.group("fence"), i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines))
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.match(before)
        code = "\n".join(line[len(m.group("indent")) :] for line in lines[start + 1 : end])
        found.append(Block(path, start + 1, m.group("lang").lower(), code, marker.group("reason") if marker else None))
        i = end + 1
    return found


ALL = [b for path in doc_files() for b in blocks(path)]
SHELL_BLOCKS = [b for b in ALL if b.lang in SHELL]


def test_every_fenced_block_names_its_language() -> None:
    untagged = [b.id for b in ALL if not b.lang]
    assert not untagged, f"fenced blocks without a language (commands are sh, output is text): {untagged}"


def test_every_not_run_marker_gives_a_reason_and_precedes_a_shell_block() -> None:
    assert SHELL_BLOCKS, "no shell blocks found: is the parser broken?"
    assert not [b.id for b in SHELL_BLOCKS if b.not_run is not None and not b.not_run], "not-run without a reason"
    marked = sum(len(NOT_RUN.findall(line.strip())) for p in doc_files() for line in p.read_text().split("\n"))
    assert marked == sum(b.not_run is not None for b in SHELL_BLOCKS), "a not-run marker that precedes no shell block"
    assert any(b.not_run is None for b in SHELL_BLOCKS), "nothing the docs show is run"


def test_the_parser_reads_the_convention(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- not-run: needs a GPU -->\n\n```sh\nmake bench\n```\n\n```sh\necho hi\n```\n\n```\nout\n```\n"
    )
    found = blocks(page)
    assert [(b.line, b.lang, b.code, b.not_run) for b in found] == [
        (5, "sh", "make bench", "needs a GPU"),
        (9, "sh", "echo hi", None),
        (13, "", "out", None),
    ]


def scratch(tmp_path: Path) -> Path:
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


@pytest.mark.timeout(LIMIT_S + 30)
@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=[b.id for b in SHELL_BLOCKS])
def test_shell_snippet(block: Block, tmp_path: Path) -> None:
    if block.not_run is not None:
        pytest.skip(f"not run ({block.id}): {block.not_run}")
    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("PYTEST_ADDOPTS", None)
    script = "set -euo pipefail\n" + block.code + "\n"
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", script], cwd=scratch(tmp_path), env=env, capture_output=True, text=True, timeout=LIMIT_S
    )
    took = time.monotonic() - started
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}:\n{block.code}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert took < LIMIT_S / 2, f"{block.id} took {took:.0f} s: mark it not-run with the reason, or make it shorter"
