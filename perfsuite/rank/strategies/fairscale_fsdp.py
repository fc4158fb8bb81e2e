"""Fully sharded data parallel with fairscale's FullyShardedDataParallel: one
flattened, sharded parameter per transformer block plus one for the root.

CUDA only (its EngineSpec says why). Precision below fp32 uses FSDP's own
``mixed_precision`` (fp32 shards, compute in ``compute_dtype``, gradients
reduce-scattered in fp32) rather than autocast, as in the fsdp2 strategy; fp16
uses the rank-agreed loss scaler because each rank only sees its own gradient
shard.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from perfsuite.core.engines import StepOptions
from perfsuite.rank.models.build import transformer_blocks
from perfsuite.rank.primitives import DTYPES, Precision, StateTensors, optimizer_state_tensors
from perfsuite.rank.strategies.base import StrategyContext, TorchStrategy, require

# Attributes fairscale FSDP keeps on each flat parameter: the fp32 shard the
# optimizer updates, and the compute-dtype shard and full (all-gathered)
# buffers it frees to size 0 outside forward/backward.
PARAM_BUFFERS = ("_fp32_shard", "_fp16_shard", "_full_param_padded")


class FairscaleFSDPStrategy(TorchStrategy[StepOptions]):
    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        require("fairscale.nn.data_parallel", "fairscale")

    def make_precision(self) -> Precision:
        # FSDP casts parameters itself (mixed_precision below); gradients are
        # sharded, so fp16 needs a loss scaler whose ranks agree on skipped steps.
        return Precision(self.ctx.precision, self.ctx.device, use_autocast=False, rank_agreed=True)

    def wrap(self, model: nn.Module) -> nn.Module:
        fsdp = require("fairscale.nn.data_parallel", "fairscale").FullyShardedDataParallel
        blocks = transformer_blocks(model)
        # Inner wrappers first: the root then flattens only what is left
        # (embeddings, final norm, tied LM head).
        for index, block in enumerate(blocks):
            blocks[index] = fsdp(block, **self._fsdp_kwargs())
        wrapped: nn.Module = fsdp(model, **self._fsdp_kwargs())
        return wrapped

    def _fsdp_kwargs(self) -> dict[str, Any]:
        dtype = DTYPES.get(self.ctx.precision)
        kwargs: dict[str, Any] = {"flatten_parameters": True, "mixed_precision": dtype is not None}
        if dtype is not None:
            # Reduce-scatter in fp32, like fsdp2's reduce_dtype.
            kwargs.update(compute_dtype=dtype, fp32_reduce_scatter=True)
        return kwargs

    def state_tensors(self) -> StateTensors:
        # Each flat parameter's .data is its fp32 shard between steps; the
        # compute-dtype and full buffers are listed too but have 0-byte
        # storage once backward has resharded (count_state_bytes skips those).
        params = list(self.model.parameters())
        held = [getattr(p, name, None) for p in params for name in PARAM_BUFFERS]
        return {
            "params": [*params, *held],
            # After the synced backward, .grad is the reduce-scattered fp32 shard.
            "grads": [p.grad for p in params],
            "optimizer": list(optimizer_state_tensors(self.optimizer)),
        }
