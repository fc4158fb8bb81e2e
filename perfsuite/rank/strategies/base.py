"""The strategy interface (rank side): wrap model and optimizer, run one
training step, and say which tensors make up this rank's model state.

What an engine *is* (options, devices, axes, extra) is declared torch-free in
:mod:`perfsuite.core.engines`; this module is what runs it."""

from __future__ import annotations

import contextlib
import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import ClassVar

import torch
from torch import nn

from perfsuite.core.engines import EngineOptions
from perfsuite.core.engines.base import OptionsT
from perfsuite.core.layout import ParallelLayout
from perfsuite.core.protocol import EngineUnavailable, import_object
from perfsuite.rank.models.materialise import ModelFactory
from perfsuite.rank.primitives import Precision, StateTensors, optimizer_state_tensors
from perfsuite.rank.strategies import steps

__all__ = [
    "EngineUnavailable",
    "StateTensors",
    "Strategy",
    "StrategyContext",
    "TorchStrategy",
    "load_strategy",
    "require",
]


def require(module: str, extra: str) -> ModuleType:
    """Import an optional engine or explain which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EngineUnavailable(
            f"{module} is not installed ({exc}); install it with: pip install 'perfsuite[{extra}]'"
        ) from None


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy knows about its run."""

    device: torch.device
    rank: int
    world_size: int
    precision: str
    """fp32, fp16 or bf16."""
    lr: float
    grad_accum: int
    """Micro-batches per step (non-pipelined strategies get one per call)."""
    options: EngineOptions
    """The engine's validated options (its own EngineOptions subclass)."""
    layout: ParallelLayout
    """dp x tp x pp of the run."""
    micro_batch: int = 1
    """Rows per micro-batch per data-parallel replica (DeepSpeed's config carries it)."""
    graph: str = "eager"
    """The scenario's graph mode; ``compile`` is applied by the strategy, where its engine
    documents it (see :meth:`TorchStrategy.setup`)."""
    steps: int = 0
    """The most optimizer steps the run takes (its warmup at most, then the measured ones): what a
    Trainer would tell its scheduler (DeepSpeed's ``"auto"`` total_num_steps)."""
    hidden: int = 0
    """The model's hidden size (0: not declared, a team's own module)."""


class Strategy(ABC):
    """One way of training a model across ranks.

    ``pipelined`` strategies run all micro-batches of a step in one
    :meth:`forward_backward` call (a pipeline schedule needs them together):
    they receive one batch of ``micro_batch x grad_accum`` rows per step.
    """

    pipelined: ClassVar[bool] = False

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx

    @classmethod  # noqa: B027 - optional hook, a no-op by default
    def check(cls, ctx: StrategyContext) -> None:
        """Raise :class:`EngineUnavailable` if this strategy cannot run here."""

    def options_as(self, cls: type[OptionsT]) -> OptionsT:
        """The engine's options as ``cls``; its defaults when the context carries another type
        (a strategy subclassed by a user engine without options)."""
        options = self.ctx.options
        return options if isinstance(options, cls) else cls()

    def build(self, factory: ModelFactory) -> nn.Module:
        """The model :meth:`setup` receives, made where this engine wants it: by default
        directly on the rank's device, never a whole host copy first. Sharding engines
        build on ``meta`` and materialise their part in :meth:`setup`."""
        self.factory = factory
        return factory.on_device(self.ctx.device)

    @abstractmethod
    def setup(self, model: nn.Module) -> None:
        """Wrap the model (from :meth:`build`) and build the optimizer."""

    @abstractmethod
    def forward_backward(self, batch: Mapping[str, torch.Tensor], sync_grads: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch; ``sync_grads`` is False on
        all but the last micro-batch of a gradient-accumulation step."""

    @abstractmethod
    def optimizer_step(self) -> bool:
        """Apply the accumulated gradients and clear them. Return False when
        the engine skipped the update (fp16 loss-scale overflow): such steps
        are faster and must not count as training throughput."""

    @abstractmethod
    def state_tensors(self) -> StateTensors:
        """This rank's model state by category: params, grads, optimizer."""


class TorchStrategy(Strategy):
    """Plain PyTorch training with autocast AMP. Subclasses change one step by
    overriding a hook: :meth:`wrap`, :meth:`make_optimizer`,
    :meth:`make_precision`, :meth:`grad_sync` or :meth:`zero_grad`.

    Options shared by such engines (:class:`perfsuite.core.engines.StepOptions`): each block is
    checkpointed before :meth:`wrap`; ``graph="compile"`` compiles the wrapped model whole
    (outside DDP, as accelerate does: dynamo's DDP optimizer splits the graph at the
    buckets), or each block before :meth:`wrap` where ``compile_blocks`` says so (FSDP2)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    compile_blocks: ClassVar[bool] = False
    """Compile block by block, before wrapping, instead of the wrapped model whole."""

    def setup(self, model: nn.Module) -> None:
        self.precision = self.make_precision()
        _, checkpoint = steps.step_options(self.ctx.options)
        compiling = self.ctx.graph == "compile"
        steps.prepare_blocks(model, checkpoint, compiling and self.compile_blocks)
        self.model = self.wrap(model)
        self.optimizer = self.make_optimizer(self.model)
        if compiling and not self.compile_blocks:
            self.model = torch.compile(self.model)  # type: ignore[assignment]

    def make_precision(self) -> Precision:
        return Precision(self.ctx.precision, self.ctx.device)

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        name, _ = steps.step_options(self.ctx.options)
        return steps.make_optimizer(name, model.parameters(), self.ctx.lr)

    def grad_sync(self, sync_grads: bool) -> contextlib.AbstractContextManager[None]:
        """Context for one micro-batch; skips gradient communication when
        ``sync_grads`` is False and the wrapper can defer it (DDP's no_sync)."""
        no_sync = getattr(self.model, "no_sync", None)
        if sync_grads or not callable(no_sync):
            return contextlib.nullcontext()
        return no_sync()

    def forward_backward(self, batch: Mapping[str, torch.Tensor], sync_grads: bool) -> torch.Tensor:
        with self.grad_sync(sync_grads):
            with self.precision.autocast():
                loss = self.model(**batch).loss
            self.precision.backward(loss / self.ctx.grad_accum)
        return loss.detach()

    def optimizer_step(self) -> bool:
        applied = self.precision.step(self.optimizer)
        self.zero_grad()
        return applied

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_tensors(self) -> StateTensors:
        params = list(self.model.parameters())
        return {
            "params": params,
            "grads": [p.grad for p in params],
            "optimizer": list(optimizer_state_tensors(self.optimizer)),
        }


def load_strategy(implementation: str) -> type[Strategy]:
    """The Strategy class at ``"package.module:Class"`` (an EngineSpec's implementation)."""
    cls = import_object(implementation)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"strategy {implementation!r} does not name a perfsuite Strategy subclass")
    return cls
