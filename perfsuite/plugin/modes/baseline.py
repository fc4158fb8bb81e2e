"""The default mode: judge every scenario against its baseline, and check the relations between them."""

from __future__ import annotations

import collections
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

from perfsuite.core.relations import Relation, RelationOutcome
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.judge import repro
from perfsuite.judge.compare import FAILING
from perfsuite.judge.coverage import JUDGED, Outcome, kinds_judged
from perfsuite.launch.devicelock import DeviceBusy
from perfsuite.plugin import exitstatus, options
from perfsuite.plugin.modes.base import Mode, say_nothing_measured
from perfsuite.reports.cost import ranking, ranking_lines
from perfsuite.reports.summary import relation_lines, summary_lines
from perfsuite.store.baselines import BaselineError

if TYPE_CHECKING:
    from perfsuite.gate.session import PerfSession, ScenarioResult
    from perfsuite.judge.simulate.family import RunFalseAlarms


class StaleBaselineWarning(UserWarning):
    """A scenario beat its baseline by more than the tolerance."""


def run_or_fail(session: PerfSession, scenario: BaseScenario) -> ScenarioResult:
    """Run and judge ``scenario``; an unusable baseline file or GPUs held too long fail the test."""
    try:
        return session.run(scenario)
    except (BaselineError, DeviceBusy) as exc:
        pytest.fail(f"{scenario.id}: {exc}", pytrace=False)


class BaselineMode(Mode):
    """Measure, judge against the stored baseline, and (on request) record it."""

    def __init__(self, config: pytest.Config) -> None:
        super().__init__(config)
        self._alarms: tuple[RunFalseAlarms | None] | None = None

    def check(self, session: PerfSession, scenario: BaseScenario, nodeid: str) -> ScenarioResult:
        result = run_or_fail(session, scenario)
        verdict, message = result.verdict, result.judgement.message
        if result.judgement.stack_changes:
            message += "\nstack changed since the baseline: " + "; ".join(result.judgement.stack_changes)
        held = exitstatus.quarantined(self.config, scenario.id)
        if held is not None and verdict not in ("pass", "recorded", "expected_oom"):
            pytest.skip(f"{scenario.id}: QUARANTINED, not gating ({held.describe()}); {verdict}: {message}")
        if verdict in FAILING:
            flags = repro.settings_flags(
                self.config.invocation_params.args, session.profile.name, options.JUDGING_FLAGS
            )
            result.repro = repro.repro(nodeid, flags, result.baseline.extra if result.baseline else None)
            lines = "\n".join(result.repro.lines())
            pytest.fail(f"{scenario.id}: {verdict}: {message}\n{lines}", pytrace=False)
        if verdict == "skipped":
            pytest.skip(f"{scenario.id}: {message}")
        if verdict == "unreliable":
            if self.config.getoption(exitstatus.DEPRECATED_FLAG):
                pytest.fail(f"{scenario.id}: UNRELIABLE: {message}", pytrace=False)
            pytest.skip(f"{scenario.id}: UNRELIABLE (not judged, fails the run): {message}")
        if verdict == "no_baseline":
            path = session.store_for(session.env_of(scenario)).path(scenario.group)
            pytest.skip(
                f"{scenario.id}: no baseline in {path} (not judged, fails the run); record one with: "
                f"pytest '{nodeid}' --perf-update-baselines"
            )
        if verdict == "improved":
            warnings.warn(StaleBaselineWarning(f"{scenario.id}: {message}"), stacklevel=3)
        return result

    def check_relation(self, session: PerfSession, relation: Relation) -> RelationOutcome:
        try:
            outcome = session.relation(relation)
        except BaselineError as exc:
            pytest.fail(str(exc), pytrace=False)
        if outcome.status == "skipped":
            pytest.skip(f"{relation.id}: {outcome.message}")
        if outcome.status == "violated":
            pytest.fail(f"{relation.id}: violated: {outcome.message}", pytrace=False)
        return outcome

    def outcomes(self, session: PerfSession | None) -> list[Outcome]:
        held = exitstatus.entries_of(self.config)
        results = session.results.values() if session is not None else ()
        return [
            Outcome(
                r.scenario.id,
                r.verdict,
                r.judgement.message,
                r.scenario.id in held,
                r.missing,
                r.work.status if r.work else "",
                *kinds_judged((check.metric for check in r.judgement.checks), r.verdict),
            )
            for r in results
        ]

    def summary(self, terminalreporter: Any, session: PerfSession | None) -> None:
        if session is None or not session.results:
            return
        terminalreporter.write_sep("-", f"perfsuite summary (profile {session.profile.name})")
        for line in summary_lines(session.results.values()):
            terminalreporter.write_line(line)
        if session.relations:
            terminalreporter.write_sep("-", "perfsuite relations")
            for line in relation_lines(session.relations.values()):
                terminalreporter.write_line(line)
        self._sensitivity(terminalreporter, session)
        alarms = self.false_alarms(session)
        if alarms is not None:
            terminalreporter.write_line(f"perfsuite {alarms.describe()}")
        self._ranking(terminalreporter, session)
        say_nothing_measured(terminalreporter, self.nothing_measured(session))

    def false_alarms(self, session: PerfSession | None) -> RunFalseAlarms | None:
        """The chance that a run of the rows whose timing this one judged fails one with no change
        (computed once: the summary and the results file both state it)."""
        if session is None:
            return None
        if self._alarms is None:
            from perfsuite.judge.simulate import family  # numpy and scipy: only once a run judged timing

            held = exitstatus.entries_of(self.config)
            judged = [
                (r.scenario.id, r.baseline)
                for r in session.results.values()
                if r.baseline is not None
                and r.scenario.id not in held
                and r.verdict in JUDGED
                and kinds_judged((check.metric for check in r.judgement.checks), r.verdict)[0]
            ]
            self._alarms = (
                (family.of_baselines(judged, session.profile, session.settings.confirm),) if judged else (None,)
            )
        return self._alarms[0]

    def results_json(self, session: PerfSession | None = None) -> Mapping[str, Any]:
        alarms = self.false_alarms(session)
        return {"false_alarms": alarms.to_json()} if alarms is not None else {}

    def _sensitivity(self, terminalreporter: Any, session: PerfSession) -> None:
        """After recording, what each new baseline lets the gate see: a team learns the smallest drop it
        would catch (a -20% regression in a tiny cpu shape passes a 40% tolerance, and nothing said so)."""
        recorded = {
            r.scenario.id: (r.baseline, r.scenario.min_effect)
            for r in session.results.values()
            if r.verdict == "recorded" and r.status == "ok" and r.baseline is not None
        }
        if not recorded:
            return
        from perfsuite.judge.simulate import sensitivity  # numpy and scipy: only when baselines were recorded

        terminalreporter.write_sep("-", "perfsuite: what these baselines let the gate see")
        for scenario_id, (entry, min_effect) in recorded.items():
            said = sensitivity(entry, session.profile, session.settings.confirm, min_effect)
            terminalreporter.write_line(f"{scenario_id}: {said or 'no spread stored: not modelled'}")

    def _ranking(self, terminalreporter: Any, session: PerfSession) -> None:
        job = options.job(self.config)
        ranked = ranking(session.results.values(), job)
        if not ranked:
            return
        price = session.profile.gpu_hour_price
        priced = f"{price:g} {session.profile.currency} per GPU-hour" if price is not None else "no price set"
        terminalreporter.write_sep("-", f"perfsuite cost and time ranking ({priced})")
        for line in ranking_lines(ranked, job):
            terminalreporter.write_line(line)

    def nothing_measured(self, session: PerfSession | None) -> str:
        results = list(session.results.values()) if session is not None else []
        if not results or any(r.status in ("ok", "oom") for r in results):
            return ""
        shown = "; ".join(f"{r.scenario.id}: {r.judgement.message}" for r in results[:3])
        more = f" (and {len(results) - 3} more)" if len(results) > 3 else ""
        ended = collections.Counter(r.status for r in results)
        counts = ", ".join(f"{n} {status}" for status, n in sorted(ended.items()))
        how = f"none of the {len(results)} scenario(s) measured anything ({counts})"
        if set(ended) == {"skipped"}:
            how = f"all {len(results)} scenario(s) skipped without measuring"
        return (
            f"{how}, so this run proves nothing and exits "
            f"non-zero: {shown}{more}. `python -m perfsuite doctor` shows what can run here."
        )
