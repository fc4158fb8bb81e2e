# Hook specifications have no body by design: pluggy calls the implementations.
# mypy: disable-error-code="empty-body"
"""Hooks other plugins (or a ``conftest.py``) implement to extend perfsuite.

Each hook is a pytest hook: define a function of the same name in a conftest or
plugin module. Implementations run in the pytest process, never in workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from perfsuite.core.profiles import HardwareProfile
    from perfsuite.gate.session import ScenarioResult
    from perfsuite.judge.ceilings import Ceilings
    from perfsuite.judge.compare import MetricCheck

hookspec = pytest.hookspec


@hookspec
def pytest_perfsuite_profiles() -> list[HardwareProfile]:
    """Return extra hardware profiles (e.g. a runner-specific memory cap).

    Profiles returned here can be chosen with ``--perf-profile`` or by
    :func:`pytest_perfsuite_hardware_key`; a name equal to a built-in replaces it.
    """


@hookspec(firstresult=True)
def pytest_perfsuite_hardware_key(fingerprint: dict[str, Any]) -> str | None:
    """Return the profile name for this machine, or None for the default
    (``cpu`` without GPUs, ``<gpu-model>-x<count>`` with them). Use it to share
    baselines across runners that perfsuite would name differently."""


@hookspec(firstresult=True)
def pytest_perfsuite_compare_metric(check: MetricCheck) -> MetricCheck | None:
    """Judge one metric against its baseline: return ``check`` with ``outcome``
    set to ``pass``/``regression``/``improved``, or None for the default
    relative-tolerance rule."""


@hookspec
def pytest_perfsuite_extra_metrics(
    result: ScenarioResult, fingerprint: dict[str, Any], profile: HardwareProfile, ceilings: Ceilings
) -> dict[str, Any] | None:
    """Return extra metrics for a finished scenario; every implementation's
    dict is merged under ``metrics.extra`` in the results file (not gated).
    ``ceilings`` holds the best matmul TFLOP/s per dtype this session has
    measured so far (:mod:`perfsuite.judge.ceilings`).

    perfsuite's own implementation adds ``mfu`` on GPUs, ``peak`` (fraction of
    the datasheet) for GPU microbenchmarks and ``ceiling`` (fraction of the
    session's measured best matmul) for training runs; yours runs beside it.
    Take only the arguments you need. To gate a metric, register it
    (:mod:`perfsuite.core.metrics`) and measure it on the ranks instead."""


@hookspec
def pytest_perfsuite_session_finished(config: pytest.Config, document: dict[str, Any]) -> None:
    """Called once at the end of a session that ran perfsuite scenarios, with
    the results document (the same dict ``--perf-json`` writes, whether or not
    that flag is given). Exporters implement it: perfsuite's own
    pytest-benchmark export and history store do (:mod:`perfsuite.reports.exports`),
    and a plugin of yours can send the document elsewhere. Raise
    ``pytest.UsageError`` for a bad destination; never modify ``document``."""
