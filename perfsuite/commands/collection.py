"""The suite as a pytest run would see it, without running it: the selected scenarios with
their node ids, and this machine's profile after the repository's conftest hooks
(``pytest_perfsuite_profiles``, ``pytest_perfsuite_hardware_key``) have spoken.

``doctor``, ``bootstrap`` and ``python -m perfsuite profile`` all read the machine through one
``pytest --collect-only``, so a team's own profile is the one every command uses, exactly as
the gate picks it (:func:`perfsuite.plugin.machine.profile`). Pytest side, torch-free.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from perfsuite.core.profiles import HardwareProfile
from perfsuite.core.workloads import BaseScenario
from perfsuite.plugin import machine


@dataclass(eq=False)  # a pytest plugin: pluggy keeps plugins in sets, so it must hash by identity
class Collected:
    """What one collection found. ``profile`` is None when it could not be chosen (``problem`` says why)."""

    scenarios: dict[str, BaseScenario] = field(default_factory=dict)
    nodeids: dict[str, str] = field(default_factory=dict)
    errors: int = 0  # modules that failed to collect
    profile: HardwareProfile | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    problem: str = ""

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self.errors += report.failed

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # After -k/-m deselection (collection_modifyitems hooks may run before it), and after
        # every conftest below the paths has registered its hooks.
        for item in session.items:
            callspec = getattr(item, "callspec", None)
            scenario = callspec.params.get("scenario") if callspec else None
            if isinstance(scenario, BaseScenario):
                self.scenarios[scenario.id] = scenario
                self.nodeids[scenario.id] = item.nodeid
        try:
            self.profile = machine.profile(session.config)
        except pytest.UsageError as exc:
            self.problem = str(exc)
        self.fingerprint = machine.fingerprint(session.config)

    def with_nodeids(self) -> list[tuple[BaseScenario, str]]:
        """Each scenario with the pytest node id that runs exactly it."""
        return [(s, self.nodeids[i]) for i, s in self.scenarios.items()]


def collect(paths: Sequence[str], keyword: str | None = None, profile: str | None = None) -> Collected:
    """``pytest --collect-only`` over ``paths`` (``-k keyword``, ``--perf-profile profile``)."""
    found = Collected()
    args = [*paths, "--collect-only", "-qq", "-p", "no:cacheprovider", *(["-k", keyword] if keyword else [])]
    args += [f"--perf-profile={profile}"] if profile else []
    errors = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        code = pytest.main(args, plugins=[found])
    if code == pytest.ExitCode.USAGE_ERROR and not found.problem:
        said = " ".join(line.removeprefix("ERROR: ") for line in errors.getvalue().split("\n") if line.strip())
        found.problem = said or f"pytest refused {' '.join(args)} (usage error): run it to see why"
    if code == pytest.ExitCode.INTERNAL_ERROR:  # what it found is not to be trusted
        found.profile = None
        found.problem = f"pytest {' '.join(args)} failed inside pytest: {errors.getvalue().strip()[-800:]}"
    return found


def tiers_of(paths: Sequence[str]) -> dict[str, str]:
    """Each collected scenario's tier (``--perf-tier``), by id; {} where nothing was collected."""
    return {scenario_id: scenario.tier for scenario_id, scenario in collect(paths).scenarios.items()}


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "profile", help="print this machine's profile as the gate picks it (after the repository's conftest hooks)"
    )
    parser.add_argument("paths", nargs="*", default=["bench_tests"], help="test paths (default bench_tests)")
    parser.add_argument("--perf-profile", dest="profile", help="a profile name to check instead of detecting one")


def run(ns: Any) -> int:
    """Prints the profile's name alone on stdout (for ``profile=$(python -m perfsuite profile)``); 2 if none."""
    found = collect(ns.paths, None, ns.profile)
    if found.profile is None:
        print(f"perfsuite profile: {found.problem}", file=sys.stderr)
        return 2
    if found.errors:
        print(
            f"perfsuite profile: {found.errors} module(s) of {' '.join(ns.paths)} failed to collect, so their "
            f"hooks may be missing: run pytest --collect-only {' '.join(ns.paths)}",
            file=sys.stderr,
        )
        return 2
    print(found.profile.name)
    return 0
