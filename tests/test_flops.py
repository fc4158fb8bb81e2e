from __future__ import annotations

import pytest

from perfsuite.flops import flops_per_iteration, mfu

GPT_1_3B = {
    "model": {"layers": 24, "hidden": 2048, "vocab": 50304},
    "global_batch": 4,
    "seq_len": 1024,
    "precision": "fp16",
    "world_size": 4,
}


def test_megatron_formula_matches_6nd_plus_attention() -> None:
    # 72 B s l h^2 = 6 * (12 l h^2) * B s: the classic 6 x params x tokens for the blocks.
    flops = flops_per_iteration(GPT_1_3B)
    blocks = 6 * 12 * 24 * 2048**2 * 4 * 1024
    assert flops == pytest.approx(blocks * (1 + 1024 / (6 * 2048) + 50304 / (12 * 24 * 2048)))


def test_mfu_uses_the_gpu_peak_and_names_the_formula() -> None:
    result = mfu(GPT_1_3B, step_time_s=1.0, gpu_name="NVIDIA H100 80GB HBM3")
    assert result is not None and result["peak_tflops"] == 989.0
    assert result["value"] == pytest.approx(flops_per_iteration(GPT_1_3B) / 4 / 1e12 / 989.0)
    assert "72*B*s*l*h^2" in result["formula"]
    assert mfu(GPT_1_3B, 1.0, "Some Future GPU") is None
