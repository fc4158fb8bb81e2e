"""Was the machine busy with something else while a scenario was measured?

Each rank reports, over its measured steps, its host's busy and steal CPU time
and its own CPU time (:mod:`perfsuite.rank.worker.health`); on GPUs also other
processes' SM utilisation of its GPU. Per host, what the host was busy with
minus what this run's ranks used is what other processes took. A regression
measured while others took more than the profile allows is ``unreliable``:
it may be the neighbour's doing, not the stack's. Pytest side, torch-free.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

#: The kinds of contention, as the log names them.
FOREIGN_LOAD, STEAL, GPU = "foreign load", "steal", "a process on the GPU"


@dataclass(frozen=True)
class Contention:
    """What other processes took during one launch's measured steps."""

    foreign_cores: float
    """CPU cores other processes kept busy on the busiest host, on average."""
    steal_cores: float
    """CPU cores the hypervisor stole on that host, on average."""
    host: str
    """That host."""
    host_cpus: int
    """Its logical CPUs."""
    foreign_gpu: tuple[str, ...] = field(default_factory=tuple)
    """Other processes computing on this run's GPUs, described."""
    resolution_cores: float = 0.0
    """The finest load the host's counters tell apart over this window: two clock ticks (the
    counters' unit, 10 ms) over the window. A 100 ms window cannot tell 0.2 cores from none."""
    others: tuple[str, ...] = field(default_factory=tuple)
    """The other processes that used the most CPU meanwhile, ``name[pid] 0.31``, busiest first."""

    def to_json(self) -> dict[str, Any]:
        return {
            "foreign_cores": round(self.foreign_cores, 3),
            "steal_cores": round(self.steal_cores, 3),
            "host": self.host,
            "host_cpus": self.host_cpus,
            "foreign_gpu": list(self.foreign_gpu),
            "resolution_cores": round(self.resolution_cores, 3),
            "others": list(self.others),
        }

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> Contention | None:
        """A results file's record, written by this or another revision's perfsuite (an A/B
        reads both): missing fields take their defaults, unknown ones are ignored; None when it
        is no record at all."""
        try:
            return cls(
                float(found["foreign_cores"]),
                float(found.get("steal_cores", 0.0)),
                str(found.get("host", "?")),
                int(found.get("host_cpus", 1)),
                tuple(str(x) for x in found.get("foreign_gpu") or ()),
                float(found.get("resolution_cores", 0.0)),
                tuple(str(x) for x in found.get("others") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def worse(self, other: Contention | None) -> Contention:
        if other is None:
            return self
        return self if self.foreign_cores + self.steal_cores >= other.foreign_cores + other.steal_cores else other


def measure(health: Sequence[Mapping[str, Any]]) -> Contention | None:
    """Contention of one launch from its ranks' health records (None if they carry none)."""
    hosts: dict[str, list[Mapping[str, Any]]] = {}
    for rank in health:
        record = rank.get("contention")
        if record:
            hosts.setdefault(str(record["host"]), []).append(record)
    if not hosts:
        return None
    found = [_host(host, records) for host, records in hosts.items()]
    worst = max(found, key=lambda c: c.foreign_cores + c.steal_cores)
    gpu = tuple(
        f"rank {rank.get('rank')}'s GPU: pids {record['foreign_pids']} at up to "
        f"{record.get('foreign_sm_util_pct', 0):.0f}% SM"
        for rank in health
        if (record := rank.get("contention")) and record.get("foreign_pids")
    )
    return replace(worst, foreign_gpu=gpu)


def _host(host: str, records: Sequence[Mapping[str, Any]]) -> Contention:
    # Every rank of a host sees the same host counters, and the same launch processes (its agent
    # and those above it), over nearly the same window: average them; the ranks' own CPU adds up.
    def mean(key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in records) / len(records)

    window, cpus = mean("window_s"), int(records[0]["host_cpus"])
    if window <= 0:
        return Contention(0.0, 0.0, host, cpus)
    own = sum(float(r["own_cpu_s"]) for r in records) + mean("launch_cpu_s")
    tick = float(records[0].get("tick_s", 0.0))
    return Contention(
        max(0.0, mean("host_busy_s") - own) / window,
        max(0.0, mean("host_steal_s")) / window,
        host,
        cpus,
        resolution_cores=2 * tick / window,
        others=_others(records, window),
    )


def _others(records: Sequence[Mapping[str, Any]], window: float) -> tuple[str, ...]:
    """The other processes a host's ranks saw busiest, each once (one rank's view: they agree),
    in cores over the window; those under a hundredth of a core are left out."""
    seen: dict[str, float] = {}
    for record in records:
        for name, pid, cpu_s in record.get("busiest_others") or ():
            seen[f"{name}[{pid}]"] = max(seen.get(f"{name}[{pid}]", 0.0), float(cpu_s) / window)
    busiest = sorted(seen.items(), key=lambda item: -item[1])
    return tuple(f"{who} {cores:.2f}" for who, cores in busiest if cores >= 0.01)[:3]


def contended(
    contention: Contention | None, max_foreign_cores: float, max_steal_cores: float, steal: bool = True
) -> str | None:
    """Why the measurement was contended, each kind named (None if it was not).

    A load counts only beyond the limit by more than the counters' resolution over the
    window: on a window of a few short steps the host's clock-tick counters alone read
    0.1-0.3 cores either way. ``steal=False`` leaves stolen time out of the decision (it is
    still reported), for measurements whose sides it hits alike."""
    if contention is None:
        return None
    why = []
    margin = contention.resolution_cores
    if contention.foreign_cores > max_foreign_cores + margin:
        named = f": {', '.join(contention.others)}" if contention.others else ""
        why.append(
            f"{FOREIGN_LOAD}: other processes kept {contention.foreign_cores:.2f} of {contention.host}'s "
            f"{contention.host_cpus} CPU cores busy (limit {max_foreign_cores:g}{_plus(margin)}){named}"
        )
    if steal and contention.steal_cores > max_steal_cores + margin:
        why.append(
            f"{STEAL}: the hypervisor stole {contention.steal_cores:.2f} cores (limit {max_steal_cores:g}{_plus(margin)})"
        )
    why.extend(f"{GPU}: another process computed on {gpu}" for gpu in contention.foreign_gpu)
    return "; ".join(why) or None


def _plus(margin: float) -> str:
    return f" + {margin:.2f} resolution" if margin >= 0.005 else ""


@dataclass(frozen=True)
class Quiet:
    """How a wait for a quiet machine ended."""

    quiet: bool
    waited_s: float
    last: Contention | None
    """The last sample: what the machine was busy with when the wait ended."""


def host_load(sample_s: float = 1.0) -> Contention:
    """This host's load by other processes over ``sample_s``, measured as a rank measures it:
    host busy time less this process's own CPU time, and the hypervisor's steal."""
    me = psutil.Process()
    before, own_before, start = psutil.cpu_times(), sum(me.cpu_times()[:2]), time.monotonic()
    time.sleep(sample_s)
    after, own_after, window = psutil.cpu_times(), sum(me.cpu_times()[:2]), time.monotonic() - start

    def busy(t: Any) -> float:
        idle = t.idle + getattr(t, "iowait", 0.0) + getattr(t, "steal", 0.0)
        return sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

    foreign = max(0.0, busy(after) - busy(before) - (own_after - own_before)) / window
    steal = max(0.0, getattr(after, "steal", 0.0) - getattr(before, "steal", 0.0)) / window
    return Contention(foreign, steal, socket.gethostname(), os.cpu_count() or 1)


#: Consecutive quiet one-second samples that make a quiet host: a single quiet
#: second between a neighbour's bursts is no reason to measure again.
QUIET_SAMPLES = 3


def wait_for_quiet(
    max_foreign_cores: float,
    max_steal_cores: float,
    timeout_s: float,
    sample: Callable[[], Contention] = host_load,
    settle: int = QUIET_SAMPLES,
) -> Quiet:
    """Sample until the host was within the limits for ``settle`` samples in a row
    (``Quiet.quiet``), or ``timeout_s`` has passed."""
    start, last, streak = time.monotonic(), None, 0
    while time.monotonic() - start < timeout_s:
        last = sample()
        streak = 0 if contended(last, max_foreign_cores, max_steal_cores) else streak + 1
        if streak >= settle:
            return Quiet(True, time.monotonic() - start, last)
    return Quiet(False, time.monotonic() - start, last)
