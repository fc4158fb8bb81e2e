"""Optimizer-state sharding (ZeRO-1) with fairscale OSS around plain DDP.

DDP still all-reduces every gradient, so each rank holds all parameters and
gradients; OSS gives each rank the AdamW state of its own partition of whole
parameters and broadcasts the updated partitions after the step.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from perfsuite.core.engines.builtin import WrappedOptimizerOptions
from perfsuite.rank.primitives import Precision, StateTensors, optimizer_state_tensors
from perfsuite.rank.strategies import steps
from perfsuite.rank.strategies.base import StrategyContext, require
from perfsuite.rank.strategies.ddp import DataParallelStrategy

# Generic so that fairscale_sdp, an OSS strategy, can take its own options; OSS's are the bound.
WrappedT = TypeVar("WrappedT", bound=WrappedOptimizerOptions)


class FairscaleOSSStrategy(DataParallelStrategy[WrappedT]):
    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        require("fairscale.optim", "fairscale")

    def make_precision(self) -> Precision:
        # Each rank steps only its partition: fp16 ranks must agree on skipped steps.
        return Precision(self.ctx.precision, self.ctx.device, rank_agreed=True)

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        # Built after DDP wrapped the model: OSS re-points each param's .data
        # into its per-rank flat buffer, which DDP tolerates.
        oss = require("fairscale.optim", "fairscale").OSS
        cls, kwargs = steps.optimizer_class(self.options.optimizer)
        optimizer: torch.optim.Optimizer = oss(model.parameters(), optim=cls, lr=self.ctx.lr, **kwargs)
        return optimizer

    def state_tensors(self) -> StateTensors:
        # OSS's own .state stays empty; the states live in its local optimizer.
        local: torch.optim.Optimizer = self.optimizer.optim  # type: ignore[attr-defined]
        return {**super().state_tensors(), "optimizer": list(optimizer_state_tensors(local))}
