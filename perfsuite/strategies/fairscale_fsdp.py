"""Fully sharded data parallel with fairscale's FullyShardedDataParallel: one
flattened, sharded parameter per transformer block plus one for the root.

CUDA only. Precision below fp32 uses FSDP's own ``mixed_precision`` (fp32
shards, compute in ``compute_dtype``, gradients reduce-scattered in fp32) rather
than autocast, as in the fsdp2 strategy; fp16 uses fairscale's
ShardedGradScaler because each rank only sees its own gradient shard.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from perfsuite.strategies.base import (
    EngineUnavailable,
    StateTensors,
    StrategyContext,
    TorchStrategy,
    require,
)
from perfsuite.strategies.fairscale_oss import shard_aware_scaler
from perfsuite.strategies.fsdp2 import transformer_blocks
from perfsuite.worker.memory import optimizer_state_tensors
from perfsuite.worker.precision import DTYPES, Precision

# Attributes fairscale FSDP keeps on each flat parameter: the fp32 shard the
# optimizer updates, and the compute-dtype shard and full (all-gathered)
# buffers it frees to size 0 outside forward/backward.
PARAM_BUFFERS = ("_fp32_shard", "_fp16_shard", "_full_param_padded")


class FairscaleFSDPStrategy(TorchStrategy):
    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        require("fairscale.nn.data_parallel", "fairscale")
        if ctx.device.type != "cuda":
            raise EngineUnavailable(
                "fairscale FSDP needs CUDA: FullyShardedDataParallel runs its all-gather, "
                "fp32->fp16 cast and post-backward reduce-scatter on torch.cuda streams "
                "(torch.cuda.stream(...) in _rebuild_full_params/_post_backward_hook, "
                f"torch.cuda.current_stream() in _free_full_params); device here is {ctx.device.type}"
            )

    def make_precision(self) -> Precision:
        # FSDP casts parameters itself (mixed_precision below); gradients are
        # sharded, so fp16 needs the rank-agreeing ShardedGradScaler.
        scaler = shard_aware_scaler(self.ctx.device) if self.ctx.precision == "fp16" else None
        return Precision(self.ctx.precision, self.ctx.device, use_autocast=False, scaler=scaler)

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


STRATEGY = FairscaleFSDPStrategy
