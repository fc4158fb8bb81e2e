"""Engine specs (torch-free): what each value of ``Scenario.strategy`` can do.
Implementations live in :mod:`perfsuite.strategies` (rank side)."""

from __future__ import annotations

from perfsuite.engines import builtin as _builtin  # noqa: F401  (registers the built-in engines)
from perfsuite.engines.base import (
    ENGINES,
    EngineOptions,
    EngineSpec,
    NoOptions,
    OptionError,
    ParallelOptions,
)
from perfsuite.engines.builtin import MegatronOptions, ShardedDDPOptions, ZeroOptions

register_engine = ENGINES.register
engine_spec = ENGINES.get

__all__ = [
    "ENGINES",
    "EngineOptions",
    "EngineSpec",
    "MegatronOptions",
    "NoOptions",
    "OptionError",
    "ParallelOptions",
    "ShardedDDPOptions",
    "ZeroOptions",
    "engine_spec",
    "register_engine",
]
