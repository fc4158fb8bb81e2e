"""Workload kind ``trainer``: a real ``transformers.Trainer`` job.

Ranks train a BERT-family masked-LM (random weights, built from its config)
with ``Trainer.train()`` on synthetic tokens: ``train_samples`` and
``eval_samples`` rows of random ids, 15% of positions labelled with their
token and the rest -100, seeded. The Trainer runs ``epochs`` epochs with
gradient accumulation and evaluates after each epoch, exactly as a user's job
would. A callback times every optimizer step with synchronised clocks.

The schedule is the Trainer's own, so the measured steps are derived rather
than declared: the Trainer runs ``ceil(batches / grad_accum)`` optimizer steps
per epoch (``Trainer.set_initial_training_values``; a last, shorter
accumulation window counts as a step), and each rank's dataloader holds
``ceil(train_samples / (per_device_batch x world_size))`` batches, so

    optimizer_steps = epochs x ceil(train_samples / total_batch),
    total_batch = per_device_batch x grad_accum x world_size.

The first ``warmup_steps`` of them are warmup; the rest (``steps``) are
measured. ``train_samples`` must be a multiple of ``total_batch`` so that every
optimizer step carries the full batch that ``samples_per_s`` counts.

Sequence length: the seed table (C2) does not state one; this kind defaults to
128, BERT's phase-1 pre-training length.

Besides perfsuite's steady-state rates, every rank reports the Trainer's own
figures (``train_samples_per_second``, ``train_runtime`` and the last
evaluation's speed) as the ``trainer.*`` metrics. Rank side:
:class:`perfsuite.rank.worker.trainer.TrainerRunner`. Torch-free.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from perfsuite.core.models import ModelSpec
from perfsuite.core.protocol import WorkloadSpec
from perfsuite.core.validation import ScenarioError, check_choice, check_int, fail
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.core.workloads.train import DYNAMO

Precision = Literal["fp32", "fp16", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
FAMILIES = ("bert",)  # masked-LM families whose synthetic labels the rank side builds
ACCELERATE_MIN = "1.1.0"  # transformers' ACCELERATE_MIN_VERSION for Trainer


@dataclass(frozen=True)
class TrainerSpec(WorkloadSpec):
    """What a rank needs to run the Trainer job, resolved for the profile."""

    runner: ClassVar[str] = "perfsuite.rank.worker.trainer:TrainerRunner"

    model: ModelSpec
    """The masked-LM to build (random weights)."""
    precision: Precision
    """fp32, or the Trainer's fp16 (GradScaler) / bf16 mixed precision."""
    per_device_batch: int
    """``per_device_train_batch_size`` (and eval batch size)."""
    grad_accum: int
    """``gradient_accumulation_steps``."""
    train_samples: int
    """Rows of the synthetic training set."""
    eval_samples: int
    """Rows of the synthetic evaluation set."""
    epochs: int
    """``num_train_epochs``."""
    seq_len: int
    """Tokens per row."""
    optimizer_steps: int
    """Optimizer steps the Trainer will run (warmup + measured); the rank checks it."""


@dataclass(frozen=True)
class TrainerScenario(BaseScenario):
    """A ``transformers.Trainer`` masked-LM pre-training job (seed table C2)."""

    kind: ClassVar[str] = "trainer"
    metrics: ClassVar[tuple[str, ...]] = (
        "samples_per_s",
        "tokens_per_s",
        "peak_mem_mib",
        "trainer.train_samples_per_s",
        "trainer.eval_samples_per_s",
        "trainer.train_runtime_s",
        "trainer.eval_runtime_s",
    )
    primary: ClassVar[str] = "samples_per_s"

    model: ModelSpec
    """The BERT-family masked-LM to train."""
    precision: Precision = "fp32"
    """fp32, or mixed precision: fp16 (Trainer's GradScaler; CUDA only) or bf16."""
    per_device_batch: int = 8
    """Rows per device per micro-batch (``per_device_train_batch_size``)."""
    grad_accum: int = 4
    """Micro-batches per optimizer step (``gradient_accumulation_steps``)."""
    train_samples: int = 2048
    """Rows of the synthetic training set (a multiple of ``total_batch``)."""
    eval_samples: int = 1024
    """Rows of the synthetic evaluation set, evaluated after every epoch."""
    epochs: int = 2
    """Training epochs (``num_train_epochs``)."""
    seq_len: int = 128
    """Tokens per row (128: BERT's phase-1 pre-training length; C2 does not state one)."""
    steps: int = field(default=0, init=False)
    """Measured optimizer steps: derived, ``optimizer_steps - warmup_steps``
    (the Trainer's schedule decides how many steps run)."""

    def __post_init__(self) -> None:
        variants = self.variants if isinstance(self.variants, Mapping) else {}  # the base names a non-dict
        for key, overrides in variants.items():
            if isinstance(overrides, Mapping) and "steps" in overrides:
                raise fail(self.id, f"variants[{key!r}]", "overrides 'steps', which trainer scenarios derive")
        object.__setattr__(self, "steps", self._derived_steps())
        super().__post_init__()

    def _derived_steps(self) -> int:
        try:
            return self.optimizer_steps - self.warmup_steps
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            return 0  # an invalid field (a string, 0, nan): validate() names it

    # -- validation ---------------------------------------------------------------------
    def validate(self) -> None:
        # The kind's own fields first: the base's checks read ``steps``, which
        # is derived from them, so a bad one must be named before that.
        self._validate_fields()
        self._validate_schedule()
        super().validate()

    def _validate_fields(self) -> None:
        owner = self.id
        if not isinstance(self.model, ModelSpec):
            raise fail(owner, "model", f"must be a ModelSpec, got {type(self.model).__name__}")
        if self.model.family not in FAMILIES:
            raise fail(owner, "model", f"family must be one of {FAMILIES} (a masked-LM), got {self.model.family!r}")
        check_choice(owner, "precision", self.precision, PRECISIONS)
        for name in ("per_device_batch", "grad_accum", "train_samples", "eval_samples", "epochs", "seq_len"):
            check_int(owner, name, getattr(self, name), 1)
        check_int(owner, "world_size", self.world_size, 1)
        check_int(owner, "warmup_steps", self.warmup_steps, 1)  # step 1 builds optimizer state
        if self.seq_len > self.model.max_positions:
            raise fail(owner, "seq_len", f"exceeds model.max_positions={self.model.max_positions}")

    def probe_fields(self, rank_path: str, where: str = "") -> tuple[ScenarioError, ...]:
        error = self.model.probe(rank_path)
        return (error,) if error is not None else ()

    def _validate_schedule(self) -> None:
        owner = self.id
        if self.train_samples % self.total_batch:
            raise fail(
                owner,
                "train_samples",
                f"must be a multiple of total_batch = per_device_batch x grad_accum x world_size = "
                f"{self.per_device_batch} x {self.grad_accum} x {self.world_size} = {self.total_batch}, "
                f"got {self.train_samples}: the Trainer's last accumulation window would be short, "
                "and samples_per_s counts a full batch per step",
            )
        if self.steps < 2:
            raise fail(
                owner,
                "warmup_steps",
                f"leaves {self.steps} measured steps of the {self.optimizer_steps} optimizer steps the Trainer "
                f"runs (epochs x train_samples / total_batch = {self.epochs} x {self.train_samples} / "
                f"{self.total_batch}); at least 2 are needed to report a spread",
            )
        if self.max_warmup_steps is not None and self.max_warmup_steps != self.warmup_steps:
            raise fail(
                owner,
                "max_warmup_steps",
                f"must be None or warmup_steps={self.warmup_steps}: the Trainer runs a fixed schedule, "
                f"so warmup is exactly warmup_steps, got {self.max_warmup_steps}",
            )

    # -- derived ------------------------------------------------------------------------
    @property
    def total_batch(self) -> int:
        """Rows per optimizer step over all ranks (the seed's "total bs")."""
        return self.per_device_batch * self.grad_accum * self.world_size

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch, as the Trainer counts them (a short last window is a step)."""
        return math.ceil(self.train_samples / self.total_batch)

    @property
    def optimizer_steps(self) -> int:
        """Every optimizer step of the job, warmup included (the seed's "steps" column)."""
        return self.epochs * self.steps_per_epoch

    @property
    def warmup_limit(self) -> int:
        return self.warmup_steps  # a fixed schedule: warmup never extends

    # -- the workload-kind interface -------------------------------------------------------
    def step_work(self) -> Mapping[str, float]:
        return {"samples_per_s": self.total_batch, "tokens_per_s": self.total_batch * self.seq_len}

    def precondition(self, device: str) -> str | None:
        if importlib.util.find_spec("accelerate") is None:
            return f"accelerate is not installed; transformers.Trainer needs it: pip install 'accelerate>={ACCELERATE_MIN}'"
        if device == "cpu" and self.precision == "fp16":
            return (
                "fp16 needs a GPU: on cpu accelerate enables neither fp16 autocast nor a GradScaler, so the "
                "Trainer would silently train in fp32 (use precision='bf16' in the cpu variant)"
            )
        return None

    def rank_imports(self) -> tuple[str, ...]:
        """The runner's modules (transformers' Trainer, which imports ``torch._dynamo``) and the model builder's."""
        return (*super().rank_imports(), DYNAMO, *self.model.imports)

    def rank_spec(self) -> TrainerSpec:
        return TrainerSpec(
            **self.spec_fields(),
            model=self.model,
            precision=self.precision,
            per_device_batch=self.per_device_batch,
            grad_accum=self.grad_accum,
            train_samples=self.train_samples,
            eval_samples=self.eval_samples,
            epochs=self.epochs,
            seq_len=self.seq_len,
            optimizer_steps=self.optimizer_steps,
        )

    def to_config(self) -> dict[str, Any]:
        return {
            **super().to_config(),
            "model": dataclasses.asdict(self.model),
            "precision": self.precision,
            "per_device_batch": self.per_device_batch,
            "grad_accum": self.grad_accum,
            "train_samples": self.train_samples,
            "eval_samples": self.eval_samples,
            "epochs": self.epochs,
            "seq_len": self.seq_len,
            "total_batch": self.total_batch,
            # Sequences per optimizer step under the name MFU and the ceilings read.
            "global_batch": self.total_batch,
            "optimizer_steps": self.optimizer_steps,
        }


__all__ = ["PRECISIONS", "Precision", "TrainerScenario", "TrainerSpec"]
