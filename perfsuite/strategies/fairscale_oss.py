"""Optimizer-state sharding (ZeRO-1) with fairscale OSS around plain DDP.

DDP still all-reduces every gradient, so each rank holds all parameters and
gradients; OSS gives each rank the AdamW state of its own partition of whole
parameters and broadcasts the updated partitions after the step.
"""

from __future__ import annotations

import torch
from torch import nn

from perfsuite.strategies.base import StateTensors, StrategyContext, require
from perfsuite.strategies.ddp import DDPStrategy
from perfsuite.worker.memory import optimizer_state_tensors
from perfsuite.worker.precision import Precision, RankAgreedGradScaler


def shard_aware_scaler(device: torch.device) -> torch.amp.GradScaler:
    if device.type == "cuda":
        grad_scaler = require("fairscale.optim.grad_scaler", "fairscale")
        scaler: torch.amp.GradScaler = grad_scaler.ShardedGradScaler()
        return scaler
    return RankAgreedGradScaler(device.type)


def sharded_precision(name: str, device: torch.device) -> Precision:
    """Autocast AMP whose fp16 loss scaler agrees on skipped steps across ranks."""
    return Precision(name, device, scaler=shard_aware_scaler(device) if name == "fp16" else None)


class FairscaleOSSStrategy(DDPStrategy):
    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        require("fairscale.optim", "fairscale")

    def make_precision(self) -> Precision:
        return sharded_precision(self.ctx.precision, self.ctx.device)

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        # Built after DDP wrapped the model: OSS re-points each param's .data
        # into its per-rank flat buffer, which DDP tolerates.
        oss = require("fairscale.optim", "fairscale").OSS
        optimizer: torch.optim.Optimizer = oss(model.parameters(), optim=torch.optim.AdamW, lr=self.ctx.lr)
        return optimizer

    def state_tensors(self) -> StateTensors:
        # OSS's own .state stays empty; the states live in its local optimizer.
        local: torch.optim.Optimizer = self.optimizer.optim  # type: ignore[attr-defined]
        return {**super().state_tensors(), "optimizer": list(optimizer_state_tensors(local))}


STRATEGY = FairscaleOSSStrategy
