"""Plain-text tables for the terminal and command output: both the pytest side's summaries and the
commands print them. Torch-free, imports nothing of perfsuite."""

from __future__ import annotations

from collections.abc import Iterable


def table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    rows = [header, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
