"""The strategy interface (rank side): wrap model and optimizer, run one
training step, and say which tensors make up this rank's model state.

What an engine *is* (options, devices, axes, extra) is declared torch-free in
:mod:`perfsuite.core.engines`; this module is what runs it."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Generic, TypeVar, cast, final, get_args

import torch
from torch import nn

from perfsuite.core.engines import EngineOptions, OptionError, StepOptions
from perfsuite.core.layout import ParallelLayout
from perfsuite.core.protocol import EngineUnavailable, import_object
from perfsuite.rank.models.materialise import ModelFactory
from perfsuite.rank.primitives import Precision, StateTensors, optimizer_state_tensors
from perfsuite.rank.strategies import steps

__all__ = [
    "EngineUnavailable",
    "OptionsT",
    "StateTensors",
    "StepOptionsT",
    "Strategy",
    "StrategyContext",
    "TorchStrategy",
    "load_strategy",
    "require",
]

# Bound to the classes themselves (not their names): a strategy left generic takes its
# variable's bound as its options class (see Strategy.__init_subclass__).
OptionsT = TypeVar("OptionsT", bound=EngineOptions)
StepOptionsT = TypeVar("StepOptionsT", bound=StepOptions)


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


def declared_options(cls: type) -> type[EngineOptions] | None:
    """The options class ``cls``'s own generic base names (``Strategy[DDPOptions]``), or the bound
    of the type variable it is left generic in; None where it names neither (a plain subclass)."""
    # Its own bases only: __orig_bases__ looked up as an attribute would be a parent's.
    for base in cls.__dict__.get("__orig_bases__", ()):
        for arg in get_args(base):
            named = arg.__bound__ if isinstance(arg, TypeVar) else arg
            if isinstance(named, type) and issubclass(named, EngineOptions):
                return named
    return None


class Strategy(ABC, Generic[OptionsT]):
    """One way of training a model across ranks, with its engine's options of type ``OptionsT``
    (``class MyStrategy(Strategy[MyOptions])`` declares the class once; :attr:`options` is one).

    ``pipelined`` strategies run all micro-batches of a step in one
    :meth:`forward_backward` call (a pipeline schedule needs them together):
    they receive one batch of ``micro_batch x grad_accum`` rows per step.
    """

    pipelined: ClassVar[bool] = False
    options_type: ClassVar[type[EngineOptions]] = EngineOptions
    """The options class, taken from the generic base a subclass names (never set by hand)."""
    options: OptionsT
    """The engine's options as :attr:`options_type` (see :meth:`typed_options`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = declared_options(cls)
        if declared is not None:
            cls.options_type = declared

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx
        self.options = self.typed_options(ctx.options)
        self._factory: ModelFactory | None = None

    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        """Raise :class:`EngineUnavailable` if this strategy cannot run here."""

    @classmethod
    def typed_options(cls, options: EngineOptions) -> OptionsT:
        """``options`` when they are an :attr:`options_type`; otherwise one built from the fields
        both classes have, defaults for the rest: an engine registered with other options, or a
        user engine named by its path (no options at all), still trains with what applies."""
        wanted = cls.options_type
        if not isinstance(options, wanted):
            shared = {f.name: getattr(options, f.name) for f in dataclasses.fields(wanted) if hasattr(options, f.name)}
            try:
                options = wanted(**shared)
            except OptionError as exc:
                raise TypeError(
                    f"{cls.__name__} takes {wanted.__name__} options and cannot make them from "
                    f"{type(options).__name__}: {wanted.__name__} {exc}"
                ) from None
        # options_type is the class OptionsT stands for (declared_options found it).
        return cast(OptionsT, options)

    @final
    def build(self, factory: ModelFactory) -> nn.Module:
        """The model :meth:`setup` receives, made where :meth:`place` says; ``factory`` stays
        available to :meth:`setup` (:attr:`factory`) for engines that materialise there."""
        self._factory = factory
        return self.place(factory)

    def place(self, factory: ModelFactory) -> nn.Module:
        """Make the model where this engine wants it, never a whole host copy first: by default
        directly on the rank's device; engines that shard or split it build on ``meta`` and give
        their part storage in :meth:`setup` (naming the choice in ``factory.how``)."""
        return factory.on_device(self.ctx.device)

    @property
    def factory(self) -> ModelFactory:
        """The factory :meth:`build` was given."""
        if self._factory is None:
            raise RuntimeError(f"{type(self).__name__} needs its model from build(), which has not run")
        return self._factory

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


class TorchStrategy(Strategy[StepOptionsT]):
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
        compiling = self.ctx.graph == "compile"
        steps.prepare_blocks(model, self.options.activation_checkpointing, compiling and self.compile_blocks)
        self.model = self.wrap(model)
        self.optimizer = self.make_optimizer(self.model)
        if compiling and not self.compile_blocks:
            self.model = torch.compile(self.model)  # type: ignore[assignment]

    def make_precision(self) -> Precision:
        return Precision(self.ctx.precision, self.ctx.device)

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return steps.make_optimizer(self.options.optimizer, model.parameters(), self.ctx.lr)

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


def load_strategy(implementation: str) -> type[Strategy[Any]]:
    """The Strategy class at ``"package.module:Class"`` (an EngineSpec's implementation)."""
    cls = import_object(implementation)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"strategy {implementation!r} does not name a perfsuite Strategy subclass")
    return cls
