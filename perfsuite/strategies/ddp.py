"""Plain data parallel: torch.nn.parallel.DistributedDataParallel."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from perfsuite.strategies.base import TorchStrategy


class DDPStrategy(TorchStrategy):
    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.ctx.device] if self.ctx.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
