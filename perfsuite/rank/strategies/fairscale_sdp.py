"""Optimizer-state and gradient sharding (ZeRO-2): fairscale OSS plus
ShardedDataParallel, which reduces each gradient only to the rank that owns
its parameter and then drops the gradients this rank does not own.

Option ``reduce_buffer_size``: see :class:`perfsuite.core.engines.ShardedDDPOptions`.
"""

from __future__ import annotations

from torch import nn

from perfsuite.core.engines import ShardedDDPOptions
from perfsuite.rank.strategies import steps
from perfsuite.rank.strategies.base import require
from perfsuite.rank.strategies.fairscale_oss import FairscaleOSSStrategy


class FairscaleSDPStrategy(FairscaleOSSStrategy[ShardedDDPOptions]):
    def setup(self, model: nn.Module) -> None:
        # ShardedDDP needs the OSS partition, so the optimizer comes first.
        self.precision = self.make_precision()
        steps.prepare_blocks(model, self.options.activation_checkpointing, compile_blocks=False)
        self.optimizer = self.make_optimizer(model)
        sharded_ddp = require("fairscale.nn.data_parallel", "fairscale").ShardedDataParallel
        self.model = sharded_ddp(model, self.optimizer, reduce_buffer_size=self.options.reduce_buffer_size)

    def zero_grad(self) -> None:
        # ShardedDDP's zero_grad keeps bucketed grads as views of their bucket;
        # the optimizer's would detach them and the next reduce would send stale data.
        self.model.zero_grad(set_to_none=True)

    # state_tensors (inherited) lists p.grad for every parameter: after the
    # final backward ShardedDDP has set foreign unbucketed grads to None, so
    # only what this rank holds is counted (bucket views count their bucket).
