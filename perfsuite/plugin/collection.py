"""The collection step: the checks of the collected scenarios that need a child interpreter.

Scenario values check their form as they are built (types, ranges, names, choices). Whether a
team's model module builds on the meta device, an optimizer factory imports, or transformers has
the model type and task: those need a child interpreter, since the pytest process never imports
torch, and a rank decodes the same values from its job, where no child must start. So no
constructor asks: :func:`problems` does, given the scenarios and the ranks' PYTHONPATH, and the
plugin (:mod:`perfsuite.plugin.hooks`) calls it through :func:`checked` as pytest collects each
module's tests. A problem fails that module's collection with the error its constructor raised
before this step existed (the same words, at the same point: pytest's collection error of the
module, whose tests then do not run). Commands that read the suite (``doctor``, ``profile``,
``bootstrap``) collect through pytest (:mod:`perfsuite.commands.collection`), so the step runs there too.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

import pytest

from perfsuite.core.relations import Relation
from perfsuite.core.validation import ScenarioError
from perfsuite.core.workloads.base import BaseScenario


def problems(scenarios: Iterable[BaseScenario], rank_path: str) -> list[ScenarioError]:
    """What child interpreters find wrong with ``scenarios`` (their variants included), each problem
    once, in the scenarios' order; ``rank_path`` is the PYTHONPATH their ranks get, so what passes
    imports on every rank. Empty when nothing is wrong."""
    found: dict[str, ScenarioError] = {}
    for scenario in scenarios:
        for error in scenario.probe(rank_path):
            found.setdefault(str(error), error)
    return list(found.values())


def rank_path(config: pytest.Config) -> str:
    """The ranks' PYTHONPATH: the rootdir and the invocation folder (they import scenario-supplied
    modules from the project, as the pytest process can), then the inherited one. Not pytest's own
    path, which also holds the test folders it prepends."""
    paths = [str(config.rootpath), str(config.invocation_params.dir)]
    existing = os.environ.get("PYTHONPATH")
    return os.pathsep.join(dict.fromkeys([*paths, *([existing] if existing else [])]))


def checked(collector: pytest.Collector, report: pytest.CollectReport) -> pytest.CollectReport:
    """``collector``'s ``report``, failed naming the first of :func:`problems` when the tests it
    collected (a module's, a class's) take a scenario with one."""
    if not report.passed:
        return report
    found = problems(scenarios(report.result), rank_path(collector.config))
    return _failed(collector, report, found[0]) if found else report


def scenarios(nodes: Iterable[Any]) -> Iterator[BaseScenario]:
    """The scenarios the collected tests take as parameters (a relation's two included)."""
    for node in nodes:
        callspec = getattr(node, "callspec", None)
        for value in callspec.params.values() if callspec is not None else ():
            if isinstance(value, BaseScenario):
                yield value
            elif isinstance(value, Relation):
                yield from (value.left, value.right)


def _failed(collector: pytest.Collector, report: pytest.CollectReport, error: ScenarioError) -> pytest.CollectReport:
    """``collector``'s report had it raised ``error``, as pytest reports a module that raises on import
    (its short summary line names the error)."""
    call = pytest.CallInfo.from_call(functools.partial(_raise, error), "collect")
    assert call.excinfo is not None  # _raise always raises
    return pytest.CollectReport(collector.nodeid, "failed", collector.repr_failure(call.excinfo), [], report.sections)


def _raise(error: ScenarioError) -> NoReturn:
    raise error  # a scenario the module's tests take failed the collection step's child interpreter
