"""Group engines_1gpu: every training engine at world size 1.

A2's rows need two ranks or more to mean anything: sharding across one rank
shards nothing, and NCCL refuses two ranks on one GPU ("Duplicate GPU
detected"). So on a one-GPU runner they skip, and until these rows no engine
but DDP and tp_pp 1x1 had executed on a GPU. At world size 1 each engine still
runs its own CUDA code: its streams, fused or host optimizer, fp16 loss
scaling, ZeRO-3's parameter gathering, fairscale FSDP (CUDA only). These rows
time that code on one GPU, under ids of their own that carry none of A2's
sharding relations. megatron-core at tp1 x pp1 is ``parallel_3d.tp1_pp1_mcore``.

The model is GPT-2 medium (24 layers, hidden 1024, 354,871,296 parameters with
tied embeddings) at A2's sequence and precision (fp16 with a loss scaler), so a
launch costs seconds of steps on an H100 and ZeRO-3's optimizer offload (plain
torch AdamW on the host, no compiled op) stays within a second a step. On cpu a
4-layer GPT of hidden 64 at world size 1 over gloo, bf16, so CI executes every
engine's world-size-1 path, ZeRO-3's offload included; fairscale FSDP needs CUDA.
"""

from perfsuite import ModelSpec, Relation, Scenario, parametrize, parametrize_relations

GPT2_MEDIUM = ModelSpec("gpt2", layers=24, hidden=1024, heads=16, vocab=50304, max_positions=1024)
GPT_CPU = ModelSpec("gpt2", layers=4, hidden=64, heads=2, vocab=512, max_positions=128, dropout=0.0)

SHAPE = dict(world_size=1, micro_batch=4, global_batch=4, seq_len=1024, warmup_steps=3, steps=10, precision="fp16")
CPU_SHAPE = dict(model=GPT_CPU, micro_batch=4, global_batch=4, seq_len=128, precision="bf16", warmup_steps=2, steps=8)

# Tiers as A2's: a pull request gates DDP, ZeRO-3 and FSDP2, the engines with the most CUDA code of
# their own (and ZeRO-3 with offload); the others run nightly (on cpu ~10 s a launch each,
# ZeRO-3 ~30 s: its per-module gathering is Python hooks).
PR, NIGHTLY = "pr", "nightly"
# (name, strategy, its options, tier, reference); every row runs A2's AMP step on one rank.
ROWS = (
    ("ddp_amp", "ddp", {}, PR, "A2 mixed precision on one GPU: the engines' common ground"),
    ("zero1_amp", "deepspeed_zero", {"stage": 1}, NIGHTLY, "A2 + ZeRO-1 on one GPU"),
    ("zero2_amp", "deepspeed_zero", {"stage": 2}, NIGHTLY, "A2 + ZeRO-2 on one GPU"),
    ("zero3_amp", "deepspeed_zero", {"stage": 3}, PR, "A2 + ZeRO-3 on one GPU: parameters gathered per module"),
    ("fsdp2_amp", "fsdp2", {}, PR, "native FSDP on one GPU: fully_shard per transformer block"),
    ("fairscale_oss_amp", "fairscale_oss", {}, NIGHTLY, "A2 + fairscale OSS on one GPU"),
    ("fairscale_sdp_amp", "fairscale_sdp", {}, NIGHTLY, "A2 + OSS + ShardedDDP on one GPU"),
    ("fairscale_fsdp_amp", "fairscale_fsdp", {}, NIGHTLY, "A2 + fairscale FSDP on one GPU (CUDA only)"),
    ("torch_zero_amp", "torch_zero", {}, NIGHTLY, "native OSS on one GPU: ZeroRedundancyOptimizer"),
)


def row(name: str, strategy: str, options: dict, tier: str, reference: str, **extra) -> Scenario:
    return Scenario(
        "engines_1gpu",
        name,
        GPT2_MEDIUM,
        strategy=strategy,
        strategy_options=options,
        reference=reference,
        tier=tier,
        **SHAPE,
        variants={"cpu": CPU_SHAPE},
        **extra,
    )


DDP, ZERO1, ZERO2, ZERO3, FSDP2, OSS, SDP, FAIRSCALE_FSDP, TORCH_ZERO = ENGINES = [row(*r) for r in ROWS]
# On cpu the "offloaded" states stay where they were, so only the GPU judges what it saves; the
# row still runs there, so CI executes DeepSpeed's offload path (its config-built torch AdamW).
ZERO3_OFFLOAD = row(
    "zero3_offload_amp",
    "deepspeed_zero",
    {"stage": 3, "offload_optimizer": True},
    PR,
    "A2 + ZeRO-3 with its optimizer in host memory, on one GPU",
)
SCENARIOS = [*ENGINES, ZERO3_OFFLOAD]

# What one GPU can judge: the offload moves 12 of ZeRO-3's 16 bytes a parameter to the host.
RELATIONS = [
    Relation(
        "peak_mem_mib",
        ZERO3_OFFLOAD,
        "<",
        ZERO3,
        only_on=("cuda",),
        why="optimizer offload keeps fp32 master weights and Adam's states in host memory",
    ),
]


@parametrize(SCENARIOS)
def test_engines_1gpu(perf, scenario):
    perf.check(scenario)


@parametrize_relations(RELATIONS)
def test_engines_1gpu_relations(perf, relation):
    perf.check_relation(relation)
