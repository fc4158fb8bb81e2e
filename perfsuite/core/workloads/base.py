"""What every workload kind shares: the scenario's identity, scale, measurement
plan, expectations and per-profile variants.

A kind subclasses :class:`BaseScenario` with its own fields and declares, as
class attributes, its name, the registered metrics its ranks produce, its
headline metric and the :class:`~perfsuite.core.protocol.WorkloadSpec` it sends to
the ranks. Launch, aggregation, judgement, baselines, relations and reporting
read only this interface, so they are the same code for every kind.
Torch-free.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from perfsuite.core import metrics as registry
from perfsuite.core.metrics import Metric, MetricError
from perfsuite.core.protocol import WorkloadSpec
from perfsuite.core.validation import ScenarioError, check_int, check_positive, fail, variant_keys_problem

if TYPE_CHECKING:
    from perfsuite.core.engines.base import MissingPackage

Outcome = Literal["ok", "oom"]
OUTCOMES: tuple[str, ...] = get_args(Outcome)
#: When a team's workflow runs a scenario, cheapest first: ``pr`` on every pull request (and
#: nightly), ``nightly`` only in the full nightly run (``--perf-tier``, perfsuite.plugin.tiers).
Tier = Literal["pr", "nightly"]
TIERS: tuple[str, ...] = get_args(Tier)


def tiers_up_to(tier: str) -> frozenset[str]:
    """The tiers a run of ``tier`` selects: it and the cheaper ones."""
    return frozenset(TIERS[: TIERS.index(tier) + 1])


_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


def _frozen_mapping(owner: str, name: str, value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    # Checked before anything iterates it, so a list or a number is named, not a TypeError.
    if value is not None and not isinstance(value, Mapping):
        raise fail(owner, name, f"must be a dict, got {value!r}")
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class BaseScenario:
    """One benchmark scenario of some workload kind.

    ``variants`` maps a profile name (``"cpu"``, ``"cuda-32gb"``) or device kind
    (``"cpu"``/``"cuda"``) to field overrides; :meth:`resolve` applies the most
    specific one. ``expect`` maps the same keys to ``"ok"`` or ``"oom"``.
    """

    kind: ClassVar[str]
    """Name of the workload kind (``train``, ...)."""
    metrics: ClassVar[tuple[str, ...]]
    """Registered metrics its ranks produce (see :mod:`perfsuite.core.metrics`)."""
    primary: ClassVar[str]
    """Its headline throughput metric: shown first, and its CV decides ``unreliable``."""

    group: str
    """First half of the id; scenarios of one group share a baseline file."""
    name: str
    """Second half of the id."""
    _: KW_ONLY
    world_size: int = 1
    """Ranks (GPUs on GPU profiles) of the seed experiment."""
    world_sizes: tuple[int, ...] = ()
    """Other world sizes at which this scenario means the same experiment
    (mixed precision on one card; sharding from 2 ranks). A GPU profile runs
    ``world_size`` if its GPUs hold it, else the largest of these that fits,
    keeping the work per rank (:meth:`at_world_size`)."""
    env: str = ""
    """Named Python environment its ranks run in (``--perf-env NAME=PYTHON``);
    "" is the interpreter running pytest. Its baselines live apart, under
    ``baselines/<profile>@<env>/``; without the environment it skips, naming
    the command that builds it."""
    nodes: int | None = None
    """Nodes the experiment spans (cluster rows name theirs), world_size / nodes
    ranks on each. Slurm places a run on as many of its nodes as the ranks need
    and ``--perf-launcher torchrun`` follows its own topology; the default
    local launcher emulates the nodes as that many torchrun agents on this
    host, meeting over loopback. None: whatever the launcher does."""
    warmup_steps: int = 3
    """Minimum warmup; more run until step times settle."""
    max_warmup_steps: int | None = None
    """Most warmup steps; default 3 x warmup_steps."""
    steps: int = 10
    """Measured steps (at least 2, to report a spread)."""
    tolerances: Mapping[str, float] = field(default_factory=dict)
    """Relative tolerance per metric, over the profile's default."""
    min_effect: float | None = None
    """The smallest slowdown that matters for this row in an A/B (0.05: steps 5% slower), over
    the profile's ``min_effect``; a variant may set it per profile. Not part of the definition."""
    max_imbalance: Mapping[str, float] = field(default_factory=dict)
    """Limits on max/min across ranks, e.g. {"peak_mem_mib": 1.5}: a straggler
    or a lopsided pipeline stage fails the scenario."""
    expect: Mapping[str, Outcome] = field(default_factory=dict)
    """Expected outcome per variant key; "ok" where absent."""
    variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Field overrides per profile name or device kind."""
    only_on: tuple[str, ...] = ()
    """Variant keys this scenario runs on; empty means everywhere. Elsewhere it
    skips without starting workers."""
    timeout_s: float | None = None
    """Wall-clock limit of one launch (default: the profile's)."""
    reference: str = ""
    """Which published row this reproduces."""
    tier: Tier = "pr"
    """When a workflow runs it: ``pr`` on every pull request and nightly, ``nightly`` only in
    the full nightly run (``--perf-tier pr`` deselects it). Not part of the definition."""
    judge_work: bool = True
    """Whether its counted step work is judged (``--perf-work``). False: counted and shown, never
    failing, for a row whose calls change by design between runs. Not part of the definition."""
    declared: Mapping[str, Any] = field(default_factory=dict)
    """Set by :meth:`resolve`, not by hand: the declared value of each field the
    applied variant changed (an fp16 row's precision where it runs bf16 on cpu),
    so the results file and the summaries can say so. Empty when declared."""

    def __post_init__(self) -> None:
        for name in ("tolerances", "max_imbalance", "expect", "variants", "declared"):
            object.__setattr__(self, name, _frozen_mapping(self.id, name, getattr(self, name)))
        for key, overrides in self.variants.items():
            if not isinstance(overrides, Mapping):
                raise fail(self.id, f"variants[{key!r}]", f"must be a dict of field overrides, got {overrides!r}")
        self.validate()
        self._validate_variants()

    @property
    def id(self) -> str:
        """Stable id: the pytest parameter id and the baseline key."""
        return f"{self.group}.{self.name}"

    # -- what a kind provides -------------------------------------------------------
    def validate(self) -> None:
        """Check every field; a kind extends this with its own (``super().validate()`` first)."""
        owner = self.id
        for name in ("group", "name"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _NAME_RE.match(value):
                raise fail(owner, name, "must be lowercase letters, digits, '_' or '-'")
        for name in ("world_size", "steps"):
            check_int(owner, name, getattr(self, name), 1)
        if not isinstance(self.world_sizes, tuple):
            raise fail(owner, "world_sizes", f"must be a tuple of ints, got {self.world_sizes!r}")
        for size in self.world_sizes:
            check_int(owner, "world_sizes", size, 1)
            try:
                self.at_world_size(size)
            except ScenarioError as exc:
                raise ScenarioError(f"{exc} (at world size {size} of world_sizes)") from None
        problem = variant_keys_problem(self.only_on)
        if problem:
            raise fail(owner, "only_on", problem)
        if not isinstance(self.env, str) or (self.env and not _NAME_RE.match(self.env)):
            raise fail(
                owner, "env", f"must name an environment (lowercase letters, digits, '_' or '-'), got {self.env!r}"
            )
        if self.nodes is not None:
            check_int(owner, "nodes", self.nodes, 1)
            if self.world_size % self.nodes:
                raise fail(owner, "nodes", f"must divide world_size={self.world_size}, got {self.nodes}")
        check_int(owner, "warmup_steps", self.warmup_steps, 0)
        if self.max_warmup_steps is not None:
            check_int(owner, "max_warmup_steps", self.max_warmup_steps, self.warmup_steps)
        if self.steps < 2:
            raise fail(owner, "steps", f"must be >= 2 to report a spread, got {self.steps}")
        if self.min_effect is not None and not (isinstance(self.min_effect, (int, float)) and 0 < self.min_effect < 10):
            raise fail(owner, "min_effect", f"must be a slowdown fraction above 0 (0.05 = 5%), got {self.min_effect!r}")
        for metric, tol in self.tolerances.items():
            self.metric(metric, "tolerances")
            if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol < 1:
                raise fail(owner, "tolerances", f"[{metric!r}] must be in [0, 1), got {tol!r}")
        for metric, limit in self.max_imbalance.items():
            if not self.metric(metric, "max_imbalance").imbalance:
                allowed = [m for m in self.metrics if registry.get(m).imbalance]
                raise fail(owner, "max_imbalance", f"names {metric!r}; use one of {', '.join(allowed)}")
            if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 1 <= limit < math.inf:
                raise fail(owner, "max_imbalance", f"[{metric!r}] must be a finite ratio >= 1, got {limit!r}")
        for key, outcome in self.expect.items():
            if outcome not in OUTCOMES:
                raise fail(owner, "expect", f"[{key!r}] must be one of {OUTCOMES}, got {outcome!r}")
        if self.timeout_s is not None:
            check_positive(owner, "timeout_s", self.timeout_s)
        if self.tier not in TIERS:
            raise fail(owner, "tier", f"must be one of {', '.join(TIERS)}, got {self.tier!r}")
        unknown = ", ".join(sorted(map(repr, set(self.declared) - _overridable(self))))
        if unknown:
            raise fail(owner, "declared", f"names no field a variant can change: {unknown}")

    def step_work(self) -> Mapping[str, float]:
        """Work of one step for each ``steps``-source metric it produces
        (samples/s: the global batch), the numerator of the rate."""
        raise NotImplementedError

    def at_world_size(self, size: int) -> BaseScenario:
        """This experiment on ``size`` ranks (a kind keeps the work per rank)."""
        return dataclasses.replace(self, world_size=size, world_sizes=())

    def fit(self, capacity: int) -> BaseScenario:
        """The scenario at the world size ``capacity`` ranks can hold: its own
        if it fits, else the largest of ``world_sizes`` that does (unchanged if none does)."""
        if self.world_size <= capacity:
            return self
        fitting = [n for n in self.world_sizes if n <= capacity]
        return self.at_world_size(max(fitting)) if fitting else self

    def picks(self) -> Mapping[str, tuple[str, ...]]:
        """What its rank picks at run time (a key of the rank's ``detail``), each with the
        metrics whose value follows the pick. Those are compared with a baseline only
        when the rank picked what the baseline's rank did: a best-shape search may pick
        another shape within noise of the last, and that shape's memory is another figure."""
        return {}

    def precondition(self, device: str) -> str | None:
        """Why this scenario cannot run on ``device`` (None if it can); checked
        before launching, so nothing starts for a scenario that must skip."""
        return None

    def missing_package(self, device: str) -> MissingPackage | None:
        """The engine package whose absence is the :meth:`precondition` on ``device`` (None if it is not)."""
        return None

    def probe_fields(self, rank_path: str, where: str = "") -> tuple[ScenarioError, ...]:
        """What child interpreters find wrong with this form's fields (a kind's part of :meth:`probe`;
        none by default). ``where`` ends the messages about the scenario's own fields (a variant's)."""
        return ()

    def rank_spec(self) -> WorkloadSpec:
        """The typed spec its ranks receive (built on :meth:`spec_fields`)."""
        raise NotImplementedError

    def rank_imports(self) -> tuple[str, ...]:
        """Modules its ranks import beyond torch and perfsuite's worker: the import set of the warm
        parent that forks its launches (:mod:`perfsuite.launch.warm`): its kind's runner module."""
        return (self.rank_spec().runner.partition(":")[0],)

    def spec_fields(self) -> dict[str, Any]:
        """The :class:`~perfsuite.core.protocol.WorkloadSpec` fields every kind fills the same way."""
        return {
            "id": self.id,
            "world_size": self.world_size,
            "warmup_steps": self.warmup_steps,
            "max_warmup_steps": self.warmup_limit,
            "steps": self.steps,
        }

    def to_config(self) -> dict[str, Any]:
        """The resolved scenario as plain JSON, for the results file."""
        return {
            **self.spec_fields(),
            "group": self.group,
            "name": self.name,
            "kind": self.kind,
            "primary": self.primary,
            **({"reference": self.reference} if self.reference else {}),
            **({"min_effect": self.min_effect} if self.min_effect is not None else {}),
            "tier": self.tier,
            **({"judge_work": False} if not self.judge_work else {}),
            "nodes": self.nodes,
            "env": self.env or "current",
            **({"declared": {name: _plain(value) for name, value in self.declared.items()}} if self.declared else {}),
        }

    # -- shared behaviour -------------------------------------------------------------
    def metric(self, name: str, where: str) -> Metric:
        """The registry entry of a metric this kind produces, or a ScenarioError for ``where``."""
        try:
            metric = registry.get(name)
        except MetricError as exc:
            raise fail(self.id, where, str(exc)) from None
        if name not in self.metrics:
            raise fail(self.id, where, f"names {name!r}, which {self.kind} scenarios do not produce: {self.metrics}")
        return metric

    @property
    def warmup_limit(self) -> int:
        return self.max_warmup_steps if self.max_warmup_steps is not None else 3 * self.warmup_steps

    def _validate_variants(self) -> None:
        allowed = _overridable(self)
        for key, overrides in self.variants.items():
            unknown = set(overrides) - allowed
            if unknown:
                raise fail(
                    self.id, f"variants[{key!r}]", f"overrides unknown fields {', '.join(sorted(map(repr, unknown)))}"
                )
            try:
                dataclasses.replace(self, variants={}, **overrides)
            except ScenarioError as exc:
                raise ScenarioError(f"{exc} (in variants[{key!r}])") from None

    def resolve(self, keys: tuple[str, ...]) -> BaseScenario:
        """This scenario as run on a profile whose variant keys are ``keys``.

        The first key that has a variant wins (profile name before device kind).
        """
        for key in keys:
            if key in self.variants:
                overrides = self.variants[key]
                changed = {name: getattr(self, name) for name, new in overrides.items() if new != getattr(self, name)}
                return dataclasses.replace(self, variants={}, declared=changed, **overrides)
        return dataclasses.replace(self, variants={})

    def probe(self, rank_path: str) -> tuple[ScenarioError, ...]:
        """What child interpreters find wrong with this scenario and its variants, declared form
        first, each problem once (empty: nothing); ``rank_path`` is the ranks' PYTHONPATH. The checks
        construction leaves out, so that a rank decodes its job without a child: the collection step
        runs them (:mod:`perfsuite.plugin.collection`)."""
        found = list(self.probe_fields(rank_path))
        for key, overrides in self.variants.items():
            variant = dataclasses.replace(self, variants={}, **overrides)
            found += variant.probe_fields(rank_path, f" (in variants[{key!r}])")
        return tuple({str(error): error for error in found}.values())

    def expected_outcome(self, keys: tuple[str, ...]) -> Outcome:
        for key in keys:
            if key in self.expect:
                return self.expect[key]
        return "ok"


def _overridable(scenario: BaseScenario) -> set[str]:
    """The fields a variant may override."""
    # A tier is the scenario's, on every profile: the workflow selects by it before fitting.
    return {f.name for f in dataclasses.fields(scenario)} - {"group", "name", "variants", "declared", "tier", "_"}


def _plain(value: Any) -> Any:
    """A field's value as JSON: a dataclass or a mapping as an object, a tuple as a list."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    return value


def ran_otherwise(config: Mapping[str, Any]) -> str | None:
    """What a results ``config`` ran unlike its declaration, e.g. ``fp16 row ran
    bf16 on this profile`` for a row whose cpu variant runs bf16 (None if its
    precision is the declared one)."""
    declared = (config.get("declared") or {}).get("precision")
    ran = config.get("precision")
    if declared is None or declared == ran:
        return None
    return f"{declared} row ran {ran} on this profile"


__all__ = ["OUTCOMES", "BaseScenario", "Outcome", "ran_otherwise"]
