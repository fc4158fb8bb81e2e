"""Argument types for ``python -m perfsuite``: a bad value is a usage error
(exit 2) naming the option and what it takes, never a traceback or a
"failed 0/-1". Pytest side, torch-free."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

#: The exit status of a command stopped by Ctrl-C or SIGTERM: the shell's for SIGINT (128 + 2).
INTERRUPTED = 130

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(s|m|h)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, None: 1}


def parse_duration(text: str) -> float:
    """``8m``, ``90s``, ``90`` (seconds) or ``1.5h`` in seconds; a clear error otherwise."""
    found = _DURATION.match(text)
    if not found or float(found[1]) <= 0:
        raise ValueError(f"{text!r}: give a positive duration such as 8m, 90s or 1.5h")
    return float(found[1]) * _UNIT_S[found[2]]


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def at_least(low: int) -> Callable[[str], int]:
    """An integer option that must be ``low`` or more."""

    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {value}")
        return value

    count.__name__ = f"integer >= {low}"
    return count


def levels(text: str) -> tuple[float, ...]:
    """Comma-separated planted slowdowns in percent, each 0 or more: ``0,3,5,10``."""
    try:
        found = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give percentages separated by commas, e.g. 0,3,5,10") from None
    if any(level < 0 or level != level for level in found):
        raise argparse.ArgumentTypeError(f"{text!r}: a planted slowdown cannot be negative")
    return found


def probability(text: str) -> float:
    """A number strictly between 0 and 1."""
    return _number_in(text, 1, f"{text!r} is not a number", "must be between 0 and 1")


def rate(text: str) -> float:
    """An error rate such as a test's alpha, strictly between 0 and 0.5."""
    return _number_in(text, 0.5, f"{text!r}: give a rate such as 0.01", "must be a rate in (0, 0.5), e.g. 0.01")


def fraction(text: str) -> float:
    """A slowdown fraction above 0, such as a minimum effect (``0.02``; ``2%`` is refused as ambiguous)."""
    return _number_in(
        text,
        10,
        f"{text!r}: give a fraction, e.g. 0.02 for a 2% slowdown",
        "must be a slowdown fraction above 0 (0.02 = 2%)",
    )


def _number_in(text: str, below: float, not_a_number: str, out_of_range: str) -> float:
    """``text`` as a number strictly between 0 and ``below``, or a usage error in the option's words."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(not_a_number) from None
    if not 0 < value < below:
        raise argparse.ArgumentTypeError(f"{out_of_range}, got {value}")
    return value
