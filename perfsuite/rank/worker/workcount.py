"""A rank's count of what a step does (:class:`perfsuite.core.workcount.WorkCount`): a few
untimed steps under the autograd profiler after the measured ones, each counted on its own.

Counted per step from the profiler's events:

* top-level op calls: ``aten::``/``c10d::`` events with no such op above them, by name and the
  dtype of their first tensor input. Calls inside another op are left out: which kernels an op
  runs may follow the processor (oneDNN, AMX), what the code calls does not;
* the bytes those top-level calls read: their tensor inputs' recorded shapes times element size;
* collectives: the backend's own records (``gloo:all_reduce``, ``nccl:all_reduce``), which DDP's
  reducer and ZeRO's hooks leave too, though they call the process group from C++, and their
  bytes from those records' shapes and dtypes;
* torch.compile's graphs and graph breaks since the rank started, from dynamo's counters (not
  per step: a row compiles in its warmup).
* on a GPU, the device's activities (kernels, copies, memsets) by name, placed in the step whose
  span they ran in (the timer synchronises at each step's end), and the runtime's host syncs
  (``cudaStreamSynchronize`` and kin) wherever they are called from.

Work inside a ``perfsuite::`` region (the planted slowdown) is perfsuite's, not the step's, and the
profiler's own step markers are not ops. Memory is not profiled: the profiler's memory records come
from every thread that allocates, a collective backend's included, and one rank in about three
hundred launches of the self-tests died of a corrupted heap with them on (docs/lab/work-counts.md).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler import profile, record_function

from perfsuite.core.opprofile import REGION_PREFIX
from perfsuite.core.workcount import STEPS, SYNC_OPS, WorkCount, moved

#: Name prefixes of the ops that count: ATen's and the distributed ops'.
OP_PREFIXES = ("aten::", "c10d::")
#: The process-group backends' own records of a collective: ``gloo:all_reduce``.
BACKEND_PREFIXES = ("gloo:", "nccl:", "mpi:", "ucc:")
#: The CUDA runtime's calls that block the host until the device catches up.
RUNTIME_SYNCS = frozenset(name for name in SYNC_OPS if name.startswith("cuda"))
#: The regions that mark each counted step: the name torch.profiler's own schedule gives steps, and
#: not a ``perfsuite::`` one, whose work would be left out.
STEP_MARK = "ProfilerStep"
#: Bytes per element of the dtype names the profiler records.
_ITEM_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "short": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::complex<float>": 8,
}


def count_steps(step: Callable[[], float], device: torch.device, steps: int = STEPS) -> WorkCount:
    """``steps`` calls of ``step`` under the profiler, each counted on its own; ``steady`` says
    whether they agreed. No step is discarded: the profiler's start-up slows the first one, which
    counts do not see. The autograd profiler, not ``torch.profiler.profile``: the latter's start
    imports ``torch._inductor`` where it is not yet (0.9 s a rank, measured), to read one setting."""
    with profile(use_cpu=True, use_device="cuda" if device.type == "cuda" else None, record_shapes=True) as prof:
        for n in range(steps):
            with record_function(f"{STEP_MARK}#{n}"):
                step()
    counted = count(prof.kineto_results.events())
    if not counted:
        raise RuntimeError("the profiler recorded no step markers: the step's work cannot be counted")
    first, rest = counted[0], counted[1:]
    varied = tuple(dict.fromkeys(d for other in rest for d in differences(first, other)))[:MAX_VARIED]
    graphs, breaks = compiled()
    return dataclasses.replace(first, steady=not varied, varied=varied, graphs=graphs, graph_breaks=breaks)


def compiled() -> tuple[int, int]:
    """torch.compile's graphs and graph breaks in this process so far: none where dynamo was never
    imported (torch.compile imports it; importing it here would cost a rank a second)."""
    if "torch._dynamo.utils" not in sys.modules:
        return 0, 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


#: Differences between counted steps a rank reports (the first few say enough).
MAX_VARIED = 8


def differences(one: WorkCount, other: WorkCount) -> list[str]:
    """What two steps' counts differ in: ``aten::copy_(float) 12 vs 14``."""
    keys = [*moved(one.ops, other.ops), *moved(one.collectives, other.collectives), *moved(one.kernels, other.kernels)]
    found = [f"{key} {a:g} vs {b:g}" for key, a, b in keys]
    for name in ("collective_bytes", "op_bytes"):
        a, b = getattr(one, name), getattr(other, name)
        if a != b:
            found.append(f"{name} {a:g} vs {b:g}")
    return found


@dataclass
class _Tally:
    """One step's counts as they accumulate."""

    ops: Counter[str] = field(default_factory=Counter)
    collectives: Counter[str] = field(default_factory=Counter)
    kernels: Counter[str] = field(default_factory=Counter)
    collective_bytes: float = 0.0
    op_bytes: float = 0.0

    def result(self) -> WorkCount:
        return WorkCount(
            dict(self.ops), dict(self.collectives), self.collective_bytes, self.op_bytes, kernels=dict(self.kernels)
        )


def count(events: Sequence[Any]) -> list[WorkCount]:
    """Each counted step's work, from the profiler's raw events.

    Read directly rather than through ``FunctionEvent`` objects, whose building costs a rank
    seconds on a step of ten thousand calls: events nest by time on their thread, so a stack per
    thread says which calls are top-level and which run inside a ``perfsuite::`` region."""
    marks = sorted((e.start_ns(), e.end_ns()) for e in events if e.name().startswith(STEP_MARK))
    tallies = [_Tally() for _ in marks]
    for ordered in _by_thread(events).values():
        _walk(ordered, marks, tallies)
    for e in events:
        if e.device_type() != DeviceType.CPU and (step := _step_of(e.start_ns(), marks)) is not None:
            tallies[step].kernels[e.name()] += 1
    return [t.result() for t in tallies]


def _by_thread(events: Iterable[Any]) -> dict[int, list[Any]]:
    """Host events per thread, outer before inner: by start, then the longer first."""
    threads: dict[int, list[Any]] = {}
    for e in events:
        if e.device_type() == DeviceType.CPU and not e.name().startswith(STEP_MARK):
            threads.setdefault(e.start_thread_id(), []).append(e)
    # Ties keep the profiler's order, which records a call before the calls it makes.
    return {t: sorted(found, key=lambda e: (e.start_ns(), -e.end_ns())) for t, found in threads.items()}


def _walk(ordered: Sequence[Any], marks: Sequence[tuple[int, int]], tallies: Sequence[_Tally]) -> None:
    """Count one thread's events into their steps' tallies."""
    stack: list[tuple[int, bool, bool]] = []  # (end, inside a region, inside an op)
    for e in ordered:
        start, end, name = e.start_ns(), e.end_ns(), e.name()
        while stack and (start >= stack[-1][0] or end > stack[-1][0]):
            stack.pop()  # torch's own nesting rule (profiler_util's _populate_cpu_children)
        region, in_op = stack[-1][1:] if stack else (False, False)
        region = region or name.startswith(REGION_PREFIX)
        is_op = name.startswith(OP_PREFIXES)
        if e.is_async():
            # An async call (a pipeline's irecv) ends when its work does: it encloses nothing, as in
            # torch's own event tree, and nothing encloses it.
            in_op = False
        else:
            stack.append((end, region, in_op or is_op))
        step = _step_of(start, marks)
        if region or step is None:
            continue
        tally = tallies[step]
        if name in RUNTIME_SYNCS:  # inside an op or not: each blocks the host
            tally.ops[name] += 1
        if name.startswith(BACKEND_PREFIXES):
            tally.collectives[name.split(":", 1)[1]] += 1
            tally.collective_bytes += tensor_bytes(e.structured_input_shapes(), e.dtypes())
        if is_op and not in_op:
            dtypes = e.dtypes()
            tally.ops[_key(name, dtypes)] += 1
            tally.op_bytes += tensor_bytes(e.structured_input_shapes(), dtypes)


def _step_of(start: int, marks: Sequence[tuple[int, int]]) -> int | None:
    return next((i for i, (first, last) in enumerate(marks) if first <= start <= last), None)


def _key(name: str, dtypes: Sequence[str]) -> str:
    """``aten::mm(float)``: the op and the dtype of its first tensor input, if any."""
    found = next((d for d in dtypes if d), "")
    return f"{name}({found})" if found else name


def tensor_bytes(shapes: Sequence[Any], dtypes: Sequence[str]) -> float:
    """The bytes of an event's tensor inputs (tensor lists included), from the recorded shapes and dtypes."""
    total = 0.0
    for shape, dtype in zip(shapes, dtypes, strict=False):
        size = _ITEM_BYTES.get(dtype, 0)
        tensors = shape if shape and isinstance(shape[0], list) else [shape]
        for dims in tensors:
            if size and isinstance(dims, list):
                total += math.prod(int(d) for d in dims) * size
    return total
