"""The run modes, and which one this run is in.

Every mode implements :class:`perfsuite.plugin.modes.base.Mode`. The default mode
judges against baselines; the others are selected by their flag. A new mode is
one module plus one line in :data:`MODES`.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfsuite.plugin.modes.ab import ABMode
from perfsuite.plugin.modes.base import Mode
from perfsuite.plugin.modes.baseline import BaselineMode, StaleBaselineWarning
from perfsuite.plugin.modes.maxbatch import MaxBatchMode

DEFAULT: type[Mode] = BaselineMode
#: The modes a flag selects, in the order their options are listed in ``--help``.
MODES: tuple[type[Mode], ...] = (MaxBatchMode, ABMode)

MODE_KEY = pytest.StashKey[Mode]()


def add_options(group: Any) -> None:
    for mode in (DEFAULT, *MODES):
        mode.add_options(group)


def pick(config: pytest.Config) -> Mode:
    """Validate every mode's options, then start the one mode this run is in (kept in the config's stash)."""
    for mode in (DEFAULT, *MODES):
        mode.check_options(config)
    chosen = [mode for mode in MODES if mode.selected(config)]
    if len(chosen) > 1:
        flags = " and ".join(str(mode.flag) for mode in chosen)
        raise pytest.UsageError(f"{flags} are different run modes; give one of them")
    config.stash[MODE_KEY] = (chosen[0] if chosen else DEFAULT)(config)
    return config.stash[MODE_KEY]


def of(config: pytest.Config) -> Mode:
    """The mode this run is in (picked in ``pytest_configure``)."""
    return config.stash[MODE_KEY]


def selected(config: pytest.Config) -> type[Mode]:
    """The mode class the options select, before :func:`pick` has run (options validation needs it)."""
    return next((mode for mode in MODES if mode.selected(config)), DEFAULT)


__all__ = ["DEFAULT", "MODES", "StaleBaselineWarning", "of", "pick"]
