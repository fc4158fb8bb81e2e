"""The gate's false-alarm and detection rates computed from measured variance components.

``python -m perfsuite selftest --simulate`` (:mod:`perfsuite.judge.simulate.cli`) draws measurements from
the per-step, per-launch and per-session spread measured on each profile (:mod:`.noise`, every
figure with its source), judges them as the gate does in numpy (:mod:`.model`), checks a few
thousand of the same draws through the gate's own judging code (:mod:`.realgate`), and sets the
committed trials beside the model (:mod:`.trials`). :func:`minimum_detectable` gives, from one
baseline's own stored spread, the smallest slowdown its gate catches 9 times in 10
(:func:`sensitivity` says it when a baseline is recorded). Pytest side, torch-free.
"""

from __future__ import annotations

from perfsuite.judge.simulate.noise import PROFILES, ProfileNoise, Row, noise_of, row_of
from perfsuite.judge.simulate.rates import detectable, minimum_detectable, sensitivity

__all__ = ["PROFILES", "ProfileNoise", "Row", "detectable", "minimum_detectable", "noise_of", "row_of", "sensitivity"]
