"""Same-session hardware ceilings: the best matmul TFLOP/s this session measured.

A training figure means more beside what this machine, today, can do at
best: a slower card or a throttled one lowers the ceiling too, while a slower
software stack lowers only the training figure. Microbenchmark scenarios
(``microbench`` kind, matmul ops) therefore run first in a session
(:func:`ceilings_first`), their best TFLOP/s per dtype is kept here, and every
training result then also reports its achieved TFLOP/s per rank as a fraction
of the ceiling of its precision, beside MFU against the datasheet. The
ceilings go into the results file. Pytest side, torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from perfsuite.judge.flops import rank_flops

MATMUL_OPS = ("matmul", "matmul_best")


@dataclass(frozen=True)
class Ceiling:
    """The best matmul figure of one dtype measured in this session."""

    dtype: str
    """Math mode: fp32, tf32, fp16, bf16 or fp8."""
    tflops: float
    """Mean TFLOP/s of the fastest matmul scenario of this dtype."""
    scenario: str
    """Id of the scenario that measured it."""


class Ceilings:
    """Best matmul TFLOP/s per dtype, offered every finished result of the session."""

    def __init__(self) -> None:
        self.best: dict[str, Ceiling] = {}

    def offer(self, config: Mapping[str, Any], status: str, tflops: float | None) -> None:
        """Keep ``tflops`` if ``config`` is a matmul microbenchmark that ran and beat the dtype's best so far."""
        if config.get("kind") != "microbench" or config.get("op") not in MATMUL_OPS or status != "ok":
            return
        if tflops is None:
            return
        dtype = str(config["dtype"])
        if dtype not in self.best or tflops > self.best[dtype].tflops:
            self.best[dtype] = Ceiling(dtype, tflops, str(config["id"]))

    def fraction(
        self, config: Mapping[str, Any], step_time_s: float, counted: float | None = None
    ) -> dict[str, Any] | None:
        """A training run's achieved TFLOP/s per rank against its precision's ceiling (None without
        one, or without FLOPs: no formula and no ``counted`` figure)."""
        if "model" not in config or "precision" not in config:
            return None
        ceiling = self.best.get(str(config["precision"]))
        flops = rank_flops(config, counted)
        if ceiling is None or flops is None:
            return None
        achieved = flops[0] / step_time_s / 1e12
        return {
            "value": achieved / ceiling.tflops,
            "achieved_tflops_per_rank": achieved,
            "ceiling_tflops": ceiling.tflops,
            "ceiling_scenario": ceiling.scenario,
            "formula": flops[1],
        }

    def to_json(self) -> dict[str, Any]:
        return {dtype: asdict(ceiling) for dtype, ceiling in sorted(self.best.items())}


#: Workload kinds that measure the hardware rather than a stack: they run first.
CEILING_KINDS = ("microbench", "membw")


def is_ceiling_test(params: Mapping[str, Any]) -> bool:
    """Whether a test's parameters make it a hardware-ceiling scenario."""
    scenario = params.get("scenario")
    return getattr(scenario, "kind", None) in CEILING_KINDS


def ceilings_first(items: Sequence[Any]) -> list[Any]:
    """``items`` with the ceiling-setting tests first, otherwise in their order."""
    params = [getattr(getattr(item, "callspec", None), "params", {}) for item in items]
    first = [item for item, p in zip(items, params, strict=True) if is_ceiling_test(p)]
    return first + [item for item, p in zip(items, params, strict=True) if not is_ceiling_test(p)]
