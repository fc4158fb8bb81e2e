"""The measured training loop of one rank."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from perfsuite.strategies.base import Strategy
from perfsuite.worker.memory import MemoryTracker, count_state_bytes
from perfsuite.worker.runtime import Reporter, WorkerContext


def train(
    strategy: Strategy,
    batches: Sequence[Mapping[str, torch.Tensor]],
    scenario: Mapping[str, Any],
    ctx: WorkerContext,
    reporter: Reporter,
) -> dict[str, Any]:
    """Run warmup plus measured steps; return raw per-step times and memory.

    Each step is bracketed by device synchronisation so the host clock measures
    finished work. Model state is counted on the last step after backward and
    before the optimizer step, when gradients and optimizer states coexist.
    """
    warmup, steps, accum = scenario["warmup_steps"], scenario["steps"], scenario["grad_accum"]
    times: list[float] = []
    losses: list[float] = []
    state: dict[str, int] = {}
    with MemoryTracker.for_device(ctx.device) as memory:
        for step in range(warmup + steps):
            measuring = step >= warmup
            reporter.phase(f"{'measure' if measuring else 'warmup'} step {step}")
            ctx.synchronize()
            start = time.perf_counter()
            for micro in range(accum):
                loss = strategy.forward_backward(batches[(step + micro) % len(batches)], micro == accum - 1)
            if step == warmup + steps - 1:
                state = count_state_bytes(strategy.state_tensors())
            strategy.optimizer_step()
            ctx.synchronize()
            elapsed = time.perf_counter() - start
            memory.sample()
            if measuring:
                times.append(elapsed)
                losses.append(float(loss))
    return {
        "step_times_s": times,
        "losses": losses,
        "peak_mem_mib": memory.result.peak_mem_mib,
        "memory": memory.result.detail,
        "model_state": state,
    }
