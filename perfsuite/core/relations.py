"""Relations between scenarios measured in the same run ("ZeRO-2 holds less
model state per rank than ZeRO-1", "AMP is faster than fp32").

Declared as data next to the scenarios and checked as tests of their own. They
compare two runs of one session on one machine, so they hold however fast the
machine is. That makes them the right gate for shape claims from the seed
tables, which were measured on other hardware.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from perfsuite.core import metrics as registry
from perfsuite.core.validation import ScenarioError, variant_keys_problem
from perfsuite.core.workloads.base import BaseScenario

Op = Literal["<", ">", "~"]
_OPS: dict[str, Callable[[float, float], bool]] = {"<": operator.lt, ">": operator.gt}


@dataclass(frozen=True)
class Relation:
    """``left.metric  op  factor * right.metric``.

    ``op`` is ``<``/``>`` (strict) or ``~`` (equal within ``tolerance``,
    relative). ``factor`` may be ``"1/world_size"``, resolved with the left
    scenario's resolved world size (sharding over N ranks), or ``"scaling"``:
    ``efficiency`` x left's world size / right's (both as run), so
    ``Relation("samples_per_s", on_4, ">", on_1, factor="scaling", efficiency=0.7)``
    says 4 ranks deliver more than 70% of 4x one rank's throughput. The outcome
    reports the scaling efficiency reached whatever the verdict.
    ``only_on`` limits the relation to profiles with one of these variant keys
    (e.g. ``("cuda",)`` for throughput claims that only hold on GPUs).
    """

    metric: str
    left: BaseScenario
    op: Op
    right: BaseScenario
    factor: float | Literal["1/world_size", "scaling"] = 1.0
    tolerance: float = 0.0
    efficiency: float = 1.0
    only_on: tuple[str, ...] = ()
    why: str = ""

    def __post_init__(self) -> None:
        usable = [m for m in self.left.metrics if m in self.right.metrics and registry.get(m).relations]
        if self.metric not in usable:
            raise ScenarioError(f"relation {self.id}: field 'metric' must be one of {usable}, got {self.metric!r}")
        if self.op not in ("<", ">", "~"):
            raise ScenarioError(f"relation {self.id}: field 'op' must be '<', '>' or '~', got {self.op!r}")
        if self.op == "~" and not 0 < self.tolerance < 1:
            raise ScenarioError(f"relation {self.id}: field 'tolerance' must be in (0, 1) for '~'")
        if isinstance(self.factor, str) and self.factor not in ("1/world_size", "scaling"):
            raise ScenarioError(f"relation {self.id}: field 'factor' must be a number, '1/world_size' or 'scaling'")
        if not 0 < self.efficiency <= 1 or (self.efficiency != 1.0 and self.factor != "scaling"):
            raise ScenarioError(f"relation {self.id}: field 'efficiency' must be in (0, 1], with factor='scaling'")
        problem = variant_keys_problem(self.only_on)
        if problem:
            raise ScenarioError(f"relation {self.id}: field 'only_on' {problem}")

    @property
    def id(self) -> str:
        factor = "" if self.factor == 1.0 else f"{self.factor}*"
        if self.factor == "scaling":
            factor = f"{self.efficiency:g}*scaling*"
        return f"{self.left.group}.{self.metric}:{self.left.name}{self.op}{factor}{self.right.name}"


@dataclass(frozen=True)
class RelationOutcome:
    relation: Relation
    status: Literal["holds", "violated", "skipped"]
    message: str
    left_value: float | None = None
    right_value: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.relation.id,
            "metric": self.relation.metric,
            "left": self.relation.left.id,
            "op": self.relation.op,
            "right": self.relation.right.id,
            "status": self.status,
            "left_value": self.left_value,
            "right_value": self.right_value,
            "message": self.message,
        }


def resolve_factor(relation: Relation, left_world: int, right_world: int) -> float:
    """The relation's factor as a number, for the world sizes the two scenarios ran at."""
    if relation.factor == "1/world_size":
        return 1.0 / left_world
    if relation.factor == "scaling":
        return relation.efficiency * left_world / right_world
    return float(relation.factor)


def evaluate(relation: Relation, left: Any, right: Any) -> RelationOutcome:
    """Decide a relation from two ScenarioResults (world sizes as they ran)."""
    for side in (left, right):
        if side.status != "ok" or side.metrics is None:
            return RelationOutcome(
                relation, "skipped", f"{side.scenario.id} did not train ({side.status}: {side.judgement.message})"
            )
    a = left.metrics.value(relation.metric)
    factor = resolve_factor(relation, left.scenario.world_size, right.scenario.world_size)
    b = factor * right.metrics.value(relation.metric)
    if relation.op == "~":
        holds = abs(a - b) <= relation.tolerance * abs(b)
        claim = f"within {relation.tolerance:.0%} of"
    else:
        holds = _OPS[relation.op](a, b)
        claim = {"<": "less than", ">": "greater than"}[relation.op]
    scaled = f"{factor:.3g} x " if factor != 1.0 else ""
    message = (
        f"{relation.left.name} {relation.metric} = {a:.6g} is {'' if holds else 'NOT '}{claim} "
        f"{scaled}{relation.right.name}'s ({b:.6g})"
    )
    if relation.factor == "scaling":
        ratio = left.scenario.world_size / right.scenario.world_size
        reached = a / (ratio * right.metrics.value(relation.metric))
        message += f"; scaling efficiency {reached:.0%} ({ratio:g}x ranks), required {relation.efficiency:.0%}"
    if relation.why:
        message += f" [{relation.why}]"
    return RelationOutcome(relation, "holds" if holds else "violated", message, a, b)


def chain(metric: str, op: Op, scenarios: Sequence[BaseScenario], **kwargs: Any) -> list[Relation]:
    """``a > b > c`` as the relations ``a > b`` and ``b > c``."""
    return [Relation(metric, a, op, b, **kwargs) for a, b in itertools.pairwise(scenarios)]
