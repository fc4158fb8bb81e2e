"""Rank side of the ``train`` workload kind: build the model, wrap it with the
engine, and run real optimizer steps on synthetic batches."""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from perfsuite.core.models import FAMILIES
from perfsuite.core.protocol import COUNTED_FLOPS, RankJob, RankReport
from perfsuite.core.workloads.train import TrainSpec
from perfsuite.rank.models.build import training_batch
from perfsuite.rank.models.materialise import ModelFactory
from perfsuite.rank.primitives import count_state_bytes
from perfsuite.rank.strategies.base import Strategy, StrategyContext, load_strategy
from perfsuite.rank.worker import graph
from perfsuite.rank.worker.base import Runner, spec_as
from perfsuite.rank.worker.flopcount import counted_flops
from perfsuite.rank.worker.loop import LoopResult, Step, measure
from perfsuite.rank.worker.runtime import Reporter, WorkerContext

BATCH_POOL = 2  # distinct synthetic batches cycled through, built before timing

Batch = Mapping[str, torch.Tensor]


class TrainRunner(Runner):
    def __init__(self, job: RankJob) -> None:
        super().__init__(job)
        self.spec = spec_as(job, TrainSpec)
        # Imported now, before CUDA is touched, so an engine can set environment
        # it needs at context creation (megatron-core: CUDA_DEVICE_MAX_CONNECTIONS).
        self.strategy_cls = load_strategy(self.spec.implementation)

    def context(self, ctx: WorkerContext) -> StrategyContext:
        spec = self.spec
        return StrategyContext(
            device=ctx.device,
            rank=ctx.rank,
            world_size=ctx.world_size,
            precision=spec.precision,
            lr=spec.lr,
            grad_accum=spec.grad_accum,
            options=spec.engine_options(),
            layout=spec.layout,
            micro_batch=spec.micro_batch,
            graph=spec.graph,
            steps=spec.max_warmup_steps + spec.steps,
            hidden=spec.model.hidden,
        )

    def check(self, ctx: WorkerContext) -> None:
        self.strategy_cls.check(self.context(ctx))
        graph.check(self.spec.graph, ctx.device)

    def run(self, ctx: WorkerContext, reporter: Reporter) -> RankReport:
        factory = ModelFactory(self.spec.model)
        strategy, model, batches = self.build(factory, ctx, reporter)
        self.wrap(strategy, model, ctx, reporter)
        del model  # the strategy holds what it needs; a stray reference skews memory
        step = TrainStep(strategy, batches, self.calls_per_step, graph.CompileWatch(self.spec.graph), self.spec.steps)
        counting = FlopCountingStep(step, enabled=self.counts_flops)
        result = measure(counting, self.job, ctx, reporter)
        check_fp16(step.skipped_steps(), self.spec.steps)
        return self.report(ctx, result, step, {**counting.detail(), "materialised": factory.how})

    def build(
        self, factory: ModelFactory, ctx: WorkerContext, reporter: Reporter
    ) -> tuple[Strategy[Any], nn.Module, list[Batch]]:
        """The strategy, its model (where the engine wants it: never a whole host copy first) and
        the synthetic batches."""
        reporter.phase("build")
        strategy = self.strategy_cls(self.context(ctx))
        model = strategy.build(factory)
        batches = self.batches(model, ctx)
        reporter.mark("build")
        return strategy, model, batches

    def batches(self, model: nn.Module, ctx: WorkerContext) -> list[Batch]:
        """The pool of batches the steps cycle through: one forward_backward call's rows each."""
        spec = self.spec
        # A pipelined strategy takes the whole step's rows in one call.
        rows = spec.micro_batch * (spec.grad_accum if self.strategy_cls.pipelined else 1)
        # All tp x pp ranks of one data-parallel replica train on the same rows.
        replica = ctx.rank // (spec.layout.tp * spec.layout.pp)
        return [
            training_batch(model, spec.model, spec.seq_len, ctx.device, rows, seed=replica * 1000 + i)
            for i in range(BATCH_POOL)
        ]

    def wrap(self, strategy: Strategy[Any], model: nn.Module, ctx: WorkerContext, reporter: Reporter) -> None:
        reporter.phase("wrap")
        graph.setup(strategy, model, self.spec.graph, ctx.device)
        reporter.mark("wrap")

    @property
    def calls_per_step(self) -> int:
        """forward_backward calls a step: one micro-batch each, or one for a pipelined strategy."""
        return 1 if self.strategy_cls.pipelined else self.spec.grad_accum

    @property
    def counts_flops(self) -> bool:
        """Whether the first step counts the model's FLOPs: only a model without a FLOP formula, only
        in a warmup step (a counted step runs slower; with no warmup there is none to count in), and
        only an eager one: torch.compile's first call under the counting mode compiled nothing, and
        the row then trained eagerly for good (docs/lab/work-counts.md)."""
        return (
            not FAMILIES[self.spec.model.family].formula
            and self.spec.max_warmup_steps > 0
            and self.spec.graph == "eager"
        )

    def report(self, ctx: WorkerContext, result: LoopResult, step: TrainStep, detail: Mapping[str, Any]) -> RankReport:
        return result.report(
            ctx.rank,
            losses=tuple(step.losses),
            skipped_steps=step.skipped_steps(),
            metrics=rank_metrics(result.peak_mem_mib, step.state),
            model_state=step.state,
            detail={**step.compiles.detail(result.warmup_times_s, result.step_times_s), **detail},
        )


class TrainStep:
    """One optimizer step of ``strategy`` (the :data:`~perfsuite.rank.worker.loop.Step` that
    ``measure`` times), and what the run keeps of the last ``keep`` steps."""

    def __init__(
        self, strategy: Strategy[Any], batches: Sequence[Batch], calls: int, compiles: graph.CompileWatch, keep: int
    ) -> None:
        self.strategy = strategy
        self.batches = batches
        self.calls = calls
        self.compiles = compiles
        self.losses: deque[float] = deque(maxlen=keep)
        self.applied: deque[bool] = deque(maxlen=keep)  # False: skipped on fp16 overflow
        self.state: dict[str, int] = {}  # model state bytes by category, counted in the last step
        self.index = 0

    def __call__(self, last: bool) -> None:
        index = self.index
        self.index += 1
        with self.compiles:
            for micro in range(self.calls):
                batch = self.batches[(index + micro) % len(self.batches)]
                loss = self.strategy.forward_backward(batch, micro == self.calls - 1)
        if last:
            # After backward, before the optimizer step: gradients and
            # optimizer states coexist.
            self.state.update(count_state_bytes(self.strategy.state_tensors()))
        self.applied.append(self.strategy.optimizer_step())
        # A float, not the tensor: a detached loss tensor kept per step grew a DDP rank's RSS by
        # ~12 MiB a step (cpu profile: peak 560 -> 720 MiB over 12 steps). The optimizer step is
        # already queued, so this sync adds nothing the timer's would not.
        value = float(loss)
        if not math.isfinite(value):
            raise FloatingPointError(f"non-finite training loss {value} at step {index}: the run diverged")
        self.losses.append(value)

    def skipped_steps(self) -> tuple[int, ...]:
        """Indices, among the kept steps, of those skipped on fp16 overflow."""
        return tuple(i for i, ok in enumerate(self.applied) if not ok)


class FlopCountingStep:
    """``step``, its FLOPs counted over its first call when ``enabled``."""

    def __init__(self, step: Step, enabled: bool) -> None:
        self.step = step
        self.enabled = enabled
        self.flops: int | None = None

    def __call__(self, last: bool) -> None:
        if self.enabled and self.flops is None:
            self.flops = counted_flops(functools.partial(self.step, last))
        else:
            self.step(last)

    def detail(self) -> dict[str, int]:
        """The count for the results' detail (none when nothing was counted)."""
        return {} if self.flops is None else {COUNTED_FLOPS: self.flops}


def check_fp16(skipped: Sequence[int], steps: int) -> None:
    """Refuse a run whose ``steps`` measured steps were all skipped on fp16 overflow."""
    if len(skipped) == steps:
        raise FloatingPointError(
            f"all {steps} measured optimizer steps were skipped on fp16 overflow: "
            "the loss scale never settled, nothing was trained"
        )


def rank_metrics(peak_mem_mib: float, state: dict[str, int]) -> dict[str, float]:
    """This rank's values of the train kind's ``rank``-source metrics."""
    return {
        "peak_mem_mib": peak_mem_mib,
        "model_state_bytes_per_rank": state["total"],
        **{f"model_state.{c}": state[c] for c in ("params", "grads", "optimizer")},
    }


__all__ = ["TrainRunner"]
