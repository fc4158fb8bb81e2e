"""Honest fp16 (issue: GPU runners for real): optimizer steps skipped on
loss-scale overflow are counted and kept out of throughput, and a non-finite
loss fails the scenario. Real fp16 autocast and GradScaler on CPU, 2 gloo ranks."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import CPU_PROFILE, TINY_SHAPE, bench_module

from perfsuite.rank.primitives import Precision


def test_the_scaler_reports_a_skipped_step() -> None:
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    precision = Precision("fp16", torch.device("cpu"))
    precision.backward((weight * 2).sum())
    assert precision.step(optimizer) is True and weight[0].item() != 1.0
    before = weight.detach().clone()
    precision.backward((weight * float("inf")).sum())
    assert precision.step(optimizer) is False and torch.equal(weight.detach(), before)


FAULTS = """
import torch
from perfsuite.rank.strategies.ddp import DDPStrategy

class Overflow(DDPStrategy):
    '''Every third step, gradients overflow, as an fp16 run's occasionally do.'''
    calls = 0

    def optimizer_step(self):
        Overflow.calls += 1
        if Overflow.calls % 3 == 0:
            next(p for p in self.model.parameters() if p.grad is not None).grad.fill_(float("inf"))
        return super().optimizer_step()

class Diverge(DDPStrategy):
    def forward_backward(self, batch, sync_grads):
        loss = super().forward_backward(batch, sync_grads)
        return loss * float("nan") if self.ctx.rank == 0 else loss
"""


def test_overflow_skipped_steps_are_counted_and_left_out(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(faults=FAULTS)
    shape = TINY_SHAPE.replace("steps=4", "steps=6")
    pytester.makepyfile(
        test_bench=bench_module(
            f'Scenario("fp16", "overflow", TINY, {shape}, precision="fp16", strategy="faults:Overflow"),'
        )
    )
    out = pytester.path / "r.json"
    pytester.runpytest_subprocess("-p", "no:cacheprovider", CPU_PROFILE, f"--perf-json={out}").assert_outcomes(
        skipped=1
    )
    (result,) = json.loads(out.read_text())["results"]
    metrics = result["metrics"]
    assert result["status"] == "ok" and result["verdict"] == "no_baseline"
    assert metrics["skipped_steps"] == 2  # measured steps 3 and 6 of the strategy's count, after 1 warmup step
    assert metrics["samples_per_s"]["n"] == 4 and len(metrics["step_times_s"]) == 4


def test_a_non_finite_loss_fails_the_scenario(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(faults=FAULTS)
    pytester.makepyfile(
        test_bench=bench_module(
            f'Scenario("fp16", "diverge", TINY, {TINY_SHAPE}, precision="fp16", strategy="faults:Diverge"),'
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", CPU_PROFILE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*fp16.diverge: error: workers crash: rank 0*FloatingPointError: non-finite training loss nan*"]
    )
