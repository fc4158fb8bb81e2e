"""The team's real job: a Llama-style model of 1.24B parameters (Llama 3.2 1B's shape) on an
8-GPU node, under FSDP2 and under DeepSpeed ZeRO-3 with the team's own DeepSpeed JSON.

Nothing here is shrunk for perfsuite: the `cuda` shape is the job's (8 ranks, bf16, 4 sequences
of 2048 tokens per GPU). Each rank builds only its part of the model: FSDP2 builds on the meta
device and gives each rank storage for its shards, ZeRO-3 partitions the weights inside
`deepspeed.zero.Init`. On `cpu` the same scenarios train the tiny Llama config on 2 ranks, so a
laptop checks that the job is wired up before the GPU runner measures it."""

from pathlib import Path

from perfsuite import ModelSpec, Scenario, parametrize

CONFIGS = Path(__file__).parents[1] / "configs"
LLAMA_1B = ModelSpec.hf(str(CONFIGS / "llama-1b" / "config.json"))
LLAMA_TINY = ModelSpec.hf(str(CONFIGS / "llama-tiny" / "config.json"))
# The batch keys in it are "auto": perfsuite fills them from the scenario's batch.
DS_ZERO3 = str(CONFIGS / "ds_zero3.json")

JOB = dict(world_size=8, precision="bf16", micro_batch=4, global_batch=32, seq_len=2048, warmup_steps=3, steps=10)
CPU = dict(model=LLAMA_TINY, world_size=2, micro_batch=2, global_batch=4, seq_len=32, warmup_steps=1, steps=3)

SCENARIOS = [
    Scenario(
        "llama_1b",
        "fsdp2",
        LLAMA_1B,
        strategy="fsdp2",
        strategy_options={"optimizer": "adamw_fused"},
        **JOB,
        variants={"cpu": CPU},
        reference="our 1B Llama pre-training job, FSDP2 on 8 GPUs",
    ),
    Scenario(
        "llama_1b",
        "zero3",
        LLAMA_1B,
        strategy="deepspeed_zero",
        strategy_options={"config": DS_ZERO3},
        **JOB,
        variants={"cpu": CPU},
        reference="our 1B Llama pre-training job, DeepSpeed ZeRO-3 with our ds_zero3.json",
    ),
]


@parametrize(SCENARIOS)
def test_llama_1b(perf, scenario):
    perf.check(scenario)
