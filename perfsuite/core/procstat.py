"""A process's line of ``/proc/PID/stat``, read alike by the gate and the launched side (torch-free).

Linux only: the fields after the command's name, which may hold spaces or parentheses, so the
line is cut at its last ``)``. Field 3 is the state (``Z`` for a zombie), field 22 the start in
clock ticks after boot, which tells a reused pid apart.
"""

from __future__ import annotations


def stat_fields(pid: int | str = "self") -> list[str] | None:
    """The fields of ``pid``'s stat line from its state on (None when there is no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()
    except OSError:
        return None


def start_ticks(pid: int | str = "self") -> str:
    """When ``pid`` started, in clock ticks after boot ("" when it is gone)."""
    fields = stat_fields(pid)
    return fields[19] if fields else ""


def runs(pid: int | str, ticks: str = "") -> bool:
    """Whether ``pid`` runs (a zombie does not), and started at ``ticks`` when given."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z" and (not ticks or fields[19] == ticks)
