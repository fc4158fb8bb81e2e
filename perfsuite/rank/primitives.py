"""Rank-side building blocks every engine shares: mixed precision with loss
scaling, and model-state accounting.

A leaf: it imports torch and nothing of perfsuite, so engines
(:mod:`perfsuite.rank.strategies`) and the measurement code
(:mod:`perfsuite.rank.worker`) can both use it without importing each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping

import torch
import torch.distributed as dist

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

#: This rank's model state by category (params, grads, optimizer).
StateTensors = Mapping[str, Iterable[torch.Tensor | None]]


# -- state accounting -------------------------------------------------------------------
def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The shard a rank really holds (DTensor -> its local tensor)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def count_state_bytes(groups: StateTensors) -> dict[str, int]:
    """Bytes per category, summed over tensor storages: each storage counted
    once (flat buffers that parameters view into are not double-counted), in
    the first category that holds it."""
    seen: set[tuple[str, int]] = set()
    counts: dict[str, int] = {}
    for category, tensors in groups.items():
        total = 0
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = local_tensor(tensor).untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            if storage.nbytes() == 0 or key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
        counts[category] = total
    counts["total"] = sum(counts[c] for c in groups)
    return counts


# -- mixed precision ----------------------------------------------------------------------
class RankAgreedGradScaler(torch.amp.GradScaler):
    """A GradScaler whose inf/NaN check is all-reduced (max) over the default
    process group, so ranks holding different gradients (optimizer or gradient
    shards, tp shards, pp stages) skip the same steps and keep the same scale.
    Unscales local shards of DTensor gradients in place. (fairscale's
    ShardedGradScaler does the same on CUDA only; this one runs everywhere.)"""

    def _unscale_grads_(
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


class Precision:
    """Autocast AMP for plain-PyTorch engines: fp16 with a loss scaler (fp16
    gradients underflow without one), bf16 with autocast alone, fp32 a no-op.

    ``use_autocast=False`` is for wrappers that cast parameters themselves
    (FSDP's mixed-precision policies); fp16 then still scales the loss.
    ``rank_agreed=True`` is for engines whose ranks hold different plain
    gradients (sharded ones): their scaler skips steps in agreement. The
    default scaler decides from local gradients, right when every rank holds
    the same ones (DDP) or they are DTensors, whose inf check torch all-reduces.
    """

    def __init__(self, name: str, device: torch.device, use_autocast: bool = True, rank_agreed: bool = False) -> None:
        self.name = name
        self.device_type = device.type
        self.use_autocast = use_autocast
        self.scaler: torch.amp.GradScaler | None = None
        if name == "fp16":
            scaler_cls = RankAgreedGradScaler if rank_agreed else torch.amp.GradScaler
            self.scaler = scaler_cls(self.device_type)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.name == "fp32" or not self.use_autocast:
            yield
            return
        with torch.autocast(self.device_type, dtype=DTYPES[self.name]):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer; False when the loss scaler skipped it (inf/NaN
        gradients). GradScaler backs its scale off exactly when it skips."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= before
