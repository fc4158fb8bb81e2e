"""Automatic mixed precision for plain-PyTorch strategies.

fp16 uses autocast plus a gradient scaler (fp16 gradients underflow without
it); bf16 uses autocast alone; fp32 is a no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Precision:
    """``use_autocast=False`` is for wrappers that cast parameters themselves
    (FSDP2's MixedPrecisionPolicy); fp16 then still scales the loss.

    The default scaler decides on skipped steps from local gradients: right when
    every rank holds the same gradients (DDP) or they are DTensors (FSDP2), whose
    inf check torch all-reduces. A strategy that shards plain gradients must pass
    a scaler that agrees across ranks.
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
