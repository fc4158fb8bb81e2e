from __future__ import annotations

import pytest

from perfsuite.core.models import CLASSIFICATION_LABELS, NEXT_SENTENCE_LABELS
from perfsuite.judge.flops import COUNTED, FORMULA, flops_per_iteration, gpu_peak, mfu, of_peak

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


def test_the_ffn_width_counts_as_itself_not_as_4h() -> None:
    narrow = {**GPT_1_3B, "model": {**GPT_1_3B["model"], "ffn": 2048}}  # f = h: the FFN costs a quarter
    b, s, layers, h = 4, 1024, 24, 2048
    ffn_saved = 3 * 2 * b * s * (2 * h * 4 * h - 2 * h * h) * layers  # forward + backward, two matmuls
    assert flops_per_iteration(GPT_1_3B) - flops_per_iteration(narrow) == pytest.approx(ffn_saved)


def test_a_sequence_classifier_counts_its_small_head_not_an_lm_head() -> None:
    model = {"layers": 12, "hidden": 768, "vocab": 30522}
    config = {"global_batch": 32, "seq_len": 128, "precision": "fp16", "world_size": 1}
    lm = flops_per_iteration({**config, "model": {**model, "family": "bert"}})
    cls = flops_per_iteration({**config, "model": {**model, "family": "bert_cls"}})
    assert lm - cls == pytest.approx(6 * 32 * 128 * 768 * 30522 - 6 * 32 * (768**2 + 768 * CLASSIFICATION_LABELS))
    blocks = 72 * 32 * 128 * 12 * 768**2 * (1 + 128 / (6 * 768))
    assert cls == pytest.approx(blocks, rel=1e-3)  # the classifier is a rounding error
    assert lm / cls == pytest.approx(1 + 30522 / (12 * 12 * 768) / (1 + 128 / (6 * 768)), rel=1e-3)


def test_bert_pretraining_counts_the_lm_head_and_the_next_sentence_head() -> None:
    # Seed A1: BERT-base, global batch 64, seq 512. BertForPreTraining is
    # BertForMaskedLM plus the pooler (h*h + h) and a 2-way classifier (2h + 2):
    # their matmuls cost 6*B*(h^2 + 2h) per iteration, one token per row.
    model = {"layers": 12, "hidden": 768, "vocab": 30522}
    config = {"global_batch": 64, "seq_len": 512, "precision": "fp16", "world_size": 4}
    lm = flops_per_iteration({**config, "model": {**model, "family": "bert"}})
    pretraining = flops_per_iteration({**config, "model": {**model, "family": "bert_pretraining"}})
    assert NEXT_SENTENCE_LABELS == 2
    assert pretraining - lm == pytest.approx(6 * 64 * (768**2 + 768 * 2))
    blocks = 72 * 64 * 512 * 12 * 768**2 * (1 + 512 / (6 * 768))
    assert pretraining == pytest.approx(blocks + 6 * 64 * 512 * 768 * 30522 + 6 * 64 * (768**2 + 2 * 768))
    assert 0 < pretraining / lm - 1 < 1e-5  # the next-sentence head is a rounding error
    assert "BERT pre-training" in mfu(config | {"model": model}, 1.0, "NVIDIA H100 80GB HBM3")["formula"]


def test_mfu_uses_the_gpu_peak_and_names_the_formula() -> None:
    result = mfu(GPT_1_3B, step_time_s=1.0, gpu_name="NVIDIA H100 80GB HBM3")
    assert result["peak_tflops"] == 989.0 and result["peak_source"] == "datasheet: H100 SXM5"
    assert result["value"] == pytest.approx(flops_per_iteration(GPT_1_3B) / 4 / 1e12 / 989.0)
    assert "6*B*s*l*h*(4h + 2f + 2s)" in result["formula"] and "6*B*s*h*V" in result["formula"]


def test_a_model_without_a_formula_takes_the_count_and_says_so() -> None:
    llama = {**GPT_1_3B, "model": {**GPT_1_3B["model"], "family": "hf", "source": "llama"}}
    counted = mfu(llama, 0.5, "NVIDIA H100 80GB HBM3", counted=2.0e15)
    assert counted["formula"] == COUNTED and counted["value"] == pytest.approx(2.0e15 / 0.5 / 1e12 / 989.0)
    nothing = mfu(llama, 0.5, "NVIDIA H100 80GB HBM3")
    assert nothing["value"] is None and "no FLOP formula and no count" in nothing["note"]
    # A family with a formula keeps it, whatever the ranks counted.
    assert mfu(GPT_1_3B, 1.0, "NVIDIA H100 80GB HBM3", counted=1.0)["formula"] == FORMULA


@pytest.mark.parametrize(
    ("nvml_name", "sku", "fp16"),
    [
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),  # a substring match would give the SXM peak
        ("NVIDIA H100 NVL", "H100 NVL", 835.0),
        ("NVIDIA H800", "H800 SXM5", 989.0),
        ("NVIDIA H20", "H20", 148.0),
        ("NVIDIA H200 NVL", "H200 NVL", 835.0),
        ("NVIDIA GH200 480GB", "GH200 (HBM3)", 989.0),
        ("NVIDIA B200", "B200 (HGX, 1000 W)", 2250.0),
        ("NVIDIA L40S", "L40S", 362.0),
        ("NVIDIA A10", "A10", 125.0),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 312.0),
        ("Tesla V100-SXM2-32GB", "V100 SXM2", 125.0),
        ("NVIDIA RTX A6000", "RTX A6000", 154.8),
        ("NVIDIA GeForce RTX 3090 Ti", "GeForce RTX 3090 Ti (fp16 with fp32 accumulate)", 80.0),
    ],
)
def test_each_sku_gets_its_own_datasheet_peak(nvml_name: str, sku: str, fp16: float) -> None:
    peak = gpu_peak(nvml_name)
    assert peak is not None and peak.sku == sku and peak.tflops("fp16") == fp16


def test_unknown_gpu_or_precision_says_why_and_a_profile_can_supply_the_peak() -> None:
    unknown = mfu(GPT_1_3B, 1.0, "NVIDIA Future GPU")
    assert unknown["value"] is None and "GPU not in perfsuite.judge.flops.PEAKS" in unknown["note"]
    v100_bf16 = mfu({**GPT_1_3B, "precision": "bf16"}, 1.0, "Tesla V100-SXM2-32GB")
    assert v100_bf16["value"] is None and "no bf16 datasheet peak" in v100_bf16["note"]
    supplied = mfu(GPT_1_3B, 1.0, "NVIDIA Future GPU", peaks={"fp16": 500.0})
    assert supplied["peak_tflops"] == 500.0 and supplied["peak_source"] == "profile"


def test_microbench_figures_are_a_fraction_of_the_datasheet_peak() -> None:
    # The physical-limit anchors on H100 SXM: bf16 matmul ~794 TFLOP/s, copy ~3.0 TB/s.
    bf16 = of_peak({"kind": "microbench", "dtype": "bf16"}, 794.0, "NVIDIA H100 80GB HBM3")
    assert bf16["value"] == pytest.approx(0.803, abs=1e-3) and bf16["peak"] == 989.0
    assert of_peak({"kind": "microbench", "dtype": "tf32"}, 400.0, "NVIDIA H100 80GB HBM3")["peak"] == 494.5
    copy = of_peak({"kind": "membw"}, 3000.0, "NVIDIA H100 80GB HBM3")
    assert copy["value"] == pytest.approx(3000 / 3350) and copy["unit"] == "GB/s"
    v100_fp8 = of_peak({"kind": "microbench", "dtype": "fp8"}, 1.0, "Tesla V100-SXM2-32GB")
    assert v100_fp8["value"] is None and "no fp8 datasheet figure" in v100_fp8["note"]
