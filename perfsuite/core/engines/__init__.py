"""Engine specs (torch-free): what each value of ``Scenario.strategy`` can do.
Implementations live in :mod:`perfsuite.rank.strategies` (rank side)."""

from __future__ import annotations

from perfsuite.core.engines import builtin as _builtin  # noqa: F401  (registers the built-in engines)
from perfsuite.core.engines.base import (
    ENGINES,
    EngineOptions,
    EngineSpec,
    MissingPackage,
    OptionError,
    ParallelOptions,
    RunShape,
    StepOptions,
)
from perfsuite.core.engines.builtin import (
    DDPOptions,
    FSDP2Options,
    MegatronOptions,
    ShardedDDPOptions,
    TPPPOptions,
    ZeroOptions,
)

register_engine = ENGINES.register
engine_spec = ENGINES.get

__all__ = [
    "ENGINES",
    "DDPOptions",
    "EngineOptions",
    "EngineSpec",
    "FSDP2Options",
    "MegatronOptions",
    "MissingPackage",
    "OptionError",
    "ParallelOptions",
    "RunShape",
    "ShardedDDPOptions",
    "StepOptions",
    "TPPPOptions",
    "ZeroOptions",
    "engine_spec",
    "register_engine",
]
