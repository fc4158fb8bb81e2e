"""The plugin's side of "a gate that cannot judge must say so": its options,
the quarantine of a profile, the coverage line at the end of the terminal
summary, and the exit status of a run that left scenarios unjudged.

The rules themselves are in :mod:`perfsuite.judge.coverage` and
:mod:`perfsuite.store.quarantine`; this module only connects them to pytest.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from perfsuite.judge.coverage import Coverage
from perfsuite.store import quarantine

ALLOW_FLAG = "--perf-allow-unjudged"
DEPRECATED_FLAG = "--perf-fail-unreliable"
QUARANTINE_KEY = pytest.StashKey[Mapping[str, quarantine.Entry]]()


class DeprecatedOptionWarning(DeprecationWarning):
    """A perfsuite option kept as an alias of today's default."""


def add_options(group: Any) -> None:
    group.addoption(
        ALLOW_FLAG,
        action="store_true",
        help="exit 0 even if selected scenarios went unjudged (unreliable, no baseline, not recorded); "
        "by default such a run fails, naming them and what fixes each",
    )
    group.addoption(
        DEPRECATED_FLAG,
        action="store_true",
        help="deprecated: an unreliable scenario already fails the run (see --perf-allow-unjudged); "
        "with this flag its own test fails too",
    )

    group.addoption(
        "--perf-contention-retries",
        metavar="N",
        type=int,
        default=2,
        help="when other processes made a measurement unreliable, wait for a quiet host and measure "
        "again, up to N times (default 2; 0: never)",
    )
    group.addoption(
        "--perf-contention-wait",
        metavar="SECONDS",
        type=float,
        default=60.0,
        help="longest wait for a quiet host per scenario (default 60)",
    )
    group.addoption(
        "--perf-contention-budget",
        metavar="SECONDS",
        type=float,
        default=300.0,
        help="longest waiting for a quiet host in the whole session (default 300), "
        "so a busy runner cannot stretch a CI job without limit",
    )


def check_options(config: pytest.Config) -> None:
    for flag in ("--perf-contention-retries", "--perf-contention-wait", "--perf-contention-budget"):
        value = config.getoption(flag)
        if not (math.isfinite(value) and value >= 0):  # nan passes every comparison, inf waits forever
            raise pytest.UsageError(f"{flag} must be a finite number >= 0, got {value}")
    if config.getoption(DEPRECATED_FLAG):
        warnings.warn(
            DeprecatedOptionWarning(
                f"{DEPRECATED_FLAG} is deprecated: a run with unreliable (unjudged) scenarios now exits "
                f"non-zero by default; {ALLOW_FLAG} opts out"
            ),
            stacklevel=1,
        )


def contention_settings(config: pytest.Config) -> dict[str, Any]:
    """The session settings (:class:`perfsuite.gate.session.RunSettings`) of the contention options."""
    return {
        "contention_retries": config.getoption("--perf-contention-retries"),
        "contention_wait_s": config.getoption("--perf-contention-wait"),
        "contention_budget_s": config.getoption("--perf-contention-budget"),
    }


def load_quarantine(config: pytest.Config, baselines_dir: Path, profile: str) -> Mapping[str, quarantine.Entry]:
    """This profile's quarantine (``baselines/<profile>/quarantine.toml``); a bad file stops the run."""
    if QUARANTINE_KEY not in config.stash:
        try:
            config.stash[QUARANTINE_KEY] = quarantine.load(baselines_dir / profile / quarantine.FILENAME)
        except quarantine.QuarantineError as exc:
            pytest.exit(f"perfsuite: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    return config.stash[QUARANTINE_KEY]


def entries_of(config: pytest.Config) -> Mapping[str, quarantine.Entry]:
    """The quarantine loaded for this run ({} before the session starts, or in a run without one)."""
    none: Mapping[str, quarantine.Entry] = {}
    return config.stash.get(QUARANTINE_KEY, none)


def quarantined(config: pytest.Config, scenario_id: str) -> quarantine.Entry | None:
    return entries_of(config).get(scenario_id)


def problems(config: pytest.Config, found: Coverage | None, today: date | None = None) -> list[str]:
    """Why this run must not be green: unjudged scenarios (unless allowed) and expired quarantines."""
    lines = quarantine.expired(entries_of(config), today or date.today())
    if found is not None and not found.ok and not config.getoption(ALLOW_FLAG):
        lines += [f"not judged, so this run fails ({ALLOW_FLAG} opts out): {found.line()}", *found.fixes()]
    return lines


def summary(terminalreporter: Any, found: Coverage, failing: list[str]) -> None:
    """The coverage line last in the terminal summary: green when it gates, red when it cannot."""
    terminalreporter.write_sep(
        "-" if found.ok else "!", f"perfsuite coverage: {found.line()}", red=not found.ok, green=found.ok
    )
    for line in failing:
        terminalreporter.write_line(line, red=True)
    for line in found.notes():
        terminalreporter.write_line(line, yellow=True)
