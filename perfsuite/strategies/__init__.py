"""Training strategies, one module per engine.

A scenario's ``strategy`` names a module here (``"ddp"`` ->
``perfsuite.strategies.ddp``) or a ``"package.module:Class"`` path for one of
your own. Each module exposes ``STRATEGY``, a :class:`~perfsuite.strategies.base.Strategy`
subclass; adding an engine is one new file. This package's ``__init__`` stays
free of torch imports because the pytest process locates strategies here when it
validates scenarios.
"""
