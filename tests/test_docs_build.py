"""The strict docs build fails on a warning.

``make docs`` is ``mkdocs build --strict``: the build aborts on any warning (a broken link or
anchor, a page missing from the nav). mkdocs' ``--quiet`` sets its logger to ERROR, so the
warnings that ``--strict`` counts were never logged and a broken link passed. This test runs the
Makefile's own ``docs`` recipe (``make -o setup docs``: the recipe as written, without setting up
a venv, with this interpreter as ``PY``) on a copy of the docs with one broken link planted, and
sees it fail naming the link. The checkout's own docs are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs_snippets import ROOT

#: What the build reads besides docs/ and mkdocs.yml: the README (the reference includes its
#: options and verdicts tables) and the package (the API reference).
READ = ("README.md", "perfsuite")
#: The planted link: a page that does not exist.
PLANTED = "no-such-page.md"


def make_docs(tree: Path) -> subprocess.CompletedProcess[str]:
    """The Makefile's ``docs`` target, run in ``tree`` as ``make docs`` runs it there."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    command = ["make", "-f", str(ROOT / "Makefile"), "-C", str(tree), "-o", "setup", f"PY={sys.executable}", "docs"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, check=False)


@pytest.mark.timeout(300)
def test_the_docs_build_fails_on_a_planted_broken_link(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    for name in READ:
        (tmp_path / name).symlink_to(ROOT / name)
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + f"\nA [page that is not there]({PLANTED}).\n")

    done = make_docs(tmp_path)

    out = done.stdout + done.stderr
    assert done.returncode != 0, f"the docs build passed with a broken link planted:\n{out[-3000:]}"
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert any(PLANTED in line for line in warnings), f"no warning names the planted link:\n{out[-3000:]}"
    assert "in strict mode" in out, out[-3000:]


def test_the_durations_the_readme_quotes_are_measured_in_the_lab_notes() -> None:
    # README quotes CI's and the gate's wall time; each figure must be one docs/lab/ measured
    # (to the precision quoted), so a new measurement that moves it makes this fail until the
    # README follows.
    readme = (ROOT / "README.md").read_text()
    quoted = re.findall(r"(\d+(?:\.\d+)?)(?: to (\d+(?:\.\d+)?))? (?:minutes|min)\b", readme)
    figures = {float(x) for q in quoted for x in q if x}
    assert figures, "README quotes no durations: this test would prove nothing"
    lab = " ".join(p.read_text() for p in (ROOT / "docs" / "lab").glob("*.md"))
    measured = [float(x) for x in re.findall(r"(\d+(?:\.\d+)?)\s*(?:min\b|minutes)", lab)]
    for figure in figures:
        digits = len(str(figure).split(".")[1]) if figure != int(figure) else 0
        assert any(round(m, digits) == figure for m in measured), f"README's {figure:g} min is in no docs/lab/ page"
