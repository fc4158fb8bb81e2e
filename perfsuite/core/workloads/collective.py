"""Workload kind ``collective``: the bandwidth of one collective operation.

Ranks time ``iterations`` back-to-back all-reduce, all-gather or
reduce-scatter calls per step on a message of ``size_bytes`` (NCCL on GPUs,
gloo on cpu). Bandwidths follow nccl-tests' definitions (its PERFORMANCE.md):

* algbw = S / t, with S the message: the all-reduce buffer, the all-gather
  output (n x each rank's input), the reduce-scatter input (n x each output);
* busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and
  reduce-scatter: the rate the busiest link carries, comparable across n.

Rank side: :class:`perfsuite.rank.worker.collective.CollectiveRunner`. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

from perfsuite.core.protocol import WorkloadSpec
from perfsuite.core.validation import check_choice, check_int, fail
from perfsuite.core.workloads.base import BaseScenario

Op = Literal["all_reduce", "all_gather", "reduce_scatter"]
OPS: tuple[str, ...] = get_args(Op)
Dtype = Literal["fp32", "bf16", "fp16"]
DTYPES: tuple[str, ...] = get_args(Dtype)
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw for ``op`` on ``world_size`` ranks."""
    n = world_size
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


@dataclass(frozen=True)
class CollectiveSpec(WorkloadSpec):
    """What a rank needs to time one collective."""

    runner: ClassVar[str] = "perfsuite.rank.worker.collective:CollectiveRunner"

    op: Op
    """all_reduce, all_gather or reduce_scatter."""
    size_bytes: int
    """The message S as nccl-tests defines it (see the module docstring)."""
    dtype: Dtype
    """Element type."""
    iterations: int
    """Collectives per timed step."""


@dataclass(frozen=True)
class Collective(BaseScenario):
    """A collective's bandwidth at one message size."""

    kind: ClassVar[str] = "collective"
    metrics: ClassVar[tuple[str, ...]] = ("busbw_gbps", "algbw_gbps", "peak_mem_mib")
    primary: ClassVar[str] = "busbw_gbps"

    op: Op = "all_reduce"
    """all_reduce, all_gather or reduce_scatter."""
    size_bytes: int = 2**20
    """The message S (nccl-tests' definition)."""
    dtype: Dtype = "fp32"
    """Element type."""
    iterations: int = 1
    """Collectives per timed step: more amortise the clock for small messages."""

    def validate(self) -> None:
        super().validate()
        check_choice(self.id, "op", self.op, OPS)
        check_choice(self.id, "dtype", self.dtype, DTYPES)
        check_int(self.id, "iterations", self.iterations, 1)
        check_int(self.id, "size_bytes", self.size_bytes, 1)
        if self.world_size < 2:
            raise fail(self.id, "world_size", f"must be >= 2 for a collective to move data, got {self.world_size}")
        unit = ELEMENT_BYTES[self.dtype] * self.world_size
        if self.size_bytes % unit:
            raise fail(self.id, "size_bytes", f"must be a multiple of element size x world_size = {unit}")

    def step_work(self) -> Mapping[str, float]:
        gigabytes = self.size_bytes * self.iterations / 1e9
        return {"algbw_gbps": gigabytes, "busbw_gbps": gigabytes * bus_factor(self.op, self.world_size)}

    def rank_spec(self) -> CollectiveSpec:
        return CollectiveSpec(
            **self.spec_fields(),
            op=self.op,
            size_bytes=self.size_bytes,
            dtype=self.dtype,
            iterations=self.iterations,
        )

    def to_config(self) -> dict[str, Any]:
        return {
            **super().to_config(),
            "op": self.op,
            "size_bytes": self.size_bytes,
            "dtype": self.dtype,
            "iterations": self.iterations,
            "bus_factor": bus_factor(self.op, self.world_size),
        }


__all__ = ["OPS", "Collective", "CollectiveSpec", "bus_factor"]
