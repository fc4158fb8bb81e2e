"""Optimizer-state sharding (ZeRO-1) with PyTorch's ZeroRedundancyOptimizer
around DDP: every rank keeps all parameters and all-reduced gradients, but
AdamW state only for its partition of whole parameters."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from perfsuite.core.engines.builtin import WrappedOptimizerOptions
from perfsuite.rank.primitives import StateTensors, optimizer_state_tensors
from perfsuite.rank.strategies import steps
from perfsuite.rank.strategies.ddp import DataParallelStrategy


class TorchZeroStrategy(DataParallelStrategy[WrappedOptimizerOptions]):
    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        cls, kwargs = steps.optimizer_class(self.options.optimizer)
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, lr=self.ctx.lr, **kwargs)

    def state_tensors(self) -> StateTensors:
        # The wrapper's own .state stays empty; the local optimizer (.optim)
        # holds the states of this rank's partition.
        if not isinstance(self.optimizer, ZeroRedundancyOptimizer):
            raise TypeError(
                f"torch_zero counts the states of a ZeroRedundancyOptimizer's partition; "
                f"make_optimizer returned a {type(self.optimizer).__name__}"
            )
        local = list(optimizer_state_tensors(self.optimizer.optim))
        return {**super().state_tensors(), "optimizer": local}
