"""What one training step does, counted: the ops it calls and the bytes they read, its host
syncs, its collectives with their bytes, a compiled row's graphs and graph breaks, and the exact
judgement of those counts against a recorded baseline.

Timing is noisy and tied to one machine; these counts are not. The same code on the same library
versions calls the same ops with the same shapes every steady-state step, on any processor
(docs/lab/work-counts.md measures it), so they are judged exactly, with no repeats, on the
cheapest runner. A rank counts a few untimed steps after its measured ones
(:mod:`perfsuite.rank.worker.workcount`); the pytest side sums the ranks, stores the sum beside
the baselines (:mod:`perfsuite.store.workstore`) and compares (:func:`compare`).

Only *top-level* calls count: the ones the user's code, autograd or an engine made, not the
calls inside another op, whose choice of kernels can follow the processor's ISA. Torch-free:
both sides import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

VERSION = 1
N = TypeVar("N", int, float)
#: Steps a rank counts, each on its own; counts that differ between them are not steady.
STEPS = 2
#: Ops that read a tensor's value or size back to the host: on CUDA each blocks until the device
#: catches up, and on cpu they mark the same code path. ``bool(t)`` is ``is_nonzero``; ``.item()``
#: is ``item`` (with ``_local_scalar_dense`` inside it, not counted again); ``nonzero``,
#: ``masked_select`` and the ``unique`` family size their output from the data.
SYNC_OPS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::is_nonzero",
        "aten::nonzero",
        "aten::masked_select",
        "aten::_unique2",
        "aten::unique_consecutive",
    }
)
#: Relative growth of the step's op calls or collective bytes that fails it:
#: counts are exact, so any growth is a change of code; this keeps a rounding of per-step means
#: (a call every third step) from failing alone.
MAX_GROWTH = 0.01
#: Differences listed after the costed ones, largest first.
LISTED = 5


@dataclass(frozen=True)
class WorkCount:
    """One step's work, per step, summed over the ranks."""

    ops: Mapping[str, float]
    """Top-level op calls by ``name(dtype)``: the dtype of the op's first tensor input, if any."""
    collectives: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Collective calls by kind (``all_reduce``, ``reduce_scatter``...), as the backend ran them."""
    collective_bytes: float = 0.0
    """Bytes the collectives' input tensors hold, as the backend recorded them."""
    op_bytes: float | None = None
    """Bytes the top-level ops' tensor inputs hold (shape x element size, as the profiler recorded
    them): what the step's ops read. An upcast, or a matmul left in fp32 under autocast, reads more
    with the same calls. None: counted by a perfsuite that did not count it."""
    graphs: int | None = None
    """Graphs torch.compile compiled since the rank started (dynamo's ``unique_graphs``): a graph
    break or a recompile adds one. None: counted by a perfsuite that did not count it."""
    graph_breaks: int | None = None
    """Graph breaks dynamo met since the rank started (its ``graph_break`` counter)."""
    kernels: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Device activities per step by name (kernels, copies, memsets), as the profiler recorded them
    on the device's timeline; empty on cpu. Names follow the card (a cuBLAS kernel per
    architecture), so they are compared within one profile."""
    ranks: int = 1
    steady: bool = True
    """Whether every counted step made the same calls; a step that varies (data-dependent control
    flow, an fp16 step the loss scaler skipped) cannot be judged exactly."""
    varied: tuple[str, ...] = ()
    """Where counted steps differed, the first differences (``aten::copy_(float) 12 vs 14``)."""
    version: int = VERSION

    @property
    def calls(self) -> float:
        """Ops dispatched per step: on a GPU each launches at least one kernel."""
        return sum(self.ops.values())

    @property
    def syncs(self) -> dict[str, float]:
        """Host syncs per step, by op."""
        return {name: n for name, n in self.ops.items() if op_name(name) in SYNC_OPS}

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ops": dict(sorted(self.ops.items()))}


def op_name(key: str) -> str:
    """``aten::mm`` of ``aten::mm(float)``."""
    return key.split("(", 1)[0]


def merge(counts: list[WorkCount]) -> WorkCount:
    """The ranks' counts as one job's: summed (a pipeline's stages do different work)."""

    def summed(field: str) -> dict[str, float]:
        total: dict[str, float] = {}
        for count in counts:
            for key, n in getattr(count, field).items():
                total[key] = total.get(key, 0.0) + n
        return total

    return WorkCount(
        summed("ops"),
        summed("collectives"),
        sum(c.collective_bytes for c in counts),
        _total([c.op_bytes for c in counts]),
        _total([c.graphs for c in counts]),
        _total([c.graph_breaks for c in counts]),
        summed("kernels"),
        ranks=sum(c.ranks for c in counts),
        steady=all(c.steady for c in counts),
        varied=tuple(dict.fromkeys(v for c in counts for v in c.varied)),
    )


def _total(values: list[N | None]) -> N | None:
    """The ranks' sum, or None where a rank did not count it."""
    present = [v for v in values if v is not None]
    return sum(present[1:], present[0]) if present and len(present) == len(values) else None


# -- the judgement --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Growth:
    """One costed quantity that grew: it fails the step."""

    what: str
    base: float
    current: float
    in_bytes: bool = False
    """A number of bytes (said in MiB, ``what`` naming how they are used), not a count of calls."""
    per_step: bool = True
    """Counted per step; else over the rank's whole run (compiled graphs, graph breaks)."""

    def describe(self) -> str:
        if self.in_bytes:
            return f"{_mib(self.current - self.base)} MiB {self.what} per step ({_pct(self)})"
        return f"{self.what}: {self.current:g} {'per step' if self.per_step else 'in the run'}, was {self.base:g}"


@dataclass(frozen=True)
class WorkDiff:
    """A step's counts against the baseline's: what grew (failing) and how the op mix moved."""

    grown: tuple[Growth, ...]
    ops: tuple[tuple[str, float, float], ...]
    """Every op whose calls changed: name, baseline calls, current calls; largest change first."""
    kernels: tuple[tuple[str, float, float], ...] = ()
    """Every device activity whose count changed, as ``ops``."""

    @property
    def failed(self) -> bool:
        return bool(self.grown)

    @property
    def changed(self) -> bool:
        return bool(self.grown or self.ops or self.kernels)

    def describe(self) -> str:
        """One line: the costed growth first, then the ops that moved."""
        if not self.changed:
            return "work unchanged"
        parts = [g.describe() for g in self.grown]
        return "; ".join([*parts, *_listed("op calls per step", self.ops), *_listed("kernels per step", self.kernels)])

    def to_json(self) -> dict[str, Any]:
        return {
            "failed": self.failed,
            "message": self.describe(),
            "grown": [dataclasses.asdict(g) for g in self.grown],
            "ops": [{"op": name, "baseline": then, "current": now} for name, then, now in self.ops],
            "kernels": [{"kernel": name, "baseline": then, "current": now} for name, then, now in self.kernels],
        }


def compare(base: WorkCount, current: WorkCount) -> WorkDiff:
    """``current`` against ``base``. Any new host sync, collective call, compiled graph or graph
    break fails; so does growth beyond :data:`MAX_GROWTH` in the op calls, the bytes they read or the
    collectives' bytes. A quantity one side did not count is not judged. A different mix of ops with
    none of these growing passes, its difference listed."""
    grown = [
        *_each_grew("host syncs", base.syncs, current.syncs),
        *_each_grew("collective", base.collectives, current.collectives),
        *_grew("graph breaks", base.graph_breaks, current.graph_breaks, 0.0, per_step=False),
        *_grew("compiled graphs", base.graphs, current.graphs, 0.0, per_step=False),
        *_grew("op calls", base.calls, current.calls, MAX_GROWTH),
        *_grew("read by ops", base.op_bytes, current.op_bytes, MAX_GROWTH, in_bytes=True),
        *_grew("moved by collectives", base.collective_bytes, current.collective_bytes, MAX_GROWTH, in_bytes=True),
        *_grew("device kernels", *_kernels(base, current), MAX_GROWTH),
    ]
    return WorkDiff(tuple(grown), tuple(moved(base.ops, current.ops)), tuple(moved(base.kernels, current.kernels)))


def _kernels(base: WorkCount, current: WorkCount) -> tuple[float | None, float | None]:
    """Device activities per step on each side; None (not judged) where either side recorded none:
    a cpu run, or a recording from before they were counted."""
    if not base.kernels or not current.kernels:
        return None, None
    return sum(base.kernels.values()), sum(current.kernels.values())


def _listed(what: str, found: tuple[tuple[str, float, float], ...]) -> list[str]:
    """``what: name +n, ...`` for the largest changes, or nothing."""
    shown = [f"{name} {now - then:+g}" for name, then, now in found[:LISTED]]
    more = f" and {len(found) - LISTED} more" if len(found) > LISTED else ""
    return [f"{what}: {', '.join(shown)}{more}"] if shown else []


def moved(base: Mapping[str, float], current: Mapping[str, float]) -> list[tuple[str, float, float]]:
    """Each key whose count differs: key, then and now; the largest change first."""
    found = [(k, base.get(k, 0.0), current.get(k, 0.0)) for k in sorted(set(base) | set(current))]
    return sorted((m for m in found if abs(m[2] - m[1]) > 1e-9), key=lambda m: -abs(m[2] - m[1]))


def _each_grew(what: str, base: Mapping[str, float], current: Mapping[str, float]) -> list[Growth]:
    """One growth per key whose count rose: ``host syncs aten::item``."""
    return [
        Growth(f"{what} {key}", base.get(key, 0.0), n) for key, n in sorted(current.items()) if n > base.get(key, 0.0)
    ]


def _grew(
    what: str, base: float | None, current: float | None, limit: float, in_bytes: bool = False, per_step: bool = True
) -> list[Growth]:
    if base is None or current is None:  # one side did not count it
        return []
    return [Growth(what, base, current, in_bytes, per_step)] if current > base * (1 + limit) + 1e-9 else []


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:+.3g}"


def _pct(growth: Growth) -> str:
    return f"{growth.current / growth.base - 1:+.1%}" if growth.base else "none before"
