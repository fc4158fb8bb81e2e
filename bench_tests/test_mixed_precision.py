"""Group mixed_precision: table A1 of the seed results (BERT-base pre-training,
fp32 vs automatic mixed precision).

The model is transformers' ``BertForPreTraining``, masked-LM and next-sentence
heads, 110,106,428 parameters at BERT-base's shape: the seed's count
(``BertForMaskedLM`` has 109,514,298; ``tests/test_models.py`` checks both).
Seed shape on GPU profiles; on ``cpu`` a 2-layer BERT with 2 gloo ranks. CPU
autocast is bf16 (fp16 matmuls have no fast CPU kernels), so the ``amp``
scenario runs bf16 there and fp16 with a gradient scaler on GPUs, like the seed.

Beside the seed's rows, two best-practice rows without a seed row (CUDA only): the
same model and sequence used well, bf16 autocast without a scaler, fused AdamW,
DDP's gradients as bucket views and a larger micro-batch, eager and compiled. The
seed's own setup ran at a fraction of its V100; these show what the stack does when
it is used well, where a regression in a fused kernel is not diluted by overhead.
Their micro-batch is provisional until an H100 run picks it with
``--perf-find-max-batch``.
"""

from perfsuite import ModelSpec, Relation, Scenario, parametrize, parametrize_relations

BERT_BASE = ModelSpec("bert_pretraining", layers=12, hidden=768, heads=12, vocab=30522, max_positions=512)
BERT_TINY = ModelSpec("bert_pretraining", layers=2, hidden=128, heads=2, vocab=8192, max_positions=128)

# fp32 vs AMP means the same on one card: GPU profiles with fewer than 4 GPUs
# run the seed shape per GPU (micro-batch 16 on each) at 2 or 1.
SEED_SHAPE = dict(
    world_size=4, world_sizes=(2, 1), micro_batch=16, global_batch=64, seq_len=512, warmup_steps=5, steps=20
)
CPU_SHAPE = dict(model=BERT_TINY, world_size=2, micro_batch=4, global_batch=8, seq_len=128, warmup_steps=3, steps=12)

FP32, AMP = SCENARIOS = [
    Scenario(
        "mixed_precision",
        "fp32",
        BERT_BASE,
        precision="fp32",
        **SEED_SHAPE,
        variants={"cpu": CPU_SHAPE},
        reference="A1 fp32: 103.07 +/- 1.03 samples/s, 17025 MB",
    ),
    Scenario(
        "mixed_precision",
        "amp",
        BERT_BASE,
        precision="fp16",
        **SEED_SHAPE,
        variants={"cpu": {**CPU_SHAPE, "precision": "bf16"}},
        reference="A1 mixed precision (fp16 AMP): 178.15 +/- 2.10 samples/s, 12698 MB",
    ),
]


# The best-practice counterparts: 2x the seed's micro-batch per GPU, everything else as the seed.
BEST_SHAPE = {**SEED_SHAPE, "micro_batch": 32, "global_batch": 128}
BEST_OPTIONS = {"optimizer": "adamw_fused", "gradient_as_bucket_view": True}
BEST, BEST_COMPILE = BEST_ROWS = [
    Scenario(
        "mixed_precision",
        name,
        BERT_BASE,
        precision="bf16",
        strategy_options=BEST_OPTIONS,
        graph=graph,
        **BEST_SHAPE,
        only_on=("cuda",),
        reference=f"no seed row: best-practice counterpart of A1 AMP ({graph})",
    )
    for name, graph in (("amp_best", "eager"), ("amp_best_compile", "compile"))
]
SCENARIOS = [*SCENARIOS, *BEST_ROWS]


@parametrize(SCENARIOS)
def test_mixed_precision(perf, scenario):
    perf.check(scenario)


# The seed's shape: AMP is faster and smaller on tensor-core GPUs. On CPUs,
# speed depends on the chip's bf16 support, and autocast keeps fp32 weights
# plus cached bf16 copies, so neither claim is made there.
RELATIONS = [
    Relation("samples_per_s", AMP, ">", FP32, only_on=("cuda",), why="A1: 178 vs 103 samples/s"),
    Relation("peak_mem_mib", AMP, "<", FP32, only_on=("cuda",), why="A1: 12698 vs 17025 MB"),
    *(
        Relation("samples_per_s", best, ">", AMP, only_on=("cuda",), why="best practice beats the seed's setup")
        for best in BEST_ROWS
    ),
]


@parametrize_relations(RELATIONS)
def test_mixed_precision_relations(perf, relation):
    perf.check_relation(relation)
