"""The trainer workload kind: validation, the schedule derived from the
Trainer's own rules, the seed model's size, and a real Trainer job end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import CPU_PROFILE

from perfsuite import ModelSpec, ScenarioError
from perfsuite.core.workloads.trainer import TrainerScenario

SEED_MODEL = ModelSpec("bert", layers=12, hidden=768, heads=12, vocab=128100, ffn=3072, max_positions=512)


def seed_row(gpus: int, batch: int, **fields: object) -> TrainerScenario:
    kwargs: dict[str, object] = {"model": SEED_MODEL, "world_size": gpus, "per_device_batch": batch, **fields}
    return TrainerScenario("trainer_sweep", f"gpu{gpus}_bs{batch}", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"precision": "fp8"}, "precision"),
        ({"per_device_batch": 0}, "per_device_batch"),
        ({"grad_accum": "4"}, "grad_accum"),
        ({"eval_samples": 0}, "eval_samples"),
        ({"epochs": 0}, "epochs"),
        ({"train_samples": 1000}, "train_samples"),  # not a multiple of the total batch 32
        ({"seq_len": 1024}, "seq_len"),  # beyond max_positions
        ({"model": ModelSpec("gpt2", layers=2, hidden=64, heads=2)}, "model"),  # not a masked-LM
        ({"warmup_steps": 127}, "warmup_steps"),  # leaves 1 of 128 optimizer steps to measure
        ({"warmup_steps": 0}, "warmup_steps"),  # the first step builds optimizer state
        ({"max_warmup_steps": 9}, "max_warmup_steps"),  # the schedule is fixed
        ({"variants": {"cpu": {"steps": 3}}}, "variants['cpu']"),  # steps are derived
        ({"variants": {"cpu": {"train_samples": 48}}}, "train_samples"),
        ({"tolerances": {"busbw_gbps": 0.1}}, "tolerances"),  # a metric this kind does not produce
    ],
)
def test_bad_field_is_named(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(f"field {field!r}")):
        seed_row(1, 8, **overrides)


@pytest.mark.parametrize(
    ("gpus", "batch", "total", "steps"),
    # C2's "total bs" and "steps" columns
    [
        (4, 8, 128, 32),
        (4, 4, 64, 64),
        (2, 8, 64, 64),
        (2, 4, 32, 128),
        (1, 8, 32, 128),
        (1, 4, 16, 256),
        (1, 16, 64, 64),
    ],
)
def test_schedule_matches_the_seed_table(gpus: int, batch: int, total: int, steps: int) -> None:
    row = seed_row(gpus, batch, warmup_steps=3)
    assert (row.total_batch, row.optimizer_steps, row.steps) == (total, steps, steps - 3)
    assert row.step_work() == {"samples_per_s": total, "tokens_per_s": total * 128}
    config = row.to_config()
    assert (config["total_batch"], config["optimizer_steps"], config["steps"]) == (total, steps, steps - 3)
    for name in ("model", "precision", "per_device_batch", "grad_accum", "train_samples", "eval_samples", "epochs"):
        assert name in config


def test_a_variant_rederives_the_measured_steps() -> None:
    row = seed_row(2, 8, warmup_steps=3, variants={"cpu": {"train_samples": 256, "warmup_steps": 2}})
    cpu = row.resolve(("cpu",))
    assert (cpu.optimizer_steps, cpu.steps) == (8, 6)  # 2 epochs x 256 / 64
    assert cpu.rank_spec().optimizer_steps == 8 and cpu.rank_spec().max_warmup_steps == 2


def test_the_seed_model_has_the_seed_parameter_count() -> None:
    torch = pytest.importorskip("torch")
    from perfsuite.rank.models.hf import bert

    with torch.device("meta"):  # shapes only: no 700 MB of fp32 weights
        model = bert(SEED_MODEL)
    # parameters() counts the decoder weight, tied to the word embeddings, once.
    assert sum(p.numel() for p in model.parameters()) == 184_551_780


def test_the_step_clock_splits_warmup_and_lists_skipped_updates(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from perfsuite.rank.worker.runtime import Reporter, WorkerContext
    from perfsuite.rank.worker.trainer import StepClock

    spec = seed_row(1, 16, train_samples=256, warmup_steps=2).rank_spec()  # 2 x 256/64 = 8 steps: 2 + 6
    clock = StepClock(spec, WorkerContext(0, 0, 1, torch.device("cpu"), "gloo"), Reporter(tmp_path, 0), 0.0)
    overflowed = {3, 6}  # optimizer steps (0-based) whose fp16 update the GradScaler skipped
    for step in range(spec.optimizer_steps):
        clock.accelerator = SimpleNamespace(optimizer_step_was_skipped=step in overflowed)
        clock.on_step_begin(None, None, None)  # type: ignore[arg-type]
        clock.on_step_end(None, None, None)  # type: ignore[arg-type]
    assert (len(clock.warmup), len(clock.times)) == (2, 6)
    assert clock.skipped == [1, 4]  # indices among the measured steps, as RankReport.skipped_steps counts them
    assert clock.memory.result.peak_mem_mib > 0 and clock.health.result["samples"] == 6


BENCH = """
from perfsuite import ModelSpec, parametrize
from perfsuite.core.workloads.trainer import TrainerScenario

TINY = ModelSpec("bert", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)  # the Trainer needs a masked LM
SHAPE = dict(per_device_batch=4, grad_accum=2, train_samples=64, eval_samples=32, seq_len=32, warmup_steps=2)
SCENARIOS = [
    TrainerScenario("trainer", "tiny", TINY, world_size=2, **SHAPE),
    TrainerScenario("trainer", "tiny_fp16", TINY, world_size=2, precision="fp16", **SHAPE),
]

@parametrize(SCENARIOS)
def test_bench(perf, scenario):
    perf.check(scenario)
"""


def test_a_real_trainer_job_runs_the_derived_schedule(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=BENCH)
    out = project.path / "r.json"
    project.runpytest_subprocess("-p", "no:cacheprovider", CPU_PROFILE, f"--perf-json={out}").assert_outcomes(skipped=2)
    results = {r["id"]: r for r in json.loads(out.read_text())["results"]}
    fp16 = results["trainer.tiny_fp16"]
    assert fp16["status"] == "skipped" and "fp16 needs a GPU" in fp16["message"]  # before anything launched
    tiny = results["trainer.tiny"]
    assert tiny["status"] == "ok" and tiny["verdict"] == "no_baseline"
    config, metrics = tiny["config"], tiny["metrics"]
    # 2 epochs x 64 rows / (4 x 2 x 2) = 8 optimizer steps. The callback times
    # every one, so 2 warmup + 6 timed means the Trainer ran exactly the derived schedule.
    assert (config["optimizer_steps"], config["steps"]) == (8, 6)
    assert metrics["steady_state_start"] == 2 and metrics["samples_per_s"]["n"] == 6
    # The Trainer's own figure divides every sample of both epochs by
    # train_runtime, which also covers the warmup steps, the batches fetched
    # between steps and the evaluation after each epoch; samples_per_s only
    # averages the timed steady-state steps. So the Trainer's is lower.
    trainer_rate = metrics["trainer.train_samples_per_s"]
    assert 0 < trainer_rate < metrics["samples_per_s"]["mean"]
    assert trainer_rate * metrics["trainer.train_runtime_s"] == pytest.approx(2 * 64, rel=0.01)
    assert metrics["trainer.eval_samples_per_s"] > 0 and metrics["trainer.eval_runtime_s"] > 0
