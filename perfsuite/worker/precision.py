"""Automatic mixed precision for plain-PyTorch strategies.

fp16 uses autocast plus a gradient scaler (fp16 gradients underflow without
it); bf16 uses autocast alone; fp32 is a no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from perfsuite.worker.memory import local_tensor

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Precision:
    """``use_autocast=False`` is for wrappers that cast parameters themselves
    (FSDP2's MixedPrecisionPolicy); fp16 then still scales the loss.

    The default scaler decides on skipped steps from local gradients: right when
    every rank holds the same gradients (DDP) or they are DTensors (FSDP2), whose
    inf check torch all-reduces. A strategy that shards plain gradients passes
    :class:`RankAgreedGradScaler`.
    """

    def __init__(
        self,
        name: str,
        device: torch.device,
        use_autocast: bool = True,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.name = name
        self.device_type = device.type
        self.use_autocast = use_autocast
        self.scaler = (scaler or torch.amp.GradScaler(self.device_type)) if name == "fp16" else None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.name == "fp32" or not self.use_autocast:
            yield
            return
        with torch.autocast(self.device_type, dtype=DTYPES[self.name]):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()


class RankAgreedGradScaler(torch.amp.GradScaler):
    """A GradScaler whose inf/NaN check is all-reduced (max) over the default
    process group, so ranks holding different gradients (optimizer or gradient
    shards, tp shards, pp stages) skip the same steps and keep the same scale.
    Unscales local shards of DTensor gradients in place. fairscale's
    ShardedGradScaler does the same on CUDA but disables itself off CUDA."""

    def _unscale_grads_(  # type: ignore[override]
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    grad = local_tensor(param.grad)
                    if not allow_fp16 and grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    by_dtype.setdefault(grad.dtype, []).append(grad)
            for grads in by_dtype.values():
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)
        return {found_inf.device: found_inf}
