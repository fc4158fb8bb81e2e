"""Workload kinds: what a scenario's ranks run.

Each kind is a :class:`BaseScenario` subclass (torch-free, declared in test
modules) that names the metrics it produces and the
:class:`~perfsuite.core.protocol.WorkloadSpec` its ranks receive, plus a rank-side
runner (:class:`perfsuite.rank.worker.base.Runner`). Built in:

* ``train`` (:class:`Scenario`): a training loop driven by an engine;
* ``collective`` (:class:`Collective`): one collective's bus bandwidth;
* ``microbench`` (:class:`Microbench`): TFLOP/s of a matmul, an elementwise
  op or a transformer block on one device; ``membw`` (:class:`DeviceCopy`):
  device memory bandwidth;
* ``trainer`` (:class:`TrainerScenario`): a real ``transformers.Trainer`` job.
"""

from __future__ import annotations

from perfsuite.core.validation import ScenarioError
from perfsuite.core.workloads.base import TIERS, BaseScenario, Tier, tiers_up_to
from perfsuite.core.workloads.collective import Collective
from perfsuite.core.workloads.microbench import DeviceCopy, Microbench
from perfsuite.core.workloads.train import Precision, Scenario
from perfsuite.core.workloads.trainer import TrainerScenario

__all__ = [
    "TIERS",
    "BaseScenario",
    "Collective",
    "DeviceCopy",
    "Microbench",
    "Precision",
    "Scenario",
    "ScenarioError",
    "Tier",
    "TrainerScenario",
    "tiers_up_to",
]
