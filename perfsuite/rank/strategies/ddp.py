"""Plain data parallel: torch.nn.parallel.DistributedDataParallel, with its own settings
(:class:`perfsuite.core.engines.DDPOptions`) where the scenario gives them."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from perfsuite.core.engines import DDPOptions
from perfsuite.rank.strategies.base import StepOptionsT, TorchStrategy


class DataParallelStrategy(TorchStrategy[StepOptionsT]):
    """A model wrapped in DDP: the base of engines that keep DDP's all-reduce and change the
    optimizer (torch_zero, fairscale_oss), with DDP's defaults unless :meth:`ddp_settings` says."""

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.ctx.device] if self.ctx.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, **self.ddp_settings())

    def ddp_settings(self) -> dict[str, Any]:
        """DDP's keyword arguments beyond the device (none: DDP's defaults)."""
        return {}


class DDPStrategy(DataParallelStrategy[DDPOptions]):
    def ddp_settings(self) -> dict[str, Any]:
        """The settings the options change from DDP's defaults (none by default: DDP's own)."""
        options = self.options
        settings: dict[str, Any] = {}
        if options.gradient_as_bucket_view:
            settings["gradient_as_bucket_view"] = True
        if options.static_graph:
            settings["static_graph"] = True
        if options.bucket_cap_mb is not None:
            settings["bucket_cap_mb"] = options.bucket_cap_mb
        return settings
