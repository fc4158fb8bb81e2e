"""Engine implementations (rank side), one module per engine.

Each module holds a :class:`~perfsuite.strategies.base.Strategy` subclass that
an :class:`~perfsuite.engines.EngineSpec` names as its ``implementation``.
Strategies import torch, :mod:`perfsuite.primitives`, :mod:`perfsuite.models`
and :mod:`perfsuite.engines`, never :mod:`perfsuite.worker`, which drives them.
"""
