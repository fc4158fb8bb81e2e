"""Engine implementations (rank side), one module per engine.

Each module holds a :class:`~perfsuite.rank.strategies.base.Strategy` subclass that
an :class:`~perfsuite.spec.engines.EngineSpec` names as its ``implementation``.
Strategies import torch, :mod:`perfsuite.rank.primitives`, :mod:`perfsuite.spec.models`
and :mod:`perfsuite.spec.engines`, never :mod:`perfsuite.rank.worker`, which drives them.
"""
