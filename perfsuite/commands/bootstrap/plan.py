"""What the bootstrap does on this machine, in which order, at what estimated cost.

Pure data: the targets come from the suite's own scenarios, resolved and
fitted to this machine by the same code a run uses (so the plan for eight
faked H100s shows the seed shapes a real run would launch), and the order is
"information per second":

1. ``doctor`` and the ``ceilings`` (a training figure means little without them);
2. a ``baseline`` for the cheapest scenario of every group, groups cheapest first;
3. the ``cv`` (three fresh launches, calibrated tolerances) and then the
   ``selftest`` of the cheapest of those scenarios, so the detection table
   comes early and judges with a calibrated tolerance;
4. the ``cv`` of the other scenarios of step 2;
5. the other baselines, round robin over the groups, cheapest first within one;
6. the other ``cv`` steps in the same order; the ``report`` last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from perfsuite.core.profiles import HardwareProfile
from perfsuite.core.workloads import BaseScenario
from perfsuite.gate.fitting import fit

StepKind = Literal["doctor", "ceilings", "baseline", "cv", "selftest", "report"]
#: All-reduces at least this large measure the interconnect's bus bandwidth (a ceiling).
LARGE_COLLECTIVE_BYTES = 2**28
#: Matmul dtypes left out of a GPU's ceilings step: plain fp32 runs on the
#: non-tensor units (~60 TFLOP/s), so its best-shape row takes minutes at the
#: seed's shapes. It is still recorded, later, as an ordinary baseline.
SLOW_CEILING_DTYPES = ("fp32",)
#: Workload kinds whose ranks take a planted slowdown (the selftest's lever:
#: the measured loop, and the Trainer's step callback).
SELFTEST_KINDS = ("train", "microbench", "membw", "trainer")
#: A step starts only when its estimate times this fits in the time left. An
#: estimate is a mean of earlier launches, and a step stopped at the budget's
#: end loses all its time: the first H100 run started a selftest estimated at
#: 123 s with 136 s left, and it was stopped after 126 s (it took 141 s later).
START_MARGIN = 1.2
#: Shape fields worth showing in a plan line, in this order.
SHAPE_FIELDS = ("strategy", "precision", "micro_batch", "global_batch", "seq_len", "op", "dtype", "shape", "size_bytes")


@dataclass(frozen=True)
class Target:
    """One scenario as it would run on this machine."""

    id: str
    group: str
    nodeid: str
    """The pytest node id that runs exactly this scenario."""
    kind: str
    """Workload kind (train, microbench, membw, collective, trainer)."""
    world_size: int
    shape: str
    """The resolved shape, for people reading the plan."""
    primary: str = "samples_per_s"
    """The metric its kind is judged by first."""
    ceiling: bool = False
    """It measures a hardware ceiling rather than a software stack."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Step:
    key: str
    """Unique and stable across runs: ``baseline:<id>``, ``cv:<id>``, ``doctor``..."""
    kind: StepKind
    targets: tuple[Target, ...] = ()
    launches: int = 1
    """Fresh launches per target (cv: the repeats; selftest: trials x levels)."""
    estimate_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "targets": [t.id for t in self.targets],
            "launches": self.launches,
            "estimate_s": round(self.estimate_s, 1),
        }


@dataclass(frozen=True)
class Done:
    """What earlier runs left in the baselines folder (empty under ``--redo``)."""

    baselines: frozenset[str] = frozenset()
    calibrated: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Settings:
    repeats: int = 3
    """Launches per ``cv`` step."""
    levels: tuple[float, ...] = (0.0, 3.0, 5.0, 10.0)
    """Planted slowdowns of the selftest, in percent."""
    trials: int = 2
    """Selftest trials per level."""
    confirm_share: float = 0.5
    """Expected extra launches per selftest trial for the gate's confirmation rerun."""


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    targets: tuple[Target, ...]
    not_here: Mapping[str, str] = field(default_factory=dict)
    """Scenario id -> why it cannot run on this machine."""

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": [s.to_json() for s in self.steps],
            "targets": [t.to_json() for t in self.targets],
            "not_here": dict(self.not_here),
        }

    def lines(self, budget_s: float) -> list[str]:
        """The plan for people: each step with its estimate and whether ``budget_s`` holds it, then the targets."""
        found, total, ended = [], 0.0, False
        left = budget_s - sum(s.estimate_s for s in self.steps if s.kind == "report")
        for n, step in enumerate(self.steps, 1):
            waits = step.kind != "report" and not fits(step, left)
            if waits and not ended:
                ended = True
                found.append(
                    f"    -- the budget ends here ({budget_s:.0f} s): the steps marked 'waits' wait for a "
                    "rerun; a later one that fits runs first"
                )
            total += step.estimate_s
            left -= 0.0 if waits else step.estimate_s
            times = f"  x{step.launches}" if step.launches > 1 else ""
            mark = "  waits" if waits else ""
            found.append(f"{n:>3} {step.key:<52} ~{step.estimate_s:5.0f} s  (total {total:5.0f} s){times}{mark}")
        found += [
            "targets:",
            *(
                f"  {t.id:<48} {t.world_size} rank(s)  {t.shape}" + ("  [ceiling]" if t.ceiling else "")
                for t in self.targets
            ),
        ]
        absent = [f"  {i:<48} {why}" for i, why in self.not_here.items()]
        return [*found, *(["not here:", *absent] if absent else [])]


def fits(step: Step, left_s: float) -> bool:
    """Whether ``step`` may start with ``left_s`` seconds left: its estimate with the start margin."""
    return step.estimate_s * START_MARGIN <= left_s


def shape_of(config: Mapping[str, Any]) -> str:
    parts = []
    model = config.get("model")
    if isinstance(model, Mapping):
        # A team's module or a transformers type has no layers x hidden of perfsuite's: its source names it.
        size = model.get("source") or f"{model.get('layers')}x{model.get('hidden')}"
        parts.append(f"{model.get('family')} {size}")
    parts += [f"{name}={config[name]}" for name in SHAPE_FIELDS if config.get(name) not in (None, "", ())]
    return " ".join(parts)


def is_ceiling(scenario: BaseScenario, profile: HardwareProfile) -> bool:
    config = scenario.to_config()
    if scenario.kind == "membw":
        return True
    if scenario.kind == "microbench":
        slow = profile.device == "cuda" and config.get("dtype") in SLOW_CEILING_DTYPES
        return config.get("op") == "matmul_best" and not slow
    if scenario.kind == "collective":  # NCCL on GPUs; gloo on cpu measures no interconnect
        big = int(config.get("size_bytes", 0)) >= LARGE_COLLECTIVE_BYTES
        return profile.device == "cuda" and config.get("op") == "all_reduce" and big
    return False


def targets_for(
    scenarios: Iterable[tuple[BaseScenario, str]], profile: HardwareProfile, fingerprint: Mapping[str, Any]
) -> tuple[list[Target], dict[str, str]]:
    """The scenarios (with their node ids) that run here, resolved and fitted; the others with why."""
    targets: list[Target] = []
    not_here: dict[str, str] = {}
    for declared, nodeid in scenarios:
        fitted = fit(declared.resolve(profile.variant_keys), profile, fingerprint, None, None)
        scenario, reason = fitted.scenario, fitted.skip
        if not reason and scenario.env:
            reason = f"runs in the Python environment {scenario.env!r}, which pytest gets with --perf-env"
        if reason:
            not_here[scenario.id] = reason
            continue
        config = scenario.to_config()
        targets.append(
            Target(
                scenario.id,
                scenario.group,
                nodeid,
                scenario.kind,
                scenario.world_size,
                shape_of(config),
                scenario.primary,
                is_ceiling(scenario, profile),
            )
        )
    return targets, not_here


def rounds(targets: Sequence[Target], cost: Mapping[str, float]) -> list[list[Target]]:
    """Round robin over groups: round n holds the n-th cheapest of each group, groups cheapest first."""
    groups: dict[str, list[Target]] = {}
    for target in sorted(targets, key=lambda t: (cost[t.id], t.id)):
        groups.setdefault(target.group, []).append(target)
    order = sorted(groups.values(), key=lambda members: (cost[members[0].id], members[0].group))
    depth = max((len(g) for g in order), default=0)
    return [[g[n] for g in order if n < len(g)] for n in range(depth)]


def make_plan(
    targets: Sequence[Target],
    not_here: Mapping[str, str],
    launch_s: Mapping[str, float],
    fixed_s: Mapping[str, float],
    done: Done,
    settings: Settings,
) -> Plan:
    """Every step still to do, in priority order, each with its estimated seconds.

    ``launch_s`` is the estimated seconds of one launch per target id,
    ``fixed_s`` those of ``doctor``, ``report`` and one pytest start (``pytest``).
    """
    pytest_s = fixed_s["pytest"]

    def step(kind: StepKind, key: str, members: Sequence[Target], launches: int) -> Step:
        seconds = pytest_s + launches * sum(launch_s[t.id] for t in members)
        return Step(key, kind, tuple(members), launches, seconds)

    ceilings = [t for t in targets if t.ceiling]
    others = rounds([t for t in targets if not t.ceiling], launch_s)
    first, later = (others[0] if others else []), [t for r in others[1:] for t in r]
    steps = [Step("doctor", "doctor", estimate_s=fixed_s["doctor"])]
    if ceilings:
        steps.append(step("ceilings", "ceilings", ceilings, 1))
    steps += [step("baseline", f"baseline:{t.id}", [t], 1) for t in first if t.id not in done.baselines]
    cv = [step("cv", f"cv:{t.id}", [t], settings.repeats) for t in [*first, *ceilings, *later]]
    cv = [s for s in cv if s.targets[0].id not in done.calibrated]
    testable = [t for t in [*first, *ceilings] if t.kind in SELFTEST_KINDS]
    if testable:
        cheapest = min(testable, key=lambda t: (launch_s[t.id], t.id))
        steps += [s for s in cv if s.targets[0] == cheapest]
        runs = len(settings.levels) * settings.trials
        launches = max(1, round(runs * (1 + settings.confirm_share)))
        steps.append(step("selftest", f"selftest:{cheapest.id}", [cheapest], launches))
    steps += [s for s in cv if s.targets[0] in first and s not in steps]
    steps += [step("baseline", f"baseline:{t.id}", [t], 1) for t in later if t.id not in done.baselines]
    steps += [s for s in cv if s not in steps]
    steps.append(Step("report", "report", estimate_s=fixed_s["report"]))
    return Plan(tuple(steps), tuple(targets), dict(not_here))
