"""Rank side of the ``train`` workload kind: build the model, wrap it with the
engine, and run real optimizer steps on synthetic batches."""

from __future__ import annotations

import itertools
import math
from collections import deque

from perfsuite.core.models import FAMILIES
from perfsuite.core.protocol import COUNTED_FLOPS, RankJob, RankReport
from perfsuite.core.workloads.train import TrainSpec
from perfsuite.rank.models.build import training_batch
from perfsuite.rank.models.materialise import ModelFactory
from perfsuite.rank.primitives import count_state_bytes
from perfsuite.rank.strategies.base import StrategyContext, load_strategy
from perfsuite.rank.worker import graph
from perfsuite.rank.worker.base import Runner
from perfsuite.rank.worker.flopcount import counted_flops
from perfsuite.rank.worker.loop import measure
from perfsuite.rank.worker.runtime import Reporter, WorkerContext

BATCH_POOL = 2  # distinct synthetic batches cycled through, built before timing


class TrainRunner(Runner):
    def __init__(self, job: RankJob) -> None:
        super().__init__(job)
        assert isinstance(job.spec, TrainSpec)
        self.spec = job.spec
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
        spec = self.spec
        reporter.phase("build")
        strategy = self.strategy_cls(self.context(ctx))
        factory = ModelFactory(spec.model)
        model = strategy.build(factory)  # where the engine wants it: never a whole host copy first
        # A pipelined strategy takes the whole step's rows in one call.
        accum = 1 if self.strategy_cls.pipelined else spec.grad_accum
        rows = spec.micro_batch * (spec.grad_accum if self.strategy_cls.pipelined else 1)
        # All tp x pp ranks of one data-parallel replica train on the same rows.
        replica = ctx.rank // (spec.layout.tp * spec.layout.pp)
        batches = [
            training_batch(model, spec.model, spec.seq_len, ctx.device, rows, seed=replica * 1000 + i)
            for i in range(BATCH_POOL)
        ]
        reporter.mark("build")
        reporter.phase("wrap")
        graph.setup(strategy, model, spec.graph, ctx.device)
        reporter.mark("wrap")
        del model  # the strategy holds what it needs; a stray reference skews memory
        losses: deque[float] = deque(maxlen=spec.steps)
        applied: deque[bool] = deque(maxlen=spec.steps)
        state: dict[str, int] = {}
        counter = itertools.count()
        compiles = graph.CompileWatch(spec.graph)

        def step(last: bool) -> None:
            index = next(counter)
            with compiles:
                for micro in range(accum):
                    batch = batches[(index + micro) % len(batches)]
                    loss = strategy.forward_backward(batch, micro == accum - 1)
            if last:
                # After backward, before the optimizer step: gradients and
                # optimizer states coexist.
                state.update(count_state_bytes(strategy.state_tensors()))
            applied.append(strategy.optimizer_step())
            # A float, not the tensor: keeping each step's detached loss tensor
            # grew a DDP rank's RSS by ~12 MiB a step (measured on the cpu
            # profile: peak 560 -> 720 MiB over 12 steps). The optimizer step is
            # already queued, so this sync adds nothing the timer's would not.
            value = float(loss)
            if not math.isfinite(value):
                raise FloatingPointError(f"non-finite training loss {value} at step {index}: the run diverged")
            losses.append(value)

        # A model without a FLOP formula has its FLOPs counted over the first step, a warmup step
        # (a counted step runs slower; with no warmup there is nothing to count in).
        counted: dict[str, float] = {}
        count = not FAMILIES[spec.model.family].formula and spec.max_warmup_steps > 0

        def counted_step(last: bool) -> None:
            if count and not counted:
                counted[COUNTED_FLOPS] = counted_flops(lambda: step(last))
            else:
                step(last)

        result = measure(counted_step, self.job, ctx, reporter)
        skipped = tuple(i for i, ok in enumerate(applied) if not ok)
        if len(skipped) == spec.steps:
            raise FloatingPointError(
                f"all {spec.steps} measured optimizer steps were skipped on fp16 overflow: "
                "the loss scale never settled, nothing was trained"
            )
        return result.report(
            ctx.rank,
            losses=tuple(losses),
            skipped_steps=skipped,
            metrics=rank_metrics(result.peak_mem_mib, state),
            model_state=state,
            detail={
                **compiles.detail(result.warmup_times_s, result.step_times_s),
                **counted,
                "materialised": factory.how,
            },
        )


def rank_metrics(peak_mem_mib: float, state: dict[str, int]) -> dict[str, float]:
    """This rank's values of the train kind's ``rank``-source metrics."""
    return {
        "peak_mem_mib": peak_mem_mib,
        "model_state_bytes_per_rank": state["total"],
        **{f"model_state.{c}": state[c] for c in ("params", "grads", "optimizer")},
    }


__all__ = ["TrainRunner"]
