"""Counted FLOPs (torch's FlopCounterMode over a real training step) against the
analytic formula perfsuite uses for MFU (:mod:`perfsuite.judge.flops`), per family:
they must agree within 5%. The difference that remains is what the formula
leaves out on purpose (BERT's masked-LM transform, biases) and what the
counter does not see."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from perfsuite import ModelSpec, Scenario  # noqa: E402
from perfsuite.judge.flops import flops_per_iteration  # noqa: E402
from perfsuite.rank.models.build import build_model, synthetic_batch  # noqa: E402
from perfsuite.rank.worker.flopcount import counted_flops  # noqa: E402

SHAPE = {"layers": 2, "hidden": 128, "heads": 4, "vocab": 1024, "max_positions": 64}
FAMILIES = ["bert", "bert_pretraining", "bert_cls", "gpt2", "megatron_gpt"]


@pytest.mark.parametrize("family", FAMILIES)
def test_counted_flops_agree_with_the_formula_within_5_percent(family: str) -> None:
    spec = ModelSpec(family, **SHAPE)
    scenario = Scenario("flops", family, spec, world_size=1, micro_batch=4, global_batch=4, seq_len=64)
    model = build_model(spec)
    batch = synthetic_batch(spec, 64, torch.device("cpu"), rows=4, seed=0)

    def step() -> None:
        model(**batch).loss.backward()

    counted = counted_flops(step)
    formula = flops_per_iteration(scenario.to_config())
    assert counted == pytest.approx(formula, rel=0.05), f"{family}: counted {counted:.4g}, formula {formula:.4g}"


def test_the_counter_sees_a_wider_ffn() -> None:
    narrow, wide = (ModelSpec("megatron_gpt", **SHAPE, ffn=ffn) for ffn in (256, 1024))
    flops = []
    for spec in (narrow, wide):
        model, batch = build_model(spec), synthetic_batch(spec, 64, torch.device("cpu"), rows=4, seed=0)
        flops.append(counted_flops(lambda m=model, b=batch: m(**b).loss.backward()))
    # Each block's MLP: 2 matmuls of h x f, forward and backward, 4 rows of 64 tokens, 2 layers.
    assert flops[1] - flops[0] == 6 * 2 * 2 * 128 * (1024 - 256) * 4 * 64
