"""The measured training loop of one rank."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from perfsuite.strategies.base import Strategy
from perfsuite.worker.health import HealthTracker
from perfsuite.worker.memory import MemoryTracker, count_state_bytes
from perfsuite.worker.runtime import Reporter, WorkerContext

STEADY_WINDOW = 3  # trailing warmup steps whose spread decides "settled"


def slowest_rank(seconds: float, ctx: WorkerContext) -> float:
    """Step time of the slowest rank, the same number on every rank, so all
    ranks agree on when warmup ends (unequal step counts would deadlock)."""
    value = torch.tensor([seconds], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def settled(times: Sequence[float], threshold: float) -> bool:
    """The trailing window's spread (max - min) / median is within ``threshold``."""
    if len(times) < STEADY_WINDOW:
        return False
    window = times[-STEADY_WINDOW:]
    return (max(window) - min(window)) / statistics.median(window) <= threshold


def burn(seconds: float, ctx: WorkerContext) -> None:
    """Real device work for about ``seconds`` (the planted slowdown): matmuls
    on the training device, synchronised, so it is as visible to the timer as
    slower kernels would be."""
    a = torch.randn(256, 256, device=ctx.device)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)
        ctx.synchronize()


class Trainer:
    """Runs steps of one strategy and times each from synchronised clocks."""

    def __init__(
        self,
        strategy: Strategy,
        batches: Sequence[Mapping[str, torch.Tensor]],
        scenario: Mapping[str, Any],
        ctx: WorkerContext,
    ) -> None:
        self.strategy, self.batches, self.ctx = strategy, batches, ctx
        # A pipelined strategy takes the whole step's batch in one call.
        self.accum = 1 if strategy.pipelined else scenario["grad_accum"]
        self.burn_s = 0.0  # planted extra work per step, set once warmup knows a step's cost
        self.step_index = 0
        self.loss = torch.zeros(())

    def step(self, count_state: bool = False) -> tuple[float, dict[str, int]]:
        state: dict[str, int] = {}
        self.ctx.synchronize()
        start = time.perf_counter()
        for micro in range(self.accum):
            batch = self.batches[(self.step_index + micro) % len(self.batches)]
            self.loss = self.strategy.forward_backward(batch, micro == self.accum - 1)
        if count_state:
            state = count_state_bytes(self.strategy.state_tensors())
        self.strategy.optimizer_step()
        self.ctx.synchronize()
        if self.burn_s:
            burn(self.burn_s, self.ctx)
        self.step_index += 1
        return time.perf_counter() - start, state


def train(
    strategy: Strategy,
    batches: Sequence[Mapping[str, torch.Tensor]],
    scenario: Mapping[str, Any],
    ctx: WorkerContext,
    reporter: Reporter,
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """Warm up until step times settle, then time ``steps`` steps.

    Warmup runs at least ``warmup_steps`` and at most ``max_warmup_steps``
    steps; it ends early once the trailing window's spread is within
    ``settings["steady_threshold"]``. Model state is counted on the last step
    after backward and before the optimizer step, when gradients and optimizer
    states coexist.

    A planted slowdown (``slowdown_pct``) adds a fixed amount of device work
    to every step after the first warmup steps: that percentage of their
    median (slowest-rank) time. A fixed amount, because burning a share of each
    step's own time would feed back through the ranks' waits on each other.
    """
    trainer = Trainer(strategy, batches, scenario, ctx)
    slowdown = settings.get("slowdown_pct", 0.0) / 100
    minimum, threshold = scenario["warmup_steps"], settings.get("steady_threshold", 0.1)
    warmup: list[float] = []
    settle_from = 0  # steady-state is judged on steps with the final per-step work
    while len(warmup) < scenario["max_warmup_steps"]:
        if len(warmup) >= minimum and settled(warmup[settle_from:], threshold):
            break
        reporter.phase(f"warmup step {len(warmup)}")
        warmup.append(slowest_rank(trainer.step()[0], ctx))
        if slowdown and not trainer.burn_s and len(warmup) >= max(1, minimum):
            trainer.burn_s = slowdown * statistics.median(warmup)
            settle_from = len(warmup)
    if slowdown and not trainer.burn_s:  # no warmup allowed: one reference step
        trainer.burn_s = slowdown * slowest_rank(trainer.step()[0], ctx)
    times: list[float] = []
    losses: list[float] = []
    state: dict[str, int] = {}
    with MemoryTracker.for_device(ctx.device) as memory, HealthTracker.for_device(ctx.device) as health:
        for i in range(scenario["steps"]):
            reporter.phase(f"measure step {len(warmup) + i}")
            elapsed, counted = trainer.step(count_state=i == scenario["steps"] - 1)
            state = counted or state
            memory.sample()
            health.sample()
            times.append(elapsed)
            losses.append(float(trainer.loss))
    return {
        "step_times_s": times,
        "warmup_times_s": warmup,
        "steady_state_start": len(warmup),
        "losses": losses,
        "peak_mem_mib": memory.result.peak_mem_mib,
        "memory": memory.result.detail,
        "health": health.result,
        "model_state": state,
    }
