"""The bootstrap loop: plan, then run each step while the time left holds it.

Exit status: 0 when everything this machine can record is recorded; 3 when
the budget ran out but everything it started was recorded (incomplete and
resumable: run it again); 1 when a step failed. The last line says which.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perfsuite.commands.bootstrap import report
from perfsuite.commands.bootstrap.costs import Costs
from perfsuite.commands.bootstrap.plan import START_MARGIN, Done, Plan, Settings, Step, fits, make_plan, targets_for
from perfsuite.commands.bootstrap.state import State, StepRecord, done_in
from perfsuite.commands.bootstrap.steps import Context, doctor_step, pytest_step, selftest_left, selftest_step
from perfsuite.core.profiles import HardwareProfile
from perfsuite.launch import identity, warm
from perfsuite.store.baselines import COSTS_FILENAME, BaselineEntry, BaselineStore

EXIT_COMPLETE, EXIT_FAILED, EXIT_INCOMPLETE = 0, 1, 3


class Budget:
    """Wall-clock seconds from ``start``; ``left()`` counts down to zero."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_s, self.clock, self.start = total_s, clock, clock()

    def used(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return max(0.0, self.total_s - self.used())


def clock_text(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s"


@dataclass(frozen=True)
class Options:
    budget_s: float
    out: Path
    baselines: Path
    paths: tuple[str, ...] = ("bench_tests",)
    keyword: str | None = None
    profile: str | None = None
    settings: Settings = field(default_factory=Settings)
    redo: bool = False
    dry_run: bool = False
    """Print the plan and exit: nothing is launched or written."""
    pytest_args: tuple[str, ...] = ()
    python: str = sys.executable


@dataclass(frozen=True)
class Stores:
    """Makes a fresh BaselineStore of one profile per call: a store caches the group files it read."""

    root: Path
    profile: str
    #: This machine's processor where the profile keeps an entry per processor (``HardwareProfile.entry_processor``).
    processor: Mapping[str, Any] | None = None

    def __call__(self) -> BaselineStore:
        return BaselineStore(self.root, self.profile, self.processor)


def say(text: str) -> None:
    print(f"[bootstrap] {text}", flush=True)


def _machine(options: Options) -> tuple[dict[str, Any], HardwareProfile, list[Any]]:
    """Fingerprint, profile and the suite's (scenario, node id) pairs, as a run would see them
    (the profile after the repository's conftest hooks: perfsuite.commands.collection)."""
    from perfsuite.commands.collection import collect

    found = collect(options.paths, options.keyword, options.profile)
    if found.profile is None:
        raise SystemExit(f"perfsuite bootstrap: {found.problem}")
    if found.errors:
        raise SystemExit(
            f"perfsuite bootstrap: {found.errors} module(s) of {' '.join(options.paths)} failed to "
            f"collect: run pytest --collect-only {' '.join(options.paths)}"
        )
    return found.fingerprint, found.profile, found.with_nodeids()


def usable(fingerprint: dict[str, Any], profile: HardwareProfile) -> Callable[[BaselineEntry], bool]:
    """Which stored baselines count as this machine's (identity.times_here)."""
    return lambda entry: identity.times_here(entry.fingerprint, fingerprint, profile.timed_on_other_processor)


def build_plan(
    options: Options,
    fingerprint: dict[str, Any],
    profile: HardwareProfile,
    scenarios: Sequence[Any],
    costs: Costs,
    store: BaselineStore,
) -> Plan:
    targets, not_here = targets_for(scenarios, profile, fingerprint)
    done = Done() if options.redo else done_in(store, targets, options.settings.repeats, usable(fingerprint, profile))
    launch_s, fixed_s = costs.table(targets)
    return make_plan(targets, not_here, launch_s, fixed_s, done, options.settings)


def run(options: Options) -> int:
    budget = Budget(options.budget_s)
    warm.share_with_children()  # every step's pytest forks its launches from one parent per import set
    fingerprint, profile, scenarios = _machine(options)
    # A fresh store for every read: a BaselineStore caches group files, and the steps rewrite them.
    store = Stores(options.baselines, profile.name, profile.entry_processor(fingerprint))
    costs_path = options.baselines / profile.name / COSTS_FILENAME
    costs = Costs.load(costs_path, profile.device)
    plan = build_plan(options, fingerprint, profile, scenarios, costs, store())
    if options.dry_run:
        print(
            "\n".join(
                [
                    f"profile {profile.name} ({profile.device}), budget {clock_text(options.budget_s)}:",
                    *plan.lines(options.budget_s),
                ]
            )
        )
        return EXIT_COMPLETE
    state = State.load(options.out / "state.json", profile.name, options.redo)
    if options.redo:  # a selftest keeps its finished levels across runs; starting over drops them
        for table in options.out.glob("selftest_*.json"):
            table.unlink()
    state.facts["budget_s"] = options.budget_s
    state.facts["baselines"] = str(options.baselines / profile.name)
    ctx = Context(
        options.python,
        profile.name,
        options.baselines,
        options.out,
        options.pytest_args,
        options.settings.levels,
        options.settings.trials,
    )
    say(
        f"profile {profile.name}: {len(plan.steps)} step(s) planned, estimated "
        f"{clock_text(sum(s.estimate_s for s in plan.steps))}, budget {clock_text(options.budget_s)}"
    )
    out_of_time = loop(plan, state, ctx, budget, costs, costs_path, fingerprint, profile, store)
    return finish(plan, state, ctx, budget, costs, costs_path, store, out_of_time)


def loop(
    plan: Plan,
    state: State,
    ctx: Context,
    budget: Budget,
    costs: Costs,
    costs_path: Path,
    fingerprint: dict[str, Any],
    profile: HardwareProfile,
    store: Stores,
) -> bool:
    """Run the steps before the report; True when the budget left any of them waiting.

    A step that does not fit waits, and the later ones that fit run first: the
    time left goes to what it can hold (the first H100 run stopped with 45 s
    unused while 14 s baselines waited behind a 90 s step).
    """
    reserve = next(s.estimate_s for s in plan.steps if s.kind == "report")
    recorded = set(done_in(store(), list(plan.targets), 1, usable(fingerprint, profile)).baselines)
    work = [s for s in plan.steps if s.kind != "report"]
    waiting: list[Step] = []
    for number, step in enumerate(work, 1):
        if state.finished(step.key):
            say(f"{number}/{len(work)} {step.key}: done in an earlier run")
            continue
        if step.kind in ("cv", "selftest") and not {t.id for t in step.targets} <= recorded:
            say(f"{number}/{len(work)} {step.key}: not started, its scenario has no baseline (see its baseline step)")
            continue
        if step.kind == "selftest":  # a stopped selftest kept its finished levels: only the rest is to pay
            step = replace(step, estimate_s=step.estimate_s * selftest_left(step, ctx))
        if not fits(step, budget.left() - reserve):
            if not waiting:
                say(
                    f"{number}/{len(work)} {step.key}: waits, needs ~{step.estimate_s:.0f} s (x{START_MARGIN} margin)"
                    f" and {clock_text(budget.left())} are left (report reserved); later steps that fit run first"
                )
            waiting.append(step)
            continue
        record = execute(step, ctx, budget.left() - reserve, fingerprint, profile, plan, state, costs, recorded)
        state.record(step.key, record)
        costs.save(costs_path)
        recorded = set(done_in(store(), list(plan.targets), 1, usable(fingerprint, profile)).baselines)
        say(
            f"{number}/{len(work)} {step.key}: {record.status} in {record.wall_s:.1f} s (est {step.estimate_s:.0f})"
            f" | used {clock_text(budget.used())}, left {clock_text(budget.left())} | {record.message[:160]}"
        )
        if record.status == "interrupted":
            return True
    if len(waiting) > 1:
        say(f"{len(waiting)} step(s) did not fit the time left and wait for a rerun")
    return bool(waiting)


def execute(
    step: Step,
    ctx: Context,
    timeout_s: float,
    fingerprint: dict[str, Any],
    profile: HardwareProfile,
    plan: Plan,
    state: State,
    costs: Costs,
    recorded: set[str],
) -> StepRecord:
    if step.kind == "doctor":
        record, state.facts["doctor"] = doctor_step(ctx, plan, fingerprint, profile)
        record.estimate_s = step.estimate_s
        costs.learn_fixed("doctor", record.wall_s)
        return record
    if step.kind == "selftest":
        record, detection = selftest_step(step, ctx, timeout_s)
        if detection:
            state.facts["detection"] = detection
        return record
    record, results = pytest_step(step, ctx, timeout_s, frozenset(recorded))
    costs.learn(results, step.launches, record.wall_s)
    if record.status in ("interrupted", "failed") and not results:
        # It took at least this long without reporting: never plan it shorter again.
        costs.learn_at_least(step.targets, record.wall_s / step.launches)
    return record


def finish(
    plan: Plan,
    state: State,
    ctx: Context,
    budget: Budget,
    costs: Costs,
    costs_path: Path,
    store: Stores,
    out_of_time: bool,
) -> int:
    failed = [k for k, r in state.steps.items() if r.status == "failed" and k in {s.key for s in plan.steps}]
    missing = [s.key for s in plan.steps if s.kind != "report" and not state.finished(s.key)]
    if failed:
        code, verdict = EXIT_FAILED, f"failed: {', '.join(failed)} (see {ctx.out / 'logs'})"
    elif missing:
        code, verdict = EXIT_INCOMPLETE, f"incomplete: {len(missing)} step(s) left ({', '.join(missing[:6])}"
        verdict += ", ...)" if len(missing) > 6 else ")"
        verdict += "; the budget ran out: run it again to resume" if out_of_time else ""
    else:
        code, verdict = EXIT_COMPLETE, "complete: everything this machine can record is recorded"
    start = time.monotonic()
    state.facts["used_s"] = budget.used()
    written = report.write(state, plan, ctx.out, store(), f"bootstrap {verdict}")
    costs.learn_fixed("report", time.monotonic() - start)
    costs.save(costs_path)
    state.save()
    say(
        f"report: {', '.join(str(p) for p in written)} | used {clock_text(budget.used())} "
        f"of {clock_text(budget.total_s)}"
    )
    say(f"bootstrap {verdict} (exit {code})")
    return code
