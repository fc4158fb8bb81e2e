"""A live line on the terminal while a scenario runs: its id, the phase its
slowest rank is in (launch, build, warmup step, measure step n/N) and the
elapsed time, redrawn in place. Quiet under ``-q`` and when the output is not
a terminal (CI logs get the summary only). Pytest side, torch-free: phases
come from the ``rankN.phase`` files the ranks write (:mod:`perfsuite.rank.worker.runtime`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REDRAW_S = 0.5


def read_phases(reports_dir: Path) -> list[str]:
    """Each rank's current phase, in rank order (empty before any rank started)."""
    phases = []
    for path in sorted(reports_dir.glob("rank*.phase"), key=lambda p: int(p.stem[4:] or 0)):
        with contextlib.suppress(OSError):
            phases.append(path.read_text().strip())
    return phases


def line(scenario_id: str, phases: list[str], elapsed_s: float) -> str:
    """``mp.fp32: measure step 3/12 (rank 1 at warmup step 2) 14s``: the phase of
    rank 0, and of the rank furthest behind when they differ."""
    if not phases:
        return f"{scenario_id}: launching {elapsed_s:.0f}s"
    shown = phases[0] if phases[0] else "starting"
    behind = [f"rank {r} at {p}" for r, p in enumerate(phases) if p and p != phases[0]]
    extra = f" ({behind[0]})" if behind else ""
    return f"{scenario_id}: {shown}{extra} {elapsed_s:.0f}s"


class Progress:
    """Draws through ``write`` (the terminal reporter's raw writer); ``None`` = off."""

    def __init__(self, write: Callable[[str], None] | None, width: int = 80) -> None:
        self.write = write
        self.width = width

    @contextlib.contextmanager
    def watch(self, scenario_id: str, reports_dir: Path) -> Iterator[None]:
        if self.write is None:
            yield
            return
        stop = threading.Event()
        thread = threading.Thread(target=self._draw, args=(scenario_id, reports_dir, stop), daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self._show("")

    def _draw(self, scenario_id: str, reports_dir: Path, stop: threading.Event) -> None:
        start = time.monotonic()
        while not stop.wait(REDRAW_S):
            self._show(line(scenario_id, read_phases(reports_dir), time.monotonic() - start))

    def _show(self, text: str) -> None:
        assert self.write is not None
        text = text[: self.width - 1]
        self.write("\r" + text.ljust(self.width - 1) + "\r")
