"""Optimizer-state and gradient sharding (ZeRO-2): fairscale OSS plus
ShardedDataParallel, which reduces each gradient only to the rank that owns
its parameter and then drops the gradients this rank does not own.

Option ``reduce_buffer_size`` (elements, default 0) is ShardedDDP's bucket
size. fairscale's own default (2**23) packs small gradients into per-rank
buckets that every rank keeps whole, so below ~8M parameters nothing would be
sharded; 0 reduces parameter by parameter and frees the foreign gradients.
"""

from __future__ import annotations

from torch import nn

from perfsuite.strategies.base import require
from perfsuite.strategies.fairscale_oss import FairscaleOSSStrategy

DEFAULT_REDUCE_BUFFER_SIZE = 0


class FairscaleSDPStrategy(FairscaleOSSStrategy):
    def setup(self, model: nn.Module) -> None:
        # ShardedDDP needs the OSS partition, so the optimizer comes first.
        self.precision = self.make_precision()
        self.optimizer = self.make_optimizer(model)
        sharded_ddp = require("fairscale.nn.data_parallel", "fairscale").ShardedDataParallel
        buffer = int(self.ctx.options.get("reduce_buffer_size", DEFAULT_REDUCE_BUFFER_SIZE))
        self.model = sharded_ddp(model, self.optimizer, reduce_buffer_size=buffer)

    def zero_grad(self) -> None:
        # ShardedDDP's zero_grad keeps bucketed grads as views of their bucket;
        # the optimizer's would detach them and the next reduce would send stale data.
        self.model.zero_grad(set_to_none=True)

    # state_tensors (inherited) lists p.grad for every parameter: after the
    # final backward ShardedDDP has set foreign unbucketed grads to None, so
    # only what this rank holds is counted (bucket views count their bucket).


STRATEGY = FairscaleSDPStrategy
