"""Rank side of the ``trainer`` workload kind: run ``transformers.Trainer.train()``
on synthetic masked-LM data and time every optimizer step from a callback.

The worker entry has already created the process group (gloo on cpu, nccl on
CUDA). ``TrainingArguments`` builds accelerate's ``PartialState``, which only
calls ``init_process_group`` when ``torch.distributed`` is not initialised
(``accelerate.state.PartialState.__init__``), so the Trainer's DDP runs on
perfsuite's group. ``ddp_backend`` names the same backend: accelerate refuses
a backend other than the one it would pick, and on cpu it would pick MPI
where torch has it.

What a step is: the Trainer prefetches a window's micro-batches
(``get_batch_samples``) and only then calls ``on_step_begin``; ``on_step_end``
follows the optimizer and scheduler steps and ``zero_grad``. So a timed step
is forward, backward, gradient all-reduce and update of ``grad_accum``
micro-batches; data loading, logging and the per-epoch evaluation fall
between steps, outside the clock (but inside the Trainer's ``train_runtime``).
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

# Imported at module load, before the worker applies the cpu memory budget, so
# the budget covers the job rather than transformers' and accelerate's imports.
from transformers import Trainer, TrainerCallback, TrainingArguments

from perfsuite.core.protocol import EngineUnavailable, RankJob, RankReport
from perfsuite.core.workloads.trainer import TrainerSpec
from perfsuite.rank.models.build import build_model, synthetic_batch
from perfsuite.rank.worker.base import Runner, spec_as
from perfsuite.rank.worker.health import HealthTracker
from perfsuite.rank.worker.loop import LoopResult, burn
from perfsuite.rank.worker.memory import MemoryTracker
from perfsuite.rank.worker.runtime import Reporter, WorkerContext

EVAL_SEED_OFFSET = 1  # the evaluation set is drawn from its own seed, disjoint from training rows


class SyntheticMLM(Dataset[dict[str, torch.Tensor]]):
    """``rows`` random-token sequences with masked-LM labels (15% of positions
    carry their token, the rest -100), identical on every rank for one seed;
    the Trainer's sampler gives each rank its share."""

    def __init__(self, spec: TrainerSpec, rows: int, seed: int) -> None:
        batch = synthetic_batch(spec.model, spec.seq_len, torch.device("cpu"), rows, seed)
        self.input_ids, self.labels = batch["input_ids"], batch["labels"]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[index], "labels": self.labels[index]}


class StepClock(TrainerCallback):
    """Times every optimizer step with synchronised clocks; the first
    ``warmup_steps`` are warmup, the rest are measured with memory and health
    sampled after each. Keeps the last evaluation's metrics."""

    def __init__(self, spec: TrainerSpec, ctx: WorkerContext, reporter: Reporter, slowdown_pct: float) -> None:
        self.spec, self.ctx, self.reporter = spec, ctx, reporter
        self.slowdown = slowdown_pct / 100
        self.burn_s = 0.0  # planted work per step (gate self-test), set once warmup is timed
        self.memory = MemoryTracker.for_device(ctx.device)
        self.health = HealthTracker.for_device(ctx.device)
        self.accelerator: Any = None  # the Trainer's, to read whether the scaler skipped an update
        self.warmup: list[float] = []
        self.times: list[float] = []
        self.skipped: list[int] = []
        self.last_eval: dict[str, float] = {}
        self._start = 0.0

    @property
    def measuring(self) -> bool:
        return len(self.warmup) >= self.spec.warmup_steps

    def on_step_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if self.measuring and not self.times:
            self.reporter.mark("warmup")
            # Peaks from the first measured step on (CUDA allocator peak, cpu VmHWM reset).
            self.memory.__enter__()
            self.health.__enter__()
        self.ctx.synchronize()
        self._start = time.perf_counter()

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self.ctx.synchronize()
        if self.burn_s:
            burn(self.burn_s, self.ctx)
        elapsed = time.perf_counter() - self._start
        if not self.measuring:
            self.warmup.append(elapsed)
            if self.measuring and self.slowdown:
                self.burn_s = self.slowdown * statistics.median(slowest_ranks(self.warmup, self.ctx))
        else:
            self.record(elapsed)
        total = len(self.warmup) + len(self.times)
        self.reporter.phase(f"{'measure' if self.measuring else 'warmup'} step {total}")

    def record(self, elapsed: float) -> None:
        """One measured step: its time, memory and health, and whether fp16 skipped its update."""
        if self.accelerator is not None and self.accelerator.optimizer_step_was_skipped:
            self.skipped.append(len(self.times))
        self.times.append(elapsed)
        self.memory.sample()
        self.health.sample()
        if len(self.times) == self.spec.steps:
            self.reporter.mark("measure")
            self.memory.__exit__(None, None, None)
            self.health.__exit__(None, None, None)

    def on_evaluate(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self.last_eval = dict(kwargs.get("metrics") or {})
        self.reporter.phase(f"evaluated at step {state.global_step}")


def slowest_ranks(times: list[float], ctx: WorkerContext) -> list[float]:
    """Each step's time on the slowest rank: one all-reduce for the whole list,
    made between steps so it does not touch the timed windows."""
    value = torch.tensor(times or [0.0], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return [float(t) for t in value.tolist()][: len(times)]


def training_arguments(spec: TrainerSpec, ctx: WorkerContext, output_dir: str, seed: int) -> TrainingArguments:
    """The job as a user would write it: evaluation every epoch, no checkpoints,
    no reporting integrations, no periodic logging, data loaded in the rank."""
    return TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=spec.per_device_batch,
        per_device_eval_batch_size=spec.per_device_batch,
        gradient_accumulation_steps=spec.grad_accum,
        num_train_epochs=spec.epochs,
        eval_strategy="epoch",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=seed,
        fp16=spec.precision == "fp16",
        bf16=spec.precision == "bf16",
        use_cpu=ctx.device.type == "cpu",
        ddp_backend=ctx.backend,
    )


class TrainerRunner(Runner):
    def __init__(self, job: RankJob) -> None:
        super().__init__(job)
        self.spec = spec_as(job, TrainerSpec)

    def check(self, ctx: WorkerContext) -> None:
        if ctx.device.type == "cpu" and self.spec.precision == "fp16":
            # accelerate.Accelerator.__init__ turns on fp16 autocast and its
            # GradScaler only for a device other than cpu: fp16 here would train fp32.
            raise EngineUnavailable(
                "fp16 needs a GPU: on cpu accelerate enables neither fp16 autocast nor a GradScaler, so the "
                "Trainer would silently train in fp32 (use precision='bf16' in the cpu variant)"
            )
        if ctx.device.type == "cuda" and self.spec.precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise EngineUnavailable(f"bf16 needs an Ampere or newer GPU; {torch.cuda.get_device_name(ctx.device)}")

    def run(self, ctx: WorkerContext, reporter: Reporter) -> RankReport:
        spec, seed = self.spec, self.job.seed
        reporter.phase("build")
        if ctx.device.type == "cpu":
            one_thread_per_rank()
        clock = StepClock(spec, ctx, reporter, self.job.slowdown_pct)
        with tempfile.TemporaryDirectory(prefix="perfsuite-trainer-") as output_dir:
            trainer = Trainer(
                model=build_model(spec.model),
                args=training_arguments(spec, ctx, output_dir, seed),
                train_dataset=SyntheticMLM(spec, spec.train_samples, seed),
                eval_dataset=SyntheticMLM(spec, spec.eval_samples, seed + EVAL_SEED_OFFSET),
                callbacks=[clock],
            )
            clock.accelerator = trainer.accelerator
            reporter.mark("build")
            reporter.phase("train")
            output = trainer.train()
        # The last collective before the checks: a check that fails on one rank
        # only (its own loss) must not leave the others waiting in an all-reduce.
        warmup = slowest_ranks(clock.warmup, ctx)
        check_schedule(spec, trainer.state.global_step, clock)
        check_finite(output.training_loss, clock.last_eval)
        return LoopResult(
            clock.times,
            warmup,
            len(clock.warmup),
            clock.memory.result.peak_mem_mib,
            clock.memory.result.detail,
            clock.health.result,
        ).report(
            ctx.rank,
            skipped_steps=tuple(clock.skipped),
            metrics=rank_metrics(clock.memory.result.peak_mem_mib, output.metrics, clock.last_eval),
        )


def one_thread_per_rank() -> None:
    """On cpu a core stands in for a GPU: every rank computes on one thread.

    torchrun already gives each rank of a multi-rank run OMP_NUM_THREADS=1;
    a 1-rank run gets none, and accelerate then sets torch's threads to the
    cores / local ranks. Measured on a shared 2-core VM, a 1-rank tiny-BERT
    job ran 8x slower on 2 threads than on 1 (threads spin against the other
    load), and the gpu1 rows would not be comparable with the gpu2 ones. A
    thread count the user exported is kept.
    """
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"  # read by accelerate's PartialState
        torch.set_num_threads(1)


def check_schedule(spec: TrainerSpec, global_step: int, clock: StepClock) -> None:
    """The Trainer ran the schedule the scenario derived, and every measured
    step was timed (so every rank reports the same number)."""
    if global_step != spec.optimizer_steps or len(clock.times) != spec.steps:
        raise RuntimeError(
            f"the Trainer ran {global_step} optimizer steps ({len(clock.warmup)} warmup + {len(clock.times)} "
            f"timed); the scenario derived {spec.optimizer_steps} ({spec.warmup_steps} + {spec.steps})"
        )
    if len(clock.skipped) == spec.steps:
        raise FloatingPointError(
            f"all {spec.steps} measured optimizer steps were skipped on fp16 overflow: "
            "the loss scale never settled, nothing was trained"
        )
    if not clock.last_eval:
        raise RuntimeError("the Trainer ran no evaluation (eval_strategy='epoch' should run one per epoch)")


def check_finite(training_loss: float, last_eval: dict[str, float]) -> None:
    """A diverged run trained nothing worth timing."""
    for name, value in (("training loss", training_loss), ("evaluation loss", last_eval.get("eval_loss", 0.0))):
        if not math.isfinite(value):
            raise FloatingPointError(f"non-finite {name} {value}: the run diverged")


def rank_metrics(peak_mem_mib: float, train: dict[str, float], last_eval: dict[str, float]) -> dict[str, float]:
    """This rank's ``rank``-source metrics: peak memory and the Trainer's own figures."""
    return {
        "peak_mem_mib": peak_mem_mib,
        "trainer.train_samples_per_s": train["train_samples_per_second"],
        "trainer.train_runtime_s": train["train_runtime"],
        "trainer.eval_samples_per_s": last_eval["eval_samples_per_second"],
        "trainer.eval_runtime_s": last_eval["eval_runtime"],
    }


__all__ = ["StepClock", "SyntheticMLM", "TrainerRunner"]
