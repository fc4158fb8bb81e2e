"""Optimizer-state sharding (ZeRO-1) with PyTorch's ZeroRedundancyOptimizer
around DDP: every rank keeps all parameters and all-reduced gradients, but
AdamW state only for its partition of whole parameters."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from perfsuite.rank.primitives import StateTensors, optimizer_state_tensors
from perfsuite.rank.strategies import steps
from perfsuite.rank.strategies.ddp import DDPStrategy


class TorchZeroStrategy(DDPStrategy):
    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        cls, kwargs = steps.optimizer_class(steps.step_options(self.ctx.options)[0])
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, lr=self.ctx.lr, **kwargs)

    def state_tensors(self) -> StateTensors:
        # The wrapper's own .state stays empty; the local optimizer (.optim)
        # holds the states of this rank's partition.
        assert isinstance(self.optimizer, ZeroRedundancyOptimizer)
        local = list(optimizer_state_tensors(self.optimizer.optim))
        return {**super().state_tensors(), "optimizer": local}
