"""A rank's op profile: a few steady-state steps under ``torch.profiler``, summarised per op.

Runs after the measured steps of a launch that asked for it
(``RankJob.profile_steps``), so it never touches a measured step. The summary
is an :class:`perfsuite.core.opprofile.OpProfile`; the full Chrome trace goes next
to the rank's report, gzipped, unless it is over the size cap.
"""

from __future__ import annotations

import gzip
import pickle
import re
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from perfsuite.core.opprofile import REGION_PREFIX, OpProfile, OpStat, top

#: Largest gzipped trace kept per rank (MiB); above it only the summary remains.
MAX_TRACE_MIB = 20


def run_profiled(
    step: Callable[[], float], steps: int, device: torch.device, unprofiled_step_s: float, trace: Path | None
) -> OpProfile:
    """``steps`` calls of ``step`` (each returns its wall time) under the profiler, summarised."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # One step under the profiler first, then discarded: the profiler's own start-up lands in it.
    plan = schedule(wait=0, warmup=1, active=steps, repeat=1)
    times: list[float] = []
    with profile(activities=activities, profile_memory=True, schedule=plan) as prof:
        for i in range(steps + 1):
            took = step()
            prof.step()
            times += [took] if i else []
    kind, started = "cuda" if device.type == "cuda" else "cpu", time.perf_counter()
    stats = summarise(prof.events(), steps)
    kept = _write_trace(prof, trace) if trace is not None else ""
    processing_s = time.perf_counter() - started
    return OpProfile(
        kind, steps, statistics.fmean(times), unprofiled_step_s, top(stats, kind), processing_s=processing_s, trace=kept
    )


def summarise(events: Iterable[Any], steps: int) -> list[OpStat]:
    """Per op name, per step: calls, self CPU and device time, bytes allocated. Work inside a
    ``perfsuite::`` region counts under the region, so perfsuite's own work never reads as the model's."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for event in events:
        if event.name.startswith("ProfilerStep") or event.device_type != DeviceType.CPU:
            # The schedule's step markers are python between ops; a CUDA kernel's own event repeats the time
            # its launching op already carries as self device time (seen on the H100: aten::mm and its cuBLAS
            # kernel, 14.5 and 14.4 ms/step, both listed).
            continue
        owner = _owner(event)
        row = totals[owner]
        row[0] += 1 if owner == event.name else 0
        row[1] += event.self_cpu_time_total
        row[2] += _self_device_us(event)
        row[3] += max(0, event.self_cpu_memory_usage) + max(0, getattr(event, "self_device_memory_usage", 0))
    return [
        OpStat(name, calls / steps, cpu / steps, dev / steps, mem / steps)
        for name, (calls, cpu, dev, mem) in totals.items()
    ]


def _owner(event: Any) -> str:
    """The event's own name, or the outermost ``perfsuite::`` region it ran in."""
    owner, node = event.name, event.cpu_parent
    while node is not None:
        if node.name.startswith(REGION_PREFIX):
            owner = node.name
        node = node.cpu_parent
    return str(owner)


def _self_device_us(event: Any) -> float:
    found = getattr(event, "self_device_time_total", None)
    return float(found if found is not None else getattr(event, "self_cuda_time_total", 0.0))


def _write_trace(prof: Any, path: Path) -> str:
    """The Chrome trace at ``path`` + ``.gz``; its file name, or "" when over :data:`MAX_TRACE_MIB`."""
    prof.export_chrome_trace(str(path))
    packed = path.with_name(path.name + ".gz")
    with path.open("rb") as raw, gzip.open(packed, "wb", compresslevel=6) as out:
        shutil.copyfileobj(raw, out)
    path.unlink()
    if packed.stat().st_size > MAX_TRACE_MIB * 2**20:
        packed.unlink()
        return ""
    return packed.name


class OomRecorder:
    """Records allocations through a launch that asked to explain its out-of-memory
    (``RankJob.explain_oom``): on cpu the profiler's memory records, on CUDA the caching
    allocator's history, whose snapshot is dumped next to the report. After an OOM,
    :attr:`summary` holds the largest allocations seen, as an :class:`OpProfile` ranked
    by bytes (one "step": the whole launch)."""

    def __init__(self, device: torch.device, reports_dir: Path, rank: int) -> None:
        self.device, self.reports_dir, self.rank = device, reports_dir, rank
        self.summary: OpProfile | None = None
        self._prof: Any = None

    def __enter__(self) -> OomRecorder:
        if self.device.type == "cuda":
            torch.cuda.memory._record_memory_history(max_entries=MAX_HISTORY_ENTRIES)
        else:
            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
        if exc is None or not is_oom(exc):
            if self.device.type == "cuda":
                torch.cuda.memory._record_memory_history(enabled=None)
            return
        if self.device.type == "cuda":
            self.summary = self._cuda_summary()
        else:
            stats = summarise(self._prof.events(), 1)
            ranked = sorted(stats, key=lambda op: op.alloc_bytes, reverse=True)
            self.summary = OpProfile("cpu", 1, 0.0, 0.0, tuple(op for op in ranked if op.alloc_bytes > 0)[:TOP_ALLOCS])

    def _cuda_summary(self) -> OpProfile:
        """The live allocations at the OOM, summed by where they were made; the snapshot dumped."""
        snapshot = torch.cuda.memory._snapshot()
        # Dump the snapshot taken while recording: switching the history off first
        # empties its timeline (device_traces), which the memory_viz viewer draws
        # (the first H100 OOM dump had none).
        path = self.reports_dir / f"oom-rank{self.rank}.pickle"
        with path.open("wb") as out:
            pickle.dump(snapshot, out)
        torch.cuda.memory._record_memory_history(enabled=None)
        kept = path.name
        if path.stat().st_size > MAX_SNAPSHOT_MIB * 2**20:
            path.unlink()
            kept = ""
        return OpProfile("cuda", 1, 0.0, 0.0, allocations_by_origin(snapshot), trace=kept)


def allocations_by_origin(snapshot: Mapping[str, Any]) -> tuple[OpStat, ...]:
    """A CUDA allocator snapshot's live blocks, summed by :func:`origin`, largest first."""
    by_origin: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for segment in snapshot.get("segments", []):
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            row = by_origin[origin(block.get("frames") or [])]
            row[0] += 1
            row[1] += block.get("size", 0)
    stats = [OpStat(name, calls, 0.0, 0.0, size) for name, (calls, size) in by_origin.items()]
    return tuple(sorted(stats, key=lambda op: op.alloc_bytes, reverse=True)[:TOP_ALLOCS])


#: Allocations an OOM summary keeps; the caching allocator's history length; the snapshot's size cap.
TOP_ALLOCS = 10
MAX_HISTORY_ENTRIES = 100_000
MAX_SNAPSHOT_MIB = 50


#: C++ frames that name what allocated on the autograd thread, which has no Python frame.
_AUTOGRAD_NODE = re.compile(r"autograd::generated::(\w+?)(?:_apply_functional|::apply)\(")
_ATEN_OP = re.compile(r"at::_ops::(\w+)::")


def origin(frames: Sequence[Mapping[str, Any]]) -> str:
    """Where a block was allocated, from its captured stack (innermost frame first).

    The innermost Python frame says what asked (``adam.py:178 _init_group``: Adam's
    state), and the innermost one outside torch which code of the model or engine
    did; both are named when they differ. The stack holds C++ frames too
    (``memory_snapshot.cpp``: the capture itself), so only ``.py`` files count.
    Backward runs on autograd's own thread without Python frames: there the
    autograd node (``AddmmBackward0``) or else the aten op names it."""
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    if python:
        inner = python[0]
        caller = next((f for f in python if "/torch/" not in str(f["filename"])), inner)
        where = _place(inner)
        return where if caller is inner else f"{where} (from {_place(caller)})"
    names = [str(f.get("name", "")) for f in frames]
    for pattern, label in ((_AUTOGRAD_NODE, "{} (backward)"), (_ATEN_OP, "aten::{}")):
        found = next((m.group(1) for m in map(pattern.search, names) if m), None)
        if found:
            return label.format(found)
    return "(no frame)"


def _place(frame: Mapping[str, Any]) -> str:
    return f"{Path(str(frame['filename'])).name}:{frame.get('line')} {frame.get('name')}"


def is_oom(exc: BaseException) -> bool:
    """Whether a rank's exception is an allocation failure (a MemoryError under RLIMIT_DATA, CUDA's OOM,
    or a library's words for one)."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    return "out of memory" in text or "can't allocate memory" in text or "bad_alloc" in text
