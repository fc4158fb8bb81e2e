"""What a run mode is: the small interface the plugin drives.

A pytest run of perfsuite scenarios does exactly one thing with them: judge
them against baselines (the default), search their largest micro-batch, or
A/B two environments. Each is a :class:`Mode`. The plugin picks one in
``pytest_configure`` (:func:`perfsuite.plugin.modes.pick`) and from then on only
calls this interface, so a new mode is one module plus one registration line
in :mod:`perfsuite.plugin.modes`, and the plugin never asks which mode it is in.

A mode holds its own results (the baseline mode's are the session's, which
relations share); nothing else keeps them. Pytest side, torch-free.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from perfsuite.core.relations import Relation, RelationOutcome
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.judge.coverage import Outcome

if TYPE_CHECKING:
    from perfsuite.gate.session import PerfSession


class Mode(ABC):
    """One way of running the selected scenarios."""

    flag: ClassVar[str | None] = None
    """The option that selects this mode (None: the default mode)."""
    incompatible: ClassVar[Sequence[str]] = ()
    """Flags this mode cannot run with; naming one beside :attr:`flag` is a usage error."""
    why_incompatible: ClassVar[str] = ""
    """Why, in the words of that usage error."""
    reads_baselines: ClassVar[bool] = True
    """Whether a run in this mode judges against the baselines folder (so it must exist)."""
    no_relations: ClassVar[str] = ""
    """Why relations are not checked in this mode ("": they are)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    # -- options -----------------------------------------------------------------
    @classmethod
    def add_options(cls, group: Any) -> None:
        """Declare this mode's own options in the perfsuite group (the default mode has none)."""
        return None

    @classmethod
    def selected(cls, config: pytest.Config) -> bool:
        return cls.flag is not None and bool(config.getoption(cls.flag))

    @classmethod
    def check_options(cls, config: pytest.Config) -> None:
        """Refuse this mode's bad option values (a usage error naming the flag); runs in every run,
        selected or not, so a flag given without its mode is refused too."""
        if not cls.selected(config):
            return
        for other in cls.incompatible:
            if config.getoption(other):
                raise pytest.UsageError(f"{cls.flag} {cls.why_incompatible}; it cannot run with {other}")

    # -- one scenario, one relation ----------------------------------------------
    @abstractmethod
    def check(self, session: PerfSession, scenario: BaseScenario, nodeid: str) -> Any:
        """Run ``scenario`` in this mode and pass, fail or skip the calling test (``nodeid``, as a
        command line in the run's invocation folder selects it)."""

    def check_relation(self, session: PerfSession, relation: Relation) -> RelationOutcome:
        """Check ``relation`` and pass, fail or skip the calling test."""
        pytest.skip(f"{relation.id}: {self.no_relations}")

    # -- the run's end -------------------------------------------------------------
    @abstractmethod
    def outcomes(self, session: PerfSession | None) -> list[Outcome]:
        """What each selected scenario came to, for the run's coverage line."""

    @abstractmethod
    def summary(self, terminalreporter: Any, session: PerfSession | None) -> None:
        """This mode's section of the terminal summary."""

    def nothing_measured(self, session: PerfSession | None) -> str:
        """Why this run measured nothing and must exit non-zero ("" when it measured something)."""
        return ""

    def results_json(self, session: PerfSession | None = None) -> Mapping[str, Any]:
        """This mode's top-level keys in the results file."""
        return {}


def say_nothing_measured(terminalreporter: Any, why: str) -> None:
    """The red banner of a run that proves nothing (every mode words it the same way)."""
    if why:
        terminalreporter.write_sep("!", "perfsuite: nothing was measured", red=True)
        terminalreporter.write_line(why)
