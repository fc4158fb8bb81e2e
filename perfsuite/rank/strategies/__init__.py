"""Engine implementations (rank side), one module per engine.

Each module holds a :class:`~perfsuite.rank.strategies.base.Strategy` subclass that
an :class:`~perfsuite.core.engines.EngineSpec` names as its ``implementation``.
Strategies import torch, :mod:`perfsuite.rank.primitives`, :mod:`perfsuite.core.models`
and :mod:`perfsuite.core.engines`, never :mod:`perfsuite.rank.worker`, which drives them.
"""
