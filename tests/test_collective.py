"""The collective workload kind: nccl-tests' bandwidth definitions and validation."""

from __future__ import annotations

import pytest

from perfsuite import Collective, ScenarioError
from perfsuite.core.workloads.collective import bus_factor

MIB = 2**20


@pytest.mark.parametrize(
    ("op", "world", "factor"),
    [("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75)],
)
def test_bus_factor_follows_nccl_tests(op: str, world: int, factor: float) -> None:
    assert bus_factor(op, world) == factor


def test_work_per_step_is_the_message_times_iterations() -> None:
    scenario = Collective("c", "ar", op="all_reduce", size_bytes=64 * MIB, iterations=4, world_size=8)
    work = scenario.step_work()
    assert work["algbw_gbps"] == pytest.approx(4 * 64 * MIB / 1e9)
    assert work["busbw_gbps"] == pytest.approx(work["algbw_gbps"] * 1.75)
    assert scenario.fit(2).world_size == 8  # no world_sizes declared: it keeps its size (and skips)
    assert scenario.to_config()["bus_factor"] == 1.75


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"op": "broadcast"}, "op"),
        ({"world_size": 1}, "world_size"),
        ({"size_bytes": 6}, "size_bytes"),  # not a multiple of 4 bytes x 2 ranks
        ({"tolerances": {"samples_per_s": 0.1}}, "tolerances"),  # a metric this kind does not produce
    ],
)
def test_bad_collective_names_the_field(overrides: dict[str, object], field: str) -> None:
    fields: dict[str, object] = {"world_size": 2, **overrides}
    with pytest.raises(ScenarioError, match=f"field '{field}'"):
        Collective("c", "x", **fields)  # type: ignore[arg-type]
