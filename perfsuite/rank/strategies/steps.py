"""Parts of a training step that engines building their own step share (rank side):
the optimizer a scenario names, activation checkpointing and torch.compile per block.

Per block, in torchtitan's order: checkpoint each block, compile it, then shard
(FSDP2) or parallelise (tp_pp). Compiling per block keeps the engine's hooks between
blocks outside the compiled graphs, and every block has the same code, so inductor
compiles it once and reuses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch
from torch import nn

from perfsuite.core.engines.base import OPTIMIZERS
from perfsuite.core.protocol import import_object
from perfsuite.rank.models.build import transformer_blocks

ParamsT = Iterable[nn.Parameter] | Iterable[dict[str, Any]]


def optimizer_class(name: str) -> tuple[Any, dict[str, Any]]:
    """A named optimizer's torch class and keyword arguments (``OPTIMIZERS``)."""
    path, kwargs = OPTIMIZERS[name]
    return import_object(path), dict(kwargs)


def make_optimizer(name: str, params: ParamsT, lr: float) -> torch.optim.Optimizer:
    """The optimizer option ``name``: a named one, or the team's factory ``function(params, lr)``."""
    if name in OPTIMIZERS:
        cls, kwargs = optimizer_class(name)
        optimizer: torch.optim.Optimizer = cls(params, lr=lr, **kwargs)
        return optimizer
    made = import_object(name)(params, lr)
    if not isinstance(made, torch.optim.Optimizer):
        raise TypeError(f"optimizer factory {name!r} returned {type(made).__name__}, not a torch.optim.Optimizer")
    return made


def prepare_blocks(
    model: nn.Module, checkpoint: bool, compile_blocks: bool, blocks: nn.ModuleList | None = None
) -> None:
    """Checkpoint and/or compile each transformer block of ``model`` in place."""
    if not (checkpoint or compile_blocks):
        return
    found = transformer_blocks(model) if blocks is None else blocks
    if checkpoint and not len(found):
        raise TypeError(f"activation checkpointing wraps transformer blocks, and {type(model).__name__} has none")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for index, block in enumerate(found):
        wrapped: Any = checkpoint_wrapper(block) if checkpoint else block
        # torch.compile of a module returns an OptimizedModule, an nn.Module (typed as a callable).
        found[index] = cast(nn.Module, torch.compile(wrapped)) if compile_blocks else wrapped


__all__ = ["make_optimizer", "optimizer_class", "prepare_blocks"]
