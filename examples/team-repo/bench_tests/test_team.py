"""The team's training-speed and memory gate: its own module under DDP and FSDP2, and a
Llama-style transformers config under DDP. Shapes fit a CPU; a GPU runner would get the real
ones through variants={"cuda": {...}}."""

from pathlib import Path

from perfsuite import ModelSpec, Scenario, parametrize

ENCODER = ModelSpec.module("teampkg.models:build", width=64, depth=4)
LLAMA = ModelSpec.hf(str(Path(__file__).parents[1] / "configs" / "llama-tiny" / "config.json"))
SHAPE = dict(world_size=2, world_sizes=(1,), micro_batch=4, global_batch=8, seq_len=32, warmup_steps=1, steps=5)

SCENARIOS = [
    Scenario("team", "encoder_ddp", ENCODER, strategy="ddp", reference="our encoder, data parallel", **SHAPE),
    Scenario("team", "encoder_fsdp2", ENCODER, strategy="fsdp2", reference="our encoder, FSDP2", **SHAPE),
    Scenario("team", "llama_ddp", LLAMA, strategy="ddp", reference="Llama-style config, data parallel", **SHAPE),
]


@parametrize(SCENARIOS)
def test_team(perf, scenario):
    perf.check(scenario)
