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
from dataclasses import dataclass, field
from typing import Any

import psutil


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

    def to_json(self) -> dict[str, Any]:
        return {
            "foreign_cores": round(self.foreign_cores, 3),
            "steal_cores": round(self.steal_cores, 3),
            "host": self.host,
            "host_cpus": self.host_cpus,
            "foreign_gpu": list(self.foreign_gpu),
        }

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
    return Contention(worst.foreign_cores, worst.steal_cores, worst.host, worst.host_cpus, gpu)


def _host(host: str, records: Sequence[Mapping[str, Any]]) -> Contention:
    # Every rank of a host sees the same host counters over nearly the same
    # window: average them; the ranks' own CPU adds up.
    window = sum(float(r["window_s"]) for r in records) / len(records)
    busy = sum(float(r["host_busy_s"]) for r in records) / len(records)
    steal = sum(float(r["host_steal_s"]) for r in records) / len(records)
    own = sum(float(r["own_cpu_s"]) for r in records)
    if window <= 0:
        return Contention(0.0, 0.0, host, int(records[0]["host_cpus"]))
    return Contention(max(0.0, busy - own) / window, max(0.0, steal) / window, host, int(records[0]["host_cpus"]))


def contended(contention: Contention | None, max_foreign_cores: float, max_steal_cores: float) -> str | None:
    """Why the measurement was contended (None if it was not)."""
    if contention is None:
        return None
    why = []
    if contention.foreign_cores > max_foreign_cores:
        why.append(
            f"other processes kept {contention.foreign_cores:.2f} of {contention.host}'s {contention.host_cpus} "
            f"CPU cores busy (limit {max_foreign_cores:g})"
        )
    if contention.steal_cores > max_steal_cores:
        why.append(f"the hypervisor stole {contention.steal_cores:.2f} cores (limit {max_steal_cores:g})")
    why.extend(f"another process computed on {gpu}" for gpu in contention.foreign_gpu)
    return "; ".join(why) or None


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
