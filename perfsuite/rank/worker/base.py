"""The rank side of a workload kind."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TypeVar

from perfsuite.core.protocol import RankJob, RankReport
from perfsuite.rank.worker.runtime import Reporter, WorkerContext

SpecT = TypeVar("SpecT")


def spec_as(job: RankJob, kind: type[SpecT]) -> SpecT:
    """``job``'s spec, which must be a ``kind``: a runner handed another scenario kind's job
    stops with an error (an assert would vanish under ``python -O``)."""
    if not isinstance(job.spec, kind):
        raise TypeError(f"this runner takes a {kind.__name__} job, got a {type(job.spec).__name__}")
    return job.spec


class Runner(ABC):
    """Runs one kind of workload on one rank.

    ``perfsuite.rank.worker`` builds it from the job *before* CUDA is touched (so
    its imports may set environment read at CUDA context creation), asks
    :meth:`check` whether it can run here, sets up the process group, memory
    limits and seed, then calls :meth:`run`.
    """

    def __init__(self, job: RankJob) -> None:
        self.job = job

    def check(self, ctx: WorkerContext) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Raise :class:`~perfsuite.core.protocol.EngineUnavailable` if this rank cannot run the workload."""

    @abstractmethod
    def run(self, ctx: WorkerContext, reporter: Reporter) -> RankReport:
        """Measure the workload; return this rank's report (status ``ok``)."""
