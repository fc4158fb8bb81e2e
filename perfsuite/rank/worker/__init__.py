"""Rank side: runs inside each rank that torchrun starts (``python -m perfsuite.rank.worker``),
and the torchrun agent that starts them (:mod:`perfsuite.rank.worker.agent`).

Entry point, per-rank runtime, the measured loop every kind shares, memory and
health trackers, and one runner per workload kind. Imports torch, engines
(:mod:`perfsuite.rank.strategies`), models and :mod:`perfsuite.core.protocol`; never the
pytest side (baselines, compare, session, plugin).
"""
