"""Where a model's weights come into being (rank side).

A rank never builds a whole model on the host first. An engine asks its
:class:`ModelFactory` for the model where it will live:

- data-parallel engines: built directly on the rank's device (``on_device``);
- FSDP2 and tp_pp: built on the ``meta`` device (shapes only), sharded or split, then
  :meth:`ModelFactory.materialise` gives each rank's part storage and the model's own
  initialisation, per shard;
- DeepSpeed ZeRO-3: built inside ``deepspeed.zero.Init``, which partitions each module's
  parameters as it is constructed;
- megatron-core: its own GPTModel builds each rank's partition; perfsuite's model stays on meta.

The engine names what it did in :attr:`ModelFactory.how`, which the rank reports
(``detail.materialised``). Weights are random either way; only where they are made changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from perfsuite.core.models import ModelSpec
from perfsuite.rank.models.build import build_model

#: How a rank's model came to be: what ``detail.materialised`` says.
Materialised = Literal["on device", "meta, then sharded", "meta, then split", "zero.Init", "engine's own"]


@dataclass
class ModelFactory:
    """Builds one scenario's model where its engine asks (see the module docstring)."""

    spec: ModelSpec
    how: Materialised = "on device"
    _numel: int | None = field(default=None, repr=False)

    def build(self, device: torch.device | str) -> nn.Module:
        """The model built under ``device`` as the default device (its parameters are made there)."""
        with torch.device(device):
            return build_model(self.spec)

    def on_device(self, device: torch.device) -> nn.Module:
        self.how = "on device"
        return self.build(device)

    def on_meta(self, how: Materialised) -> nn.Module:
        """Shapes only, no storage; ``how`` says what the engine will make of it."""
        self.how = how
        return self.build("meta")

    def materialise(self, module: nn.Module, device: torch.device) -> None:
        """Storage on ``device`` for the meta parameters ``module`` holds (its shard or its part),
        then the model's own initialisation of them."""
        module.to_empty(device=device)
        # The same seed on every rank: tensor-parallel peers hold identical replicated weights and
        # data-parallel replicas start equal, as a whole model built from one seed would.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            init_weights(module)

    def numel(self) -> int:
        """Parameters of the whole model (tied ones once), counted on the meta device."""
        if self._numel is None:
            self._numel = sum(p.numel() for p in self.build("meta").parameters())
        return self._numel


@torch.no_grad()
def init_weights(module: nn.Module) -> None:
    """The model's own initialisation of storage that ``to_empty`` left unset.

    transformers models: ``initialize_weights`` (their ``_init_weights``, which also fills
    buffers such as BERT's position ids) and ``tie_weights`` (``to_empty`` unties a head
    from its embedding). A module with ``init_weights()`` (perfsuite's GPT and its stages, a
    :class:`~perfsuite.rank.models.module.RecipeModel`) runs its own. Anything else: each
    submodule's ``reset_parameters``, torch's default initialisation."""
    initialize, tie = getattr(module, "initialize_weights", None), getattr(module, "tie_weights", None)
    if callable(initialize) and callable(tie):
        for sub in module.modules():  # transformers skips what it marked initialised
            sub.__dict__.pop("_is_hf_initialized", None)
        initialize()
        tie()
        return
    own = getattr(module, "init_weights", None)
    if callable(own):
        own()
        return
    reset_parameters(module)


def reset_parameters(module: nn.Module) -> None:
    """torch's default initialisation of every submodule that has one."""
    for sub in module.modules():
        reset = getattr(sub, "reset_parameters", None)
        if callable(reset):
            reset()


__all__ = ["Materialised", "ModelFactory", "init_weights", "reset_parameters"]
