"""The gate's and the sequential A/B's false-alarm and detection rates, computed from measured
variance components.

``python -m perfsuite selftest --simulate`` (:mod:`perfsuite.judge.simulate.cli`) draws measurements from
the per-step, per-launch and per-session spread measured on each profile (:mod:`.noise`, every
figure with its source), judges them as the gate does in numpy and by the sequential A/B's own
vectorised decision (:mod:`.model`), checks a few thousand of the same draws through the gate's
judging code and ``abtest.run_ab`` (:mod:`.realgate`), and sets the committed trials beside the
model (:mod:`.trials`). :func:`minimum_detectable` gives, from one baseline's own stored spread,
the smallest slowdown its gate, or the A/B, catches 9 times in 10 (:func:`ab_minimum_detectable`
also the pairs the A/B spends; :func:`sensitivity` says both when a baseline is recorded).
Pytest side, torch-free.
"""

from __future__ import annotations

from perfsuite.judge.simulate.rates import ab_minimum_detectable, minimum_detectable, sensitivity

__all__ = ["ab_minimum_detectable", "minimum_detectable", "sensitivity"]
