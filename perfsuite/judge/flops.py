"""Model FLOPs utilisation (MFU) for GPU runs, with the formula and the peak named.

FLOPs per iteration follow Megatron's count for a transformer trained without
activation recomputation (Narayanan et al., 2021, eq. 3), with the FFN width
``f`` kept apart and the head chosen by what the model predicts:

    6*B*s*l*h*(4h + 2f + 2s) + head

B global batch, s sequence, l layers, h hidden, f FFN width. Each block's
forward costs 2*B*s*(4h^2 + 2hf) for its matmuls and 4*B*s^2*h for attention
scores and values; backward costs twice the forward. With f = 4h this is
Megatron's 72*B*s*l*h^2*(1 + s/(6h)) for the blocks. BERT's encoder blocks
cost the same as GPT's. The head:

* token head (masked or causal LM): 6*B*s*h*V, V the vocabulary, as Megatron;
* sequence classifier (``bert_cls``): 6*B*(h^2 + h*c), the pooler and the c
  classes on one token per row. An LM head there would add V/(12*l*h) times
  the blocks' 72*B*s*l*h^2, 0.28 at BERT-base's size;
* BERT pre-training (``bert_pretraining``): both, the LM head and the pooler
  with the c = 2 next-sentence classes, 6*B*s*h*V + 6*B*(h^2 + 2h).

Only matmuls count, in the blocks as in the heads: no biases, layer norms or
softmaxes. The token head is Megatron's GPT head, the decoder alone: BERT's
masked-LM head also applies a dense h x h transform to every token first,
6*B*s*h^2 more, h/(l*(12h + 2s)) of the blocks when f = 4h (about 0.6% at
BERT-base's size), left out in ``bert`` and ``bert_pretraining`` alike.

Peaks are dense (no 2:4 sparsity) datasheet figures per GPU, per exact SKU as
NVML names it: fp16/bf16 on tensor cores with fp32 accumulation (what autocast
uses), fp32 on the non-tensor units (torch does not use TF32 for matmuls by
default), TF32 and fp8 tensor-core rates and memory bandwidth for the
microbenchmarks. A GPU not listed gets no MFU, saying so; a profile's
``peak_tflops`` supplies one.

A model without a formula (a transformers architecture through ``ModelSpec.hf``)
has its FLOPs counted instead: rank 0 runs its first warmup step under
``torch.utils.flop_counter.FlopCounterMode`` (:mod:`perfsuite.rank.worker.flopcount`),
and the figure is labelled :data:`COUNTED`. On perfsuite's BERT and GPT
families the count agrees with the formula within 3%
(``tests/test_flopcount.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfsuite.core.models import CLASSIFICATION_LABELS, FAMILIES, NEXT_SENTENCE_LABELS

FORMULA = (
    "megatron, f apart: 6*B*s*l*h*(4h + 2f + 2s) + head per iteration, no recompute;"
    " head 6*B*s*h*V (LM), 6*B*(h^2 + h*c) (sequence classifier) or both with c = 2 (BERT pre-training:"
    " LM + next sentence)"
)
#: The label of a counted figure (``perfsuite.core.protocol.COUNTED_FLOPS``, per rank and step).
COUNTED = "counted: torch.utils.flop_counter.FlopCounterMode over rank 0's first training step (forward + backward)"


@dataclass(frozen=True)
class Peak:
    """Dense datasheet figures of one GPU SKU: TFLOP/s per math mode, memory GB/s."""

    sku: str
    fp16: float | None
    bf16: float | None
    fp32: float
    tf32: float | None = None
    fp8: float | None = None
    mem_gbps: float | None = None

    def tflops(self, precision: str) -> float | None:
        value: float | None = getattr(self, precision, None)
        return value


def _hopper(sku: str, tensor: float, fp32: float, mem_gbps: float) -> Peak:
    # Hopper: TF32 is half the fp16/bf16 rate, fp8 twice it.
    return Peak(sku, tensor, tensor, fp32, tensor / 2, tensor * 2, mem_gbps)


_H100_SXM = _hopper("H100 SXM5", 989.0, 67.0, 3350.0)
_H100_PCIE = _hopper("H100 PCIe", 756.0, 51.0, 2000.0)
_H100_NVL = _hopper("H100 NVL", 835.0, 60.0, 3900.0)
_H800_SXM = _hopper("H800 SXM5", 989.0, 67.0, 3350.0)
_A100_40 = Peak("A100 40GB", 312.0, 312.0, 19.5, 156.0, None, 1555.0)

#: Normalised NVML name (lowercase; "nvidia", "tesla", "geforce" dropped) -> peak.
PEAKS: Mapping[str, Peak] = {
    "v100-sxm2-16gb": Peak("V100 SXM2", 125.0, None, 15.7, mem_gbps=900.0),
    "v100-sxm2-32gb": Peak("V100 SXM2", 125.0, None, 15.7, mem_gbps=900.0),
    "v100-pcie-16gb": Peak("V100 PCIe", 112.0, None, 14.0, mem_gbps=900.0),
    "v100-pcie-32gb": Peak("V100 PCIe", 112.0, None, 14.0, mem_gbps=900.0),
    "v100s-pcie-32gb": Peak("V100S PCIe", 130.0, None, 16.4, mem_gbps=1134.0),
    "a100-sxm4-40gb": _A100_40,
    "a100-sxm4-80gb": Peak("A100 SXM4 80GB", 312.0, 312.0, 19.5, 156.0, None, 2039.0),
    "a100-pcie-40gb": _A100_40,
    "a100 80gb pcie": Peak("A100 PCIe 80GB", 312.0, 312.0, 19.5, 156.0, None, 1935.0),
    "rtx a6000": Peak("RTX A6000", 154.8, 154.8, 38.7, 77.4, None, 768.0),
    "rtx 3090 ti": Peak("GeForce RTX 3090 Ti (fp16 with fp32 accumulate)", 80.0, 80.0, 40.0, 40.0, None, 1008.0),
    "a10": Peak("A10", 125.0, 125.0, 31.2, 62.5, None, 600.0),
    "l40s": Peak("L40S", 362.0, 362.0, 91.6, 183.0, 733.0, 864.0),
    "h100 80gb hbm3": _H100_SXM,
    "h100 sxm5 80gb": _H100_SXM,
    "h100 pcie": _H100_PCIE,
    "h100 nvl": _H100_NVL,
    "h800": _H800_SXM,
    "h800 80gb hbm3": _H800_SXM,
    "h800 pcie": _hopper("H800 PCIe", 756.0, 51.0, 2000.0),
    "h20": _hopper("H20", 148.0, 44.0, 4000.0),
    "h200": _hopper("H200 SXM", 989.0, 67.0, 4800.0),
    "h200 nvl": _hopper("H200 NVL", 835.0, 60.0, 4800.0),
    "gh200 480gb": _hopper("GH200 (HBM3)", 989.0, 67.0, 4000.0),
    "gh200 144g hbm3e": _hopper("GH200 (HBM3e)", 989.0, 67.0, 4900.0),
    "b200": Peak("B200 (HGX, 1000 W)", 2250.0, 2250.0, 80.0, 1100.0, 4500.0, 8000.0),
}


def normalise(gpu_name: str) -> str:
    """``NVIDIA GeForce RTX 3090 Ti`` -> ``rtx 3090 ti``."""
    name = re.sub(r"\b(nvidia|tesla|geforce)\b", " ", gpu_name.lower())
    return " ".join(name.split())


def gpu_peak(gpu_name: str) -> Peak | None:
    return PEAKS.get(normalise(gpu_name))


def flops_per_iteration(config: Mapping[str, Any]) -> float:
    """Training FLOPs of one iteration of ``config``'s model, by :data:`FORMULA`."""
    m = config["model"]
    b, s, layers, h = config["global_batch"], config["seq_len"], m["layers"], m["hidden"]
    f = m.get("ffn") or 4 * h
    blocks = 6.0 * b * s * layers * h * (4 * h + 2 * f + 2 * s)
    family = FAMILIES.get(m.get("family", ""))
    objective = family.objective if family is not None else None
    lm_head = 6.0 * b * s * h * m["vocab"]

    def pooled(classes: int) -> float:  # the pooler and a classifier on one token per row
        return 6.0 * b * (h * h + h * classes)

    if objective == "classification":
        return blocks + pooled(CLASSIFICATION_LABELS)
    if objective == "mlm_nsp":
        return blocks + lm_head + pooled(NEXT_SENTENCE_LABELS)
    return blocks + lm_head


def has_formula(config: Mapping[str, Any]) -> bool:
    """Whether :data:`FORMULA` applies to this training config's model (else its FLOPs are counted)."""
    name = config["model"].get("family")
    if name is None:  # a bare shape (no family): the formula's own terms
        return True
    family = FAMILIES.get(name)
    return family is not None and family.formula


def rank_flops(config: Mapping[str, Any], counted: float | None = None) -> tuple[float, str] | None:
    """FLOPs one rank does per training step, and how they are known: by :data:`FORMULA` where
    the model has one, else ``counted`` (:data:`COUNTED`); None with neither."""
    if has_formula(config):
        return flops_per_iteration(config) / config["world_size"], FORMULA
    return (float(counted), COUNTED) if counted else None


def mfu(
    config: Mapping[str, Any],
    step_time_s: float,
    gpu_name: str,
    peaks: Mapping[str, float] | None = None,
    counted: float | None = None,
) -> dict[str, Any]:
    """MFU of one training run. ``peaks`` (precision -> TFLOP/s, from the
    profile) wins over the table; without a peak, or FLOPs (no formula and no
    count), ``value`` is None and ``note`` says why."""
    precision = config["precision"]
    flops = rank_flops(config, counted)
    if flops is None:
        note = f"no MFU: model family {config['model'].get('family')!r} has no FLOP formula and no count came back"
        return {"value": None, "gpu": gpu_name, "note": note}
    achieved = flops[0] / step_time_s / 1e12
    result: dict[str, Any] = {"achieved_tflops_per_gpu": achieved, "formula": flops[1], "gpu": gpu_name}
    if peaks and precision in peaks:
        return {
            **result,
            "value": achieved / peaks[precision],
            "peak_tflops": peaks[precision],
            "peak_source": "profile",
        }
    peak = gpu_peak(gpu_name)
    tflops = peak.tflops(precision) if peak else None
    if peak is None or tflops is None:
        why = f"no {precision} datasheet peak" if peak else "GPU not in perfsuite.judge.flops.PEAKS"
        note = f"no MFU for {gpu_name!r}: {why}; set the profile's peak_tflops to supply one"
        return {**result, "value": None, "peak_tflops": None, "note": note}
    return {**result, "value": achieved / tflops, "peak_tflops": tflops, "peak_source": f"datasheet: {peak.sku}"}


def of_peak(config: Mapping[str, Any], value: float, gpu_name: str) -> dict[str, Any]:
    """A microbenchmark's figure as a fraction of the GPU's datasheet peak
    (TFLOP/s for the dtype it ran in, or memory bandwidth for a copy)."""
    peak = gpu_peak(gpu_name)
    kind = "mem_gbps" if config["kind"] == "membw" else config["dtype"]
    figure = getattr(peak, kind, None) if peak else None
    unit = "GB/s" if kind == "mem_gbps" else "TFLOP/s"
    if peak is None or figure is None:
        why = f"no {kind} datasheet figure" if peak else "GPU not in perfsuite.judge.flops.PEAKS"
        return {"value": None, "peak": None, "unit": unit, "note": f"no peak for {gpu_name!r}: {why}"}
    return {"value": value / figure, "peak": figure, "unit": unit, "peak_source": f"datasheet: {peak.sku}"}
