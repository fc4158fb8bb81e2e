"""perfsuite's extras are defined in pyproject.toml only (issue 27). Its groups
(``engines``, ``gpu``, ``dev``) name other extras (``perfsuite[a,b]``), never
packages. Every caller names the extras it installs: the Makefile's EXTRAS
and KIT_EXTRAS, CI's EXTRAS, scripts/wheelhouse.py's default, the install
hints of engines and commands, the docs. These tests fail when one of them
names an extra pyproject.toml lacks, spells out a group's members instead of
naming the group, or when a package is listed in two extras; and when the
table of extras in docs/guide/getting-started.md disagrees with pyproject.toml."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from perfsuite.core.engines import ENGINES

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import wheelhouse  # noqa: E402

PROJECT = "perfsuite"
TABLE = ROOT / "docs" / "guide" / "getting-started.md"
#: Extras written out in a ``perfsuite[a,b]`` hint or a ``pip install -e '.[a,b]'`` (not ``perfsuite[EXTRAS]``).
HINT = re.compile(r"(?:\bperfsuite|['\"]\.)\[([a-z0-9_,-]+)\]")
#: ``EXTRAS=a,b`` (make, shell), ``EXTRAS: a,b`` (a workflow's env), ``--extras a,b``; not ``$(KIT_EXTRAS)``.
ASSIGNED = re.compile(r"(?:\b\w*EXTRAS(?:[ \t]*\?=[ \t]*|=|:[ \t]+)|--extras[ =])([a-z0-9_,-]+)")
#: ``require("module", "extra")`` in a strategy: the extra its ImportError names.
REQUIRE = re.compile(r'\brequire\(\s*"[^"]+",\s*"([^"]+)"\s*\)')


def optional_dependencies() -> dict[str, list[Requirement]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        table = tomllib.load(f)["project"]["optional-dependencies"]
    return {name: [Requirement(spec) for spec in specs] for name, specs in table.items()}


EXTRAS = optional_dependencies()


def members(extra: str) -> set[str]:
    """The extras a group names (``perfsuite[a,b]``); empty for an extra that lists packages only."""
    return {e for req in EXTRAS[extra] if canonicalize_name(req.name) == PROJECT for e in req.extras}


def expanded(names: set[str]) -> set[str]:
    """``names`` and every extra they name, however deep."""
    done: set[str] = set()
    todo = set(names)
    while todo:
        name = todo.pop()
        done.add(name)
        todo |= members(name) - done if name in EXTRAS else set()
    return done


#: Extras that name other extras, and those that name nothing else (``engines``, ``gpu``, ``dev``; not ``test``).
GROUPS = {name: members(name) for name in EXTRAS if members(name)}
PURE = {name for name in GROUPS if all(canonicalize_name(r.name) == PROJECT for r in EXTRAS[name])}


def sources() -> list[Path]:
    """Where an extra may be named: code, scripts, build files, workflows and docs (not the lab's and the
    GPU runs' records, kept as they were written; pyproject.toml's groups have a test of their own)."""
    docs = [p for p in (ROOT / "docs").rglob("*.md") if not {"lab", "gpu-runs"} & set(p.relative_to(ROOT).parts)]
    return sorted(
        [
            *(ROOT / "perfsuite").rglob("*.py"),
            *(ROOT / "scripts").glob("*.py"),
            *(ROOT / "scripts").glob("*.sh"),
            *(ROOT / ".github" / "workflows").glob("*.yml"),
            ROOT / "Makefile",
            ROOT / "README.md",
            ROOT / "CONTRIBUTING.md",
            *docs,
        ]
    )


def named_lists() -> list[tuple[str, list[str]]]:
    """Every list of extras written out in the checkout: (where, the names), in file order."""
    found: list[tuple[str, list[str]]] = []
    for path in sources():
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        for pattern in (HINT, ASSIGNED, REQUIRE):
            for m in pattern.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                found.append((f"{where}:{line}", [n for n in m[1].split(",") if n]))
    found.append(("scripts/wheelhouse.py EXTRAS", wheelhouse.EXTRAS.split(",")))
    for spec in ENGINES:
        if spec.extra and spec.implementation.startswith("perfsuite."):
            found.append((f"engine {spec.name}'s extra", [spec.extra]))
    return found


def makefile_default(variable: str) -> list[str]:
    found = re.search(rf"^{variable} \?= (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, f"the Makefile sets no {variable}"
    return found[1].split(",")


def test_the_callers_are_found() -> None:
    """The scan sees the callers the issue names, so a test that passes is not one that looked nowhere."""
    where = {w.split(":")[0] for w, _ in named_lists()}
    callers = {"Makefile", ".github/workflows/ci.yml", "scripts/wheelhouse.py EXTRAS", "engine deepspeed_zero's extra"}
    hints = {"perfsuite/rank/strategies/deepspeed_zero.py", "perfsuite/commands/report.py", "docs/guide/air-gapped.md"}
    assert callers | hints <= where


@pytest.mark.parametrize(("where", "names"), named_lists(), ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_every_extra_named_is_defined_in_pyproject(where: str, names: list[str]) -> None:
    unknown = [n for n in names if n not in EXTRAS]
    assert not unknown, f"{where} names {unknown}, which pyproject.toml's extras lack: {sorted(EXTRAS)}"


@pytest.mark.parametrize(("where", "names"), named_lists(), ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_no_list_spells_out_a_group(where: str, names: list[str]) -> None:
    for group in PURE:
        wanted = GROUPS[group]
        assert not (len(names) > 1 and wanted <= set(names)), f"{where}: {names} spells out {group}: name {group!r}"
    named = set(names)
    for name in named & set(GROUPS):
        twice = (expanded({name}) - {name}) & named
        assert not twice, f"{where}: {sorted(twice)} already come with {name!r}"


def test_groups_name_extras_and_no_package_is_listed_twice() -> None:
    for group, wanted in GROUPS.items():
        assert wanted <= set(EXTRAS), f"group {group} names {sorted(wanted - set(EXTRAS))}, not extras"
        for other in PURE - {group}:
            its = GROUPS[other]
            assert not (its <= wanted and len(its) > 1), f"group {group} spells out {other}: name {other!r}"
        inherited = set().union(*(expanded({m}) - {m} for m in wanted & set(GROUPS)))
        assert not inherited & wanted, f"group {group} names {sorted(inherited & wanted)}, which its groups bring"
    assert {"engines", "gpu", "dev"} <= PURE, "the groups the callers name"
    listed_in: dict[str, list[str]] = {}
    for extra, specs in EXTRAS.items():
        for req in specs:
            if canonicalize_name(req.name) != PROJECT:
                listed_in.setdefault(canonicalize_name(req.name), []).append(extra)
    twice = {name: extras for name, extras in listed_in.items() if len(extras) > 1}
    assert not twice, f"listed in more than one extra (name the extra instead): {twice}"


def test_the_wheelhouse_collects_what_make_setup_installs_and_ci_adds_to_it() -> None:
    setup = makefile_default("EXTRAS")
    assert wheelhouse.EXTRAS.split(",") == setup
    (ci,) = re.findall(r"^\s*EXTRAS: (\S+)$", (ROOT / ".github" / "workflows" / "ci.yml").read_text(), re.MULTILINE)
    assert set(setup) <= set(ci.split(",")), "CI runs `make test`: it installs the Makefile's default and more"
    assert set(makefile_default("KIT_EXTRAS")) <= set(EXTRAS)


def table() -> dict[str, str]:
    """extra -> its row's description, from the table under "## Extras"."""
    text = TABLE.read_text()
    section = text.split("\n## Extras\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([a-z0-9_-]+)` \| (.+?) \|$", section, re.MULTILINE))


def backticked(cell: str, before: str) -> set[str]:
    """The `names` listed at the start of ``cell``, after ``before``, up to the first word that is not one."""
    found = re.match(rf"{before}((?:`[a-z0-9_-]+`(?:, | and )?)+)", cell)
    return set(re.findall(r"`([a-z0-9_-]+)`", found[1])) if found else set()


def test_the_docs_table_lists_every_extra_and_each_groups_members() -> None:
    rows = table()
    assert set(rows) == set(EXTRAS), f"the table of extras: {sorted(rows)}, pyproject.toml: {sorted(EXTRAS)}"
    for group, wanted in GROUPS.items():
        assert backticked(rows[group], "") == wanted, f"{group}'s row: {rows[group]!r}, pyproject: {sorted(wanted)}"


def test_the_docs_table_names_the_engines_each_extra_installs() -> None:
    rows = table()
    by_extra: dict[str, set[str]] = {}
    for spec in ENGINES:
        if spec.extra and spec.implementation.startswith("perfsuite."):
            by_extra.setdefault(spec.extra, set()).add(spec.name)
    for extra, row in rows.items():
        if extra in GROUPS:
            continue
        assert backticked(row, "engines? ") == by_extra.get(extra, set()), f"{extra}'s row: {row!r}"


@pytest.mark.parametrize(
    ("extras", "python", "engines"),
    [
        ("dev", "3.11", {"deepspeed", "fairscale"}),
        ("gpu", "3.12", {"deepspeed", "fairscale", "megatron-core"}),
        ("gpu", "3.11", {"deepspeed", "fairscale"}),  # megatron-core needs Python 3.12
        ("report,docs", "3.12", set()),
    ],
)
def test_the_wheelhouse_builds_the_source_only_engines_its_extras_reach(
    extras: str, python: str, engines: set[str]
) -> None:
    """What scripts/wheelhouse.py builds from sources, from perfsuite's Requires-Dist as setuptools writes
    pyproject.toml's extras (``spec; extra == "name"``), groups followed."""
    requires = [Requirement("torch>=2.4"), Requirement("tomli>=2.0; python_version < '3.11'")]
    for name, specs in EXTRAS.items():
        for req in specs:
            marker = f"({req.marker}) and extra == {name!r}" if req.marker else f"extra == {name!r}"
            requires.append(Requirement(f"{str(req).split(';')[0]}; {marker}"))
    env = wheelhouse.target_environment(python, "manylinux_2_28_x86_64")
    reached = {canonicalize_name(r.name) for r in wheelhouse.required(PROJECT, requires, extras.split(","), env)}
    assert reached & {*wheelhouse.SOURCE_ONLY, "megatron-core"} == engines
    assert "torch" in reached and PROJECT not in reached
