"""Fully sharded data parallel with PyTorch's FSDP2 (``fully_shard``), one
shard group per transformer block plus the root for embeddings and head.

Precision: below fp32 this uses ``MixedPrecisionPolicy(param_dtype=bf16/fp16,
reduce_dtype=fp32)`` instead of autocast. FSDP2 then all-gathers parameters
already in the compute dtype (half the traffic and unsharded-parameter memory),
keeps the fp32 shards for the optimizer and reduce-scatters gradients in fp32;
under autocast it would all-gather fp32 and re-cast per op. The catch: every
op, layer norms and softmax included, runs in the low dtype, so numerics
differ from the autocast rows. fp16 keeps a GradScaler; DTensor all-reduces
its inf check across the shards.
"""

from __future__ import annotations

import contextlib
from types import ModuleType

import torch
from torch import nn

from perfsuite.models.build import transformer_blocks
from perfsuite.primitives import DTYPES, Precision
from perfsuite.strategies.base import EngineUnavailable, StrategyContext, TorchStrategy


def _fsdp() -> ModuleType:
    try:
        import torch.distributed.fsdp as fsdp
    except ImportError as exc:  # pragma: no cover - broken torch install
        raise EngineUnavailable(f"torch.distributed.fsdp cannot be imported: {exc}") from None
    if not hasattr(fsdp, "fully_shard"):
        raise EngineUnavailable(
            f"FSDP2 (torch.distributed.fsdp.fully_shard) needs torch>=2.6, found {torch.__version__}"
        )
    return fsdp


class FSDP2Strategy(TorchStrategy):
    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        _fsdp()

    def make_precision(self) -> Precision:
        # The policy below casts parameters; autocast on top would re-cast per op.
        return Precision(self.ctx.precision, self.ctx.device, use_autocast=False)

    def wrap(self, model: nn.Module) -> nn.Module:
        fsdp = _fsdp()
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))
        dtype = DTYPES.get(self.ctx.precision)
        policy = fsdp.MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
        # Bottom-up: each block becomes its own all-gather/reduce-scatter group,
        # the root call takes what is left (embeddings, final norm, tied head).
        for block in transformer_blocks(model):
            fsdp.fully_shard(block, mesh=mesh, mp_policy=policy)
        fsdp.fully_shard(model, mesh=mesh, mp_policy=policy)
        return model

    def grad_sync(self, sync_grads: bool) -> contextlib.AbstractContextManager[None]:
        # FSDP2's no_sync: non-final micro-batches skip the reduce-scatter and
        # accumulate unsharded gradients locally; the final one reduces them all.
        self.model.set_requires_gradient_sync(sync_grads)  # type: ignore[operator]
        return contextlib.nullcontext()

    # state_tensors (inherited): parameters, their .grad and the AdamW states
    # are DTensors; count_state_bytes counts their local shards (padded storage).
