"""Validation helpers for specs declared in test modules (scenarios, models,
engine options, relations): a bad value fails collection with a message that
names the owner and the field. Torch-free leaf."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


class ScenarioError(ValueError):
    """A scenario spec, or a part of one (model, engine options, relation), is
    invalid; the message names the scenario and the field."""


def fail(owner: str, fieldname: str, problem: str) -> ScenarioError:
    return ScenarioError(f"scenario {owner!r}: field {fieldname!r} {problem}")


def check_int(owner: str, name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(owner, name, f"must be an int >= {minimum}, got {value!r}")


def check_choice(owner: str, name: str, value: Any, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise fail(owner, name, f"must be one of {', '.join(choices)}; got {value!r}")


def check_positive(owner: str, name: str, value: Any) -> None:
    # nan passes every comparison, and inf is no setting (a timeout, a learning rate) that can run.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise fail(owner, name, f"must be a positive finite number, got {value!r}")


def variant_keys_problem(value: Any) -> str | None:
    """What is wrong with an ``only_on`` (None: nothing). A bare string would be read letter by
    letter (``"cpu"`` as c, p, u), and the scenario then skipped everywhere."""
    if not isinstance(value, tuple) or not all(isinstance(key, str) and key for key in value):
        return f"must be a tuple of profile names or device kinds, e.g. ('cuda',), got {value!r}"
    return None
