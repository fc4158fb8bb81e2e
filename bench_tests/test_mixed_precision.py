"""Group mixed_precision: table A1 of the seed results (BERT-base pre-training,
fp32 vs automatic mixed precision).

Seed shape on GPU profiles; on ``cpu`` a 2-layer BERT with 2 gloo ranks. CPU
autocast is bf16 (fp16 matmuls have no fast CPU kernels), so the ``amp``
scenario runs bf16 there and fp16 with a gradient scaler on GPUs, like the seed.
"""

from perfsuite import ModelSpec, Scenario, parametrize

BERT_BASE = ModelSpec("bert", layers=12, hidden=768, heads=12, vocab=30522, max_positions=512)
BERT_TINY = ModelSpec("bert", layers=2, hidden=128, heads=2, vocab=8192, max_positions=128)

SEED_SHAPE = dict(world_size=4, micro_batch=16, global_batch=64, seq_len=512, warmup_steps=5, steps=20)
CPU_SHAPE = dict(model=BERT_TINY, world_size=2, micro_batch=4, global_batch=8, seq_len=128, warmup_steps=3, steps=12)

SCENARIOS = [
    Scenario(
        "mixed_precision", "fp32", BERT_BASE, precision="fp32", **SEED_SHAPE,
        variants={"cpu": CPU_SHAPE},
        reference="A1 fp32: 103.07 +/- 1.03 samples/s, 17025 MB",
    ),
    Scenario(
        "mixed_precision", "amp", BERT_BASE, precision="fp16", **SEED_SHAPE,
        variants={"cpu": {**CPU_SHAPE, "precision": "bf16"}},
        reference="A1 mixed precision (fp16 AMP): 178.15 +/- 2.10 samples/s, 12698 MB",
    ),
]  # fmt: skip


@parametrize(SCENARIOS)
def test_mixed_precision(perf, scenario):
    perf.check(scenario)
