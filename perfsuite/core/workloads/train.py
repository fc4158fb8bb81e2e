"""Workload kind ``train``: a training loop driven by an engine.

Ranks build a transformers-style model with random weights, wrap it with the
engine named by ``strategy`` (DDP, DeepSpeed ZeRO, FSDP, tensor x pipeline
parallel, ...) and time real optimizer steps on synthetic batches. The rank
side is :class:`perfsuite.rank.worker.train.TrainRunner`. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Literal, get_args

from perfsuite.core.engines import (
    ENGINES,
    EngineOptions,
    EngineSpec,
    MissingPackage,
    OptionError,
    RunShape,
    engine_spec,
)
from perfsuite.core.engines.base import invalid_for
from perfsuite.core.layout import LayoutError, ParallelLayout
from perfsuite.core.models import ModelSpec
from perfsuite.core.protocol import WorkloadSpec, import_object, object_path
from perfsuite.core.validation import ScenarioError, check_choice, check_int, check_positive, fail
from perfsuite.core.workloads.base import BaseScenario

Precision = Literal["fp32", "fp16", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
Graph = Literal["eager", "compile", "ort"]
GRAPHS: tuple[str, ...] = get_args(Graph)


#: torch.compile's front end: 70 MiB of a rank's anonymous memory on cpu, so preloaded only for
#: the kinds whose ranks import it (a warm parent's pages count in its forks' peak).
DYNAMO = "torch._dynamo"


@dataclass(frozen=True)
class TrainSpec(WorkloadSpec):
    """What a training rank needs, resolved: model, precision, engine and batch."""

    runner: ClassVar[str] = "perfsuite.rank.worker.train:TrainRunner"

    model: ModelSpec
    """The model to build."""
    precision: Precision
    """fp32, or fp16/bf16 mixed precision."""
    engine: str
    """Engine name (``Scenario.strategy``)."""
    implementation: str
    """``module:Class`` of the engine's rank-side Strategy."""
    options_type: str
    """``module:Class`` of the engine's options dataclass."""
    options: Mapping[str, Any]
    """The validated ``strategy_options``."""
    layout: ParallelLayout
    """dp x tp x pp of the run."""
    micro_batch: int
    """Rows per micro-batch per data-parallel replica."""
    global_batch: int
    """Rows per optimizer step, all replicas together."""
    grad_accum: int
    """Micro-batches per step and replica."""
    seq_len: int
    """Tokens per row."""
    lr: float
    """AdamW learning rate."""
    graph: Graph = "eager"
    """Graph optimization of the model (:mod:`perfsuite.rank.worker.graph`)."""

    def engine_options(self) -> EngineOptions:
        """The options as the engine's typed dataclass (parsing checks their form only: a team's
        optimizer factory was asked of a child interpreter at collection, not again on a rank)."""
        options_cls: type[EngineOptions] = import_object(self.options_type)
        return options_cls.parse(self.engine, self.options)


@dataclass(frozen=True)
class Scenario(BaseScenario):
    """A training scenario: what to train, how, at which batch, and what outcome to expect."""

    kind: ClassVar[str] = "train"
    metrics: ClassVar[tuple[str, ...]] = (
        "samples_per_s",
        "samples_per_ref",
        "tokens_per_s",
        "peak_mem_mib",
        "model_state_bytes_per_rank",
        "model_state.params",
        "model_state.grads",
        "model_state.optimizer",
    )
    primary: ClassVar[str] = "samples_per_s"

    model: ModelSpec
    """The transformer to train."""
    precision: Precision = "fp32"
    """fp32, or mixed precision fp16 (with a loss scaler) or bf16."""
    strategy: str = "ddp"
    """Engine: a name from :mod:`perfsuite.core.engines` or a ``package.module:Class`` Strategy."""
    strategy_options: Mapping[str, Any] = field(default_factory=dict)
    """The engine's options, validated against its options dataclass."""
    micro_batch: int = 1
    """Rows per micro-batch per data-parallel replica."""
    global_batch: int = 1
    """Rows per optimizer step over all replicas (a multiple of micro_batch x dp)."""
    seq_len: int = 128
    """Tokens per row."""
    lr: float = 1e-4
    """AdamW learning rate."""
    graph: Graph = "eager"
    """``eager`` (plain PyTorch), ``compile`` (torch.compile, inductor) or ``ort``
    (onnxruntime-training's ORTModule, which needs ``env="ort"``: see ``make env-ort``).
    The compile or export happens in the first warmup step; its time is reported
    as ``detail.compile_s``, never in the measured steps."""

    def __post_init__(self) -> None:
        options = self.strategy_options
        if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
            raise fail(self.id, "strategy_options", f"must be a dict of option names to values, got {options!r}")
        object.__setattr__(self, "strategy_options", MappingProxyType(self._normalised(options)))
        super().__post_init__()

    def _normalised(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options as the definition keeps them: a file an option names is read now."""
        try:
            engine = engine_spec(self.strategy) if isinstance(self.strategy, str) else None
        except LookupError:
            return dict(options)  # validate() names the unknown engine
        try:
            return engine.options.normalise(options) if engine is not None else dict(options)
        except OptionError as exc:
            raise fail(self.id, "strategy_options", str(exc)) from None

    # -- validation ---------------------------------------------------------------------
    def validate(self) -> None:
        super().validate()
        owner = self.id
        if not isinstance(self.model, ModelSpec):
            raise fail(owner, "model", f"must be a ModelSpec, got {type(self.model).__name__}")
        check_choice(owner, "precision", self.precision, PRECISIONS)
        for name in ("micro_batch", "global_batch", "seq_len"):
            check_int(owner, name, getattr(self, name), 1)
        check_positive(owner, "lr", self.lr)
        if self.model.family != "module" and self.seq_len > self.model.max_positions:
            raise fail(owner, "seq_len", f"exceeds model.max_positions={self.model.max_positions}")
        engine = self._engine_or_fail()
        if engine.model_families and self.model.family not in engine.model_families:
            raise fail(
                owner,
                "model",
                f"family {self.model.family!r} cannot be trained by engine {engine.name!r}, which needs "
                f"{' or '.join(engine.model_families)} (a model splittable into stages with nn.Linear projections)",
            )
        self._validate_layout(owner)
        self._validate_graph(owner, engine)
        try:
            self.engine_options.check_run(self.run_shape)
        except OptionError as exc:
            raise fail(owner, "strategy_options", str(exc)) from None

    def _validate_graph(self, owner: str, engine: EngineSpec) -> None:
        check_choice(owner, "graph", self.graph, GRAPHS)
        if self.graph not in engine.graphs:
            takers = ", ".join(e.name for e in ENGINES if self.graph in e.graphs)
            why = f": {engine.why_not_graph}" if engine.why_not_graph else ""
            raise fail(
                owner,
                "graph",
                f"{self.graph!r} does not compose with strategy {self.strategy!r}{why}; engines that take it: {takers}",
            )

    def _engine_or_fail(self) -> EngineSpec:
        if not isinstance(self.strategy, str) or not self.strategy:
            raise fail(self.id, "strategy", "must be a non-empty string")
        try:
            engine = engine_spec(self.strategy)
        except LookupError as exc:
            raise fail(self.id, "strategy", str(exc)) from None
        try:
            engine.parse_options(self.strategy_options, ENGINES.with_axis())
        except OptionError as exc:
            raise fail(self.id, "strategy_options", str(exc)) from None
        return engine

    def _validate_layout(self, owner: str) -> None:
        try:
            layout = self.layout
            if layout.pp > 1:
                layout.check_layers(self.model.layers)
            if layout.tp > 1:
                layout.check_heads(self.model.heads, self.model.hidden, self.model.vocab)
        except LayoutError as exc:
            raise fail(owner, "strategy_options", f"describes an invalid layout: {exc}") from None
        if layout.pp > 1 and self.global_batch != self.micro_batch * layout.microbatches * layout.dp:
            raise fail(
                owner,
                "global_batch",
                f"must be micro_batch x microbatches x dp = {self.micro_batch} x {layout.microbatches} "
                f"x {layout.dp} for a pipeline, got {self.global_batch}",
            )
        per_step = self.micro_batch * layout.dp
        if self.global_batch % per_step:
            raise fail(
                owner,
                "global_batch",
                f"must be a multiple of micro_batch x data-parallel ranks = {per_step}, got {self.global_batch}",
            )

    def rank_imports(self) -> tuple[str, ...]:
        """The runner's, the model builder's and the engine's modules (deepspeed, fairscale...), and
        ``torch._dynamo``, which every engine's training imports (DDP reads ``torch._dynamo.utils``)."""
        engine = self.engine
        strategy = engine.implementation.partition(":")[0]
        return (*super().rank_imports(), DYNAMO, *self.model.imports, strategy, *engine.requires)

    # -- derived ------------------------------------------------------------------------
    @property
    def engine(self) -> EngineSpec:
        return engine_spec(self.strategy)

    @property
    def engine_options(self) -> EngineOptions:
        return self.engine.parse_options(self.strategy_options, ENGINES.with_axis())

    @property
    def layout(self) -> ParallelLayout:
        """dp x tp x pp of this scenario (raises LayoutError if it cannot run)."""
        return self.engine_options.layout(self.world_size)

    @property
    def data_parallel_size(self) -> int:
        """Ranks that hold a data-parallel replica (world / (tp * pp))."""
        return self.layout.dp

    @property
    def grad_accum(self) -> int:
        return self.global_batch // (self.micro_batch * self.data_parallel_size)

    @property
    def run_shape(self) -> RunShape:
        """The batch and precision an engine's own configuration must agree with."""
        return RunShape(self.micro_batch, self.grad_accum, self.global_batch, self.precision)

    # -- the workload-kind interface -------------------------------------------------------
    def at_world_size(self, size: int) -> Scenario:
        """The same experiment on ``size`` ranks: the layout's tp x pp and each
        replica's batch stay, so the global batch scales with the data-parallel ranks."""
        # Called by the base checks before this kind's own: name a bad engine or layout here.
        self._engine_or_fail()
        try:
            layout = self.layout
        except LayoutError as exc:
            raise fail(self.id, "strategy_options", f"describes an invalid layout: {exc}") from None
        tp_pp = layout.tp * layout.pp
        if size % tp_pp:
            raise fail(self.id, "world_sizes", f"{size} is not a multiple of tp x pp = {tp_pp}")
        per_replica = self.global_batch // layout.dp
        global_batch = per_replica * (size // tp_pp)
        shape = dataclasses.replace(self.run_shape, global_batch=global_batch)
        options = self.engine.options.rescaled(self.strategy_options, shape)
        return dataclasses.replace(
            self, world_size=size, world_sizes=(), global_batch=global_batch, strategy_options=options
        )

    def step_work(self) -> Mapping[str, float]:
        return {"samples_per_s": self.global_batch, "tokens_per_s": self.global_batch * self.seq_len}

    def precondition(self, device: str) -> str | None:
        return self.engine.unavailable(device, self.engine_options)

    def missing_package(self, device: str) -> MissingPackage | None:
        return self.engine.missing_package(device)

    def probe_fields(self, rank_path: str, where: str = "") -> tuple[ScenarioError, ...]:
        model = self.model.probe(rank_path)
        problem = self.engine_options.probe(rank_path)
        options = fail(self.id, "strategy_options", invalid_for(self.engine.name, problem) + where) if problem else None
        return tuple(error for error in (model, options) if error is not None)

    def rank_spec(self) -> TrainSpec:
        engine = self.engine
        return TrainSpec(
            **self.spec_fields(),
            model=self.model,
            precision=self.precision,
            engine=engine.name,
            implementation=engine.implementation,
            options_type=object_path(engine.options),
            options=dict(self.strategy_options),
            layout=self.layout,
            micro_batch=self.micro_batch,
            global_batch=self.global_batch,
            grad_accum=self.grad_accum,
            seq_len=self.seq_len,
            lr=self.lr,
            graph=self.graph,
        )

    def to_config(self) -> dict[str, Any]:
        layout = self.layout
        return {
            **super().to_config(),
            "model": dataclasses.asdict(self.model),
            "precision": self.precision,
            "strategy": self.strategy,
            "strategy_options": dict(self.strategy_options),
            "layout": {**dataclasses.asdict(layout), "bubble_fraction": layout.bubble_fraction()},
            "micro_batch": self.micro_batch,
            "global_batch": self.global_batch,
            "grad_accum": self.grad_accum,
            "seq_len": self.seq_len,
            "lr": self.lr,
            "graph": self.graph,
        }


__all__ = ["GRAPHS", "PRECISIONS", "Graph", "Precision", "Scenario", "TrainSpec"]
