"""Fully sharded data parallel with PyTorch's FSDP2 (``fully_shard``), one
shard group per transformer block plus the root for embeddings and head.

Precision: below fp32 this uses ``MixedPrecisionPolicy(param_dtype=bf16/fp16,
reduce_dtype=fp32)`` instead of autocast. FSDP2 then all-gathers parameters
already in the compute dtype (half the traffic and unsharded-parameter memory),
keeps the fp32 shards for the optimizer and reduce-scatters gradients in fp32;
under autocast it would all-gather fp32 and re-cast per op. The catch: every
op, layer norms and softmax included, runs in the low dtype, so numerics
differ from the autocast rows. fp16 keeps a GradScaler; DTensor all-reduces
its inf check across the shards. Options (:class:`perfsuite.core.engines.FSDP2Options`)
change the policy's dtypes, keep gathered parameters to the backward
(``reshard_after_forward=False``) or offload the shards to host memory.

The model is built on the ``meta`` device, sharded, and only then given storage: each
rank allocates and initialises its own shards, never the whole model.
"""

from __future__ import annotations

import contextlib
from types import ModuleType

import torch
from torch import nn

from perfsuite.core.engines import FSDP2Options
from perfsuite.rank.models.build import transformer_blocks
from perfsuite.rank.models.materialise import ModelFactory
from perfsuite.rank.primitives import DTYPES, Precision
from perfsuite.rank.strategies.base import EngineUnavailable, StrategyContext, TorchStrategy


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


class FSDP2Strategy(TorchStrategy[FSDP2Options]):
    compile_blocks = True  # torchtitan's recipe: compile each block, then fully_shard it

    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        _fsdp()

    def place(self, factory: ModelFactory) -> nn.Module:
        return factory.on_meta("meta, then sharded")

    def make_precision(self) -> Precision:
        # The policy below casts parameters; autocast on top would re-cast per op.
        return Precision(self.ctx.precision, self.ctx.device, use_autocast=False)

    def wrap(self, model: nn.Module) -> nn.Module:
        fsdp = _fsdp()
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))
        settings: dict[str, object] = {"mesh": mesh, "mp_policy": self.policy(fsdp)}
        if self.options.cpu_offload:
            settings["offload_policy"] = fsdp.CPUOffloadPolicy()
        # Bottom-up: each block becomes its own all-gather/reduce-scatter group,
        # the root call takes what is left (embeddings, final norm, tied head).
        for block in transformer_blocks(model):
            fsdp.fully_shard(block, **settings, reshard_after_forward=self.options.reshard_after_forward)
        # The root keeps torch's default (its parameters stay gathered to the backward): its
        # output may be no tensor FSDP2 can hook (a Recipe's namespace), and a resharded root then
        # never gathers again for the backward (seen: setStorage on a size-0 storage).
        fsdp.fully_shard(model, **settings)
        if any(p.is_meta for p in model.parameters()):
            # Offloaded shards live in host memory; the rest on the rank's device.
            place = torch.device("cpu") if self.options.cpu_offload else self.ctx.device
            self.factory.materialise(model, place)
        return model

    def policy(self, fsdp: ModuleType) -> object:
        """The mixed-precision policy: the options' dtypes, else the scenario's precision for the
        parameters and fp32 reductions below fp32 (fp32 means no cast)."""
        options, scenario = self.options, DTYPES.get(self.ctx.precision)
        param = scenario if options.param_dtype is None else DTYPES.get(options.param_dtype)
        if options.reduce_dtype is None:
            reduce = torch.float32 if scenario is not None else None
        else:
            reduce = DTYPES.get(options.reduce_dtype, torch.float32)
        return fsdp.MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)

    def grad_sync(self, sync_grads: bool) -> contextlib.AbstractContextManager[None]:
        # FSDP2's no_sync: non-final micro-batches skip the reduce-scatter and
        # accumulate unsharded gradients locally; the final one reduces them all.
        self.model.set_requires_gradient_sync(sync_grads)  # type: ignore[operator]
        return contextlib.nullcontext()

    # state_tensors (inherited): parameters, their .grad and the AdamW states
    # are DTensors; count_state_bytes counts their local shards (padded storage).
