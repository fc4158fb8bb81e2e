"""perfsuite's own ``pytest_perfsuite_extra_metrics``: ungated figures added to
every result (MFU and the datasheet fraction on GPUs, the fraction of this
session's measured ceiling, the cost). A built-in plugin module registered
like the exporters, so a user's implementation of the same hook adds to it.
Pytest side, torch-free.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfsuite.core.profiles import HardwareProfile
from perfsuite.core.protocol import COUNTED_FLOPS
from perfsuite.judge.ceilings import Ceilings
from perfsuite.judge.flops import mfu, of_peak
from perfsuite.judge.results import ScenarioResult
from perfsuite.reports.cost import cost_of


@pytest.hookimpl
def pytest_perfsuite_extra_metrics(
    result: ScenarioResult, fingerprint: dict[str, Any], profile: HardwareProfile, ceilings: Ceilings
) -> dict[str, Any] | None:
    """perfsuite's default: for a GPU training run, MFU (Megatron's FLOP
    formula, named in the value, against the GPU's datasheet peak); for a GPU
    microbenchmark, its fraction of the datasheet peak; for a training run on
    any device, its achieved TFLOP/s against the best matmul this session measured."""
    if result.metrics is None:
        return None
    config = result.scenario.to_config()
    gpus = fingerprint.get("gpus") or []
    extra: dict[str, Any] = {}
    counted = result.metrics.detail.get(COUNTED_FLOPS)  # a model without a FLOP formula: rank 0 counted them
    step_s = result.metrics.step_time_median_s
    if profile.device == "cuda" and gpus and "model" in config:
        extra["mfu"] = mfu(config, step_s, gpus[0]["name"], profile.peak_tflops, counted)
    if profile.device == "cuda" and gpus and config["kind"] in ("microbench", "membw"):
        extra["peak"] = of_peak(config, result.metrics.value(result.scenario.primary), gpus[0]["name"])
    ceiling = ceilings.fraction(config, step_s, counted)
    if ceiling is not None:
        extra["ceiling"] = ceiling
    values = {name: result.metrics.value(name) for name in result.metrics.values}
    cost = cost_of(config, values, result.metrics.health, profile.gpu_hour_price, profile.currency)
    if cost is not None:
        extra["cost"] = cost
    return extra or None
