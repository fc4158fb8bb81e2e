"""``--perf-find-max-batch``: the largest micro-batch of a train scenario that
fits in memory, found with real out-of-memory failures as the boundary.

Each trial is a fresh launch (fresh ranks) of the scenario at one micro-batch
through the session's normal launch path, so the boundary is where the real
allocator fails: RLIMIT_DATA at the rank's footprint + the profile's budget on
``cpu``, the device (or the profile's cap) on CUDA. The search doubles from
the start size until the first OOM, then bisects between the last size that
fit and the first that did not; if the start already OOMs it halves down to 1.
A trial that fails for any other reason (crash, timeout, skip) stops the
search: a crash is never mistaken for an OOM.

Nothing here reads or writes baselines, or knows pytest: :mod:`perfsuite.plugin.modes.maxbatch`
is the run mode that drives it. Never imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from perfsuite.core import metrics as registry
from perfsuite.core.text import table
from perfsuite.core.validation import ScenarioError
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.core.workloads.train import Scenario
from perfsuite.gate.session import Measurement, PerfSession
from perfsuite.judge.stats import Summary

FLAG = "--perf-find-max-batch"
START_FLAG = "--perf-max-batch-start"
LIMIT_FLAG = "--perf-max-batch-limit"
DEFAULT_LIMIT = 4096

#: A launch's status, or "invalid" when validation refused the shape.
TrialStatus = Literal["ok", "oom", "timeout", "crash", "skipped", "invalid"]
Outcome = Literal["boundary", "limit", "none_fit", "stopped"]


@dataclass(frozen=True)
class Trial:
    """One launch of the scenario at one micro-batch."""

    micro_batch: int
    global_batch: int
    status: TrialStatus
    throughput: Summary | None = None
    """The scenario's headline metric (samples/s for a train scenario)."""
    values: Mapping[str, float] = field(default_factory=dict)
    """Every other metric it measured, by name (reports show the registry's gated ones)."""
    message: str = ""
    """Why a trial that neither trained nor ran out of memory failed."""
    wall_s: float = 0.0
    """Launch wall time (all repeats): what the trial cost."""

    def to_json(self, primary: str) -> dict[str, Any]:
        throughput = self.throughput
        return {
            "micro_batch": self.micro_batch,
            "global_batch": self.global_batch,
            "status": self.status,
            primary: dataclasses.asdict(throughput) if throughput else None,
            **self.values,
            "message": self.message,
            "wall_s": round(self.wall_s, 2),
        }


RunTrial = Callable[[int], Trial]


class MaxBatchSearch:
    """Doubling then bisection over micro-batch sizes, driven by ``run_trial``.

    Assumes memory grows with the micro-batch, so every size above an OOM
    would OOM too and every size below a fit would fit.
    """

    def __init__(self, start: int, limit: int, run_trial: RunTrial) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.start = max(1, min(start, limit))  # a scenario's own size above the limit starts at the limit
        self.limit = limit
        self.run_trial = run_trial
        self.trials: list[Trial] = []
        self.stopped = False

    def run(self) -> tuple[Trial, ...]:
        first = self._try(self.start)
        if first is True:
            self._bisect(*self._grow(self.start))
        elif first is False:
            self._bisect(*self._shrink(self.start))
        return tuple(self.trials)

    def _try(self, size: int) -> bool | None:
        """True: it trained; False: it ran out of memory; None: the search stops."""
        trial = self.run_trial(size)
        self.trials.append(trial)
        if trial.status not in ("ok", "oom"):
            self.stopped = True
            return None
        return trial.status == "ok"

    def _grow(self, fit: int) -> tuple[int, int]:
        """Double from a size that fits: (last fit, first OOM), or (limit, limit) if none OOMed."""
        while fit < self.limit:
            size = min(2 * fit, self.limit)
            fits = self._try(size)
            if fits is None:
                return fit, fit
            if not fits:
                return fit, size
            fit = size
        return fit, fit

    def _shrink(self, oom: int) -> tuple[int, int]:
        """Halve from a size that OOMed: (first fit, last OOM), or (0, 1) if even 1 OOMs."""
        while oom > 1:
            size = oom // 2
            fits = self._try(size)
            if fits is None:
                return oom, oom
            if fits:
                return size, oom
            oom = size
        return 0, 1

    def _bisect(self, fit: int, oom: int) -> None:
        while not self.stopped and oom - fit > 1:
            size = (fit + oom) // 2
            fits = self._try(size)
            if fits is True:
                fit = size
            elif fits is False:
                oom = size


@dataclass(frozen=True)
class MaxBatchResult:
    """The search for one scenario: every trial, in the order run."""

    scenario: Scenario  # resolved for the profile, at its own micro-batch
    start: int
    limit: int
    trials: tuple[Trial, ...]

    @property
    def largest_fitting(self) -> int | None:
        sizes = [t.micro_batch for t in self.trials if t.status == "ok"]
        return max(sizes) if sizes else None

    @property
    def first_oom(self) -> int | None:
        sizes = [t.micro_batch for t in self.trials if t.status == "oom"]
        return min(sizes) if sizes else None

    @property
    def stopped_by(self) -> Trial | None:
        """The trial that neither trained nor OOMed (it ended the search), if any."""
        return next((t for t in self.trials if t.status not in ("ok", "oom")), None)

    @property
    def measured(self) -> bool:
        """Whether any trial trained or ran out of memory: a search that found something."""
        return any(t.status in ("ok", "oom") for t in self.trials)

    @property
    def outcome(self) -> Outcome:
        if self.stopped_by is not None:
            return "stopped"
        if self.largest_fitting is None:
            return "none_fit"
        return "boundary" if self.first_oom is not None else "limit"

    def headline(self) -> str:
        """One line: what the search found."""
        fit, oom, count = self.largest_fitting, self.first_oom, f"{len(self.trials)} trial(s)"
        stop = self.stopped_by
        if stop is not None:
            so_far = f"; largest fitting so far {fit}" if fit else ""
            return f"search stopped: micro-batch {stop.micro_batch} {stop.status}{so_far}; {count}"
        if fit is None:
            return f"no micro-batch fits: even micro-batch 1 runs out of memory; {count}"
        grown = f"largest fitting micro-batch {fit} (global batch {self._global(fit)})"
        if oom is None:
            return f"fits up to the limit: {grown}, no OOM up to {LIMIT_FLAG}={self.limit}; {count}"
        return f"{grown}, first OOM at {oom}; {count}"

    def _global(self, micro_batch: int) -> int:
        return next(t.global_batch for t in self.trials if t.micro_batch == micro_batch)

    def lines(self) -> list[str]:
        """The headline and the per-size table, sizes ascending."""
        primary = self.scenario.primary
        extra = registry.columns((primary, t.values) for t in self.trials)
        rows = (_row(t, extra) for t in sorted(self.trials, key=lambda t: t.micro_batch))
        header = ("micro_batch", "global_batch", "status", registry.get(primary).header, *(m.header for m in extra))
        return [f"{self.scenario.id}: {self.headline()}", *("  " + line for line in table(header, rows))]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.scenario.id,
            "group": self.scenario.group,
            "config": self.scenario.to_config(),
            "outcome": self.outcome,
            "start": self.start,
            "limit": self.limit,
            "largest_fitting": self.largest_fitting,
            "first_oom": self.first_oom,
            "message": self.headline(),
            "trials": [t.to_json(self.scenario.primary) for t in self.trials],
        }


def _row(trial: Trial, extra: list[registry.Metric]) -> tuple[str, ...]:
    rate = trial.throughput
    throughput = f"{rate.mean:.2f} +/- {rate.std:.2f}" if rate else "-"
    cells = (m.show(trial.values[m.name]) if m.name in trial.values else "-" for m in extra)
    return (str(trial.micro_batch), str(trial.global_batch), trial.status, throughput, *cells)


# -- running trials through the session ---------------------------------------------
def trial_runner(session: PerfSession, scenario: Scenario) -> RunTrial:
    """Launch ``scenario`` (resolved) at a given micro-batch, keeping its
    gradient accumulation per step: global = micro x grad_accum x dp ranks."""
    per_micro = scenario.grad_accum * scenario.data_parallel_size

    def run(micro_batch: int) -> Trial:
        global_batch = micro_batch * per_micro
        try:
            sized = dataclasses.replace(scenario, micro_batch=micro_batch, global_batch=global_batch)
        except ScenarioError as exc:
            return Trial(micro_batch, global_batch, "invalid", message=str(exc))
        # The session's own launch path (repeats included), without judging or
        # recording: the trial is a measurement, not a verdict.
        return trial_of(micro_batch, global_batch, session.measure(sized), scenario.primary)

    return run


def trial_of(micro_batch: int, global_batch: int, measurement: Measurement, primary: str) -> Trial:
    metrics, outcome = measurement.metrics, measurement.outcome
    wall_s = sum(launch.wall_s for launch in measurement.launches)
    if outcome.status == "ok" and metrics is not None:
        values = {name: metrics.value(name) for name in metrics.values if name != primary}
        return Trial(micro_batch, global_batch, "ok", metrics.summary(primary), values, wall_s=wall_s)
    why = outcome.failure.describe() if outcome.failure else outcome.skip_reason
    return Trial(micro_batch, global_batch, outcome.status, message=why, wall_s=wall_s)


def resolved_here(session: PerfSession, scenario: BaseScenario) -> tuple[BaseScenario, str | None]:
    """``scenario`` as the session's own run launches it on this profile and
    machine, and why it gets no search here (None if it does)."""
    fitted = session.prepare(scenario)
    if not isinstance(fitted.scenario, Scenario):
        return (
            fitted.scenario,
            f"{FLAG} searches the micro-batch of train scenarios; this is a {fitted.scenario.kind} scenario",
        )
    return fitted.scenario, fitted.skip


__all__ = ["MaxBatchResult", "MaxBatchSearch", "Trial", "resolved_here", "trial_runner"]
