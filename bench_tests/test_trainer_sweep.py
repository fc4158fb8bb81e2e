"""Group trainer_sweep: table C2 of the seed results (a ``transformers.Trainer``
masked-LM pre-training job swept over fp16, per-device batch and GPU count).

Seed shape on GPU profiles: BERT-base layers with vocab 128100 (184,551,780
parameters), 2048 training and 1024 evaluation rows of seq 128, 2 epochs,
gradient accumulation 4, evaluation after each epoch. Each row's id names its
GPU count, so it has no ``world_sizes``: on a machine with fewer GPUs it skips
saying how many it needs rather than run a different experiment.

On ``cpu`` a 2-layer, 128-wide BERT on gloo ranks, with the rows' training set
sized to the same number of optimizer steps for every row; the gpu1 and gpu2
rows at per-device batch 16 run there. CPU autocast is
bf16 (the Trainer has no fp16 path on cpu), so the ``fp16`` rows run bf16 there.
"""

from perfsuite import ModelSpec, Relation, TrainerScenario, parametrize, parametrize_relations

BERT_SEED = ModelSpec("bert", layers=12, hidden=768, heads=12, vocab=128100, ffn=3072, max_positions=512)
BERT_TINY = ModelSpec("bert", layers=2, hidden=128, heads=2, vocab=1024, max_positions=64)

GPUS, BATCHES, FP16 = (1, 2, 4), (4, 8, 16), (False, True)
SEED = dict(grad_accum=4, train_samples=2048, eval_samples=1024, epochs=2, seq_len=128, warmup_steps=3)
# 4 optimizer steps per epoch for every cpu row (8 in all: 2 warmup, 6 timed),
# so a row's run time follows its work per step; the seed's 2:1 train:eval ratio is kept.
CPU_STEPS_PER_EPOCH = 4
# 128 wide rather than 64: steps of 50-400 ms instead of 30-150 ms, which the
# other load on a shared 2-core VM jitters less (samples/s CV measured 0.03-0.30
# against up to 0.45 at 64 wide, near the cpu profile's 0.5 limit), for about
# 1 s more per row.
CPU = dict(model=BERT_TINY, seq_len=32, warmup_steps=2)
# gpu4 rows run on GPU profiles only. On cpu their 4 ranks each import torch
# and transformers (5 s alone, far more with four sharing 2 cores) before 1-2 s
# of training: measured on the loaded VM, the six gpu4 rows took 153 s of the
# group's 308 s (gpu1 rows 67 s, gpu2 rows 87 s). Four ranks time-sharing two
# cores would also measure the scheduler, not data-parallel scaling.
ONLY_ON = {4: ("cuda",)}
# Per-device batches 4 and 8 also run on GPU profiles only: each cpu row costs
# 8-9 s, mostly torch, transformers and accelerate imports, and the CI job has
# a 15-minute budget; batch 16 still shows fp32 vs bf16 and scaling there.
CPU_BATCHES = (16,)


def cpu_variant(gpus: int, batch: int, fp16: bool) -> dict[str, object]:
    rows = CPU_STEPS_PER_EPOCH * batch * SEED["grad_accum"] * gpus
    return {**CPU, "train_samples": rows, "eval_samples": rows // 2, **({"precision": "bf16"} if fp16 else {})}


def row(gpus: int, batch: int, fp16: bool) -> TrainerScenario:
    precision = "fp16" if fp16 else "fp32"
    return TrainerScenario(
        "trainer_sweep",
        f"gpu{gpus}_bs{batch}_{precision}",
        BERT_SEED,
        precision=precision,
        world_size=gpus,
        per_device_batch=batch,
        **SEED,
        variants={"cpu": cpu_variant(gpus, batch, fp16)},
        only_on=ONLY_ON.get(gpus, ()) or (() if batch in CPU_BATCHES else ("cuda",)),
        reference=f"C2 {'fp16' if fp16 else 'fp32'}, {gpus} GPU(s), per-device batch {batch}, "
        f"total batch {gpus * batch * 4}",
    )


ROWS = {(g, b, f): row(g, b, f) for f in FP16 for g in GPUS for b in BATCHES}
SCENARIOS = list(ROWS.values())


@parametrize(SCENARIOS)
def test_trainer_sweep(perf, scenario):
    perf.check(scenario)


# fp16 paid off on one GPU in the seed (V100 23.4 vs 11.4, A100 35.6 vs 14.3
# samples/s at per-device batch 8). CPU autocast is bf16 and its speed depends
# on the chip, so the claim is made on GPUs only.
FP16_FASTER = [
    Relation("samples_per_s", ROWS[1, 8, True], ">", ROWS[1, 8, False], only_on=("cuda",), why="C2 gpu1_bs8"),
]

# Data parallelism must scale: N GPUs deliver more than 70% of N x one GPU's
# samples/s at the same precision and per-device batch. The seed's anomaly
# fails this: from its own figures, fp16 reached 11-39% efficiency on 2 and 4
# GPUs (multi-GPU slower per sample than one), fp32 44-79%. The outcome names
# the efficiency reached either way.
SCALING = [
    Relation(
        "samples_per_s",
        ROWS[g, b, f],
        ">",
        ROWS[1, b, f],
        factor="scaling",
        efficiency=0.7,
        only_on=("cuda",),
        why="C2: multi-GPU must not be slower per sample than one GPU",
    )
    for f in FP16
    for b in BATCHES
    for g in (2, 4)
]
# On cpu a floor, not the GPU claim: 2 gloo ranks (one thread each) against
# one. Measured on the shared 2-core VM: 83-100% with little other load, but
# 38-164% over 18 pairs while other jobs kept the load at 3-6 (a row's
# samples/s swung up to 2x between sessions, and two ranks suffer more from
# that load than one). 30% would gate with too little margin; 20% leaves about
# 2x below the worst seen. It reports the efficiency every session and fails
# only on a breakdown: two ranks together slower than 0.4x one rank (ranks
# that merely took turns would still reach 50%).
CPU_SCALING = [
    Relation(
        "samples_per_s",
        ROWS[2, b, f],
        ">",
        ROWS[1, b, f],
        factor="scaling",
        efficiency=0.2,
        only_on=("cpu",),
        why="gloo ranks on a shared 2-core machine",
    )
    for f in FP16
    for b in CPU_BATCHES
]
RELATIONS = FP16_FASTER + SCALING + CPU_SCALING


@parametrize_relations(RELATIONS)
def test_trainer_sweep_relations(perf, relation):
    perf.check_relation(relation)
