"""Model FLOPs utilisation (MFU) for GPU runs, with the formula named.

FLOPs per iteration use Megatron's formula for a transformer trained without
activation recomputation (Narayanan et al., 2021, eq. 3):

    72 * B * s * l * h^2 * (1 + s / (6 h) + V / (12 l h))

B global batch, s sequence, l layers, h hidden, V vocabulary. It counts the
forward and backward matmuls (including attention scores and the LM head);
BERT's encoder blocks have the same per-layer cost, so it applies to them too.
Peak rates are dense tensor-core datasheet figures per GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FORMULA = "megatron: 72*B*s*l*h^2*(1 + s/(6h) + V/(12lh)) per iteration, no recompute"

#: Dense peak TFLOP/s per GPU by precision (fp32 runs use TF32 tensor cores
#: only where torch allows it; the fp32 figure is the non-tensor-core peak).
PEAK_TFLOPS: Mapping[str, Mapping[str, float]] = {
    "h200": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
    "h100": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
    "a100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "v100": {"bf16": 0.0, "fp16": 125.0, "fp32": 15.7},
}


def flops_per_iteration(config: Mapping[str, Any]) -> float:
    m = config["model"]
    b, s, layers, h, v = config["global_batch"], config["seq_len"], m["layers"], m["hidden"], m["vocab"]
    return 72.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))


def peak_tflops(gpu_name: str, precision: str) -> float | None:
    name = gpu_name.lower()
    for key, peaks in PEAK_TFLOPS.items():
        if key in name and peaks.get(precision):
            return peaks[precision]
    return None


def mfu(config: Mapping[str, Any], step_time_s: float, gpu_name: str) -> dict[str, Any] | None:
    """MFU of one run, or None where the GPU's peak is unknown."""
    peak = peak_tflops(gpu_name, config["precision"])
    if peak is None:
        return None
    achieved = flops_per_iteration(config) / step_time_s / config["world_size"] / 1e12
    return {"value": achieved / peak, "achieved_tflops_per_gpu": achieved, "peak_tflops": peak, "formula": FORMULA}
