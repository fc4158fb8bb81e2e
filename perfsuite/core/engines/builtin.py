"""The built-in engines. Adding one: its options dataclass and EngineSpec here,
its Strategy in ``perfsuite/rank/strategies/<name>.py``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from perfsuite.core.engines.base import (
    ENGINES,
    EngineSpec,
    OptionError,
    ParallelOptions,
    RunShape,
    StepOptions,
    check_optimizer,
    optimizer_problem,
)
from perfsuite.core.engines.deepspeed_config import (
    check_auto,
    check_batch_keys,
    check_config_stage,
    config_optimizer_problem,
)

#: Dtypes an FSDP2 mixed-precision policy may name.
POLICY_DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class DDPOptions(StepOptions):
    """torch DistributedDataParallel's own settings (its defaults when unset)."""

    gradient_as_bucket_view: bool = False
    """Gradients are views into DDP's all-reduce buckets: one copy and its memory fewer."""
    static_graph: bool = False
    """The graph is the same every step: DDP can skip its unused-parameter search and reorder buckets."""
    bucket_cap_mb: float | None = None
    """Size of one all-reduce bucket in MiB; None keeps DDP's 25."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bucket_cap_mb is not None and not self.bucket_cap_mb > 0:
            raise OptionError(f"option 'bucket_cap_mb' must be > 0, got {self.bucket_cap_mb}")

    def check_run(self, run: RunShape) -> None:
        if self.static_graph and run.grad_accum > 1:
            # Reproduced with torch 2.13 on gloo: the first no_sync backward trips the assert.
            raise OptionError(
                f"sets static_graph with {run.grad_accum} micro-batches per step: DDP's static graph breaks under "
                "no_sync gradient accumulation (an expect_autograd_hooks_ assert, then gradients that are never "
                "all-reduced: pytorch/pytorch#143580, fix pending in #187732); use one micro-batch per step"
            )


@dataclass(frozen=True)
class WrappedOptimizerOptions(StepOptions):
    """An engine that shards an optimizer class it is given (ZeroRedundancyOptimizer, fairscale OSS)."""

    takes_factory: ClassVar[bool] = False


@dataclass(frozen=True)
class FSDP2Options(StepOptions):
    """torch ``fully_shard`` settings."""

    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward (gather again in the backward);
    False keeps them to the backward: less communication, more memory."""
    param_dtype: str | None = None
    """The mixed-precision policy's compute dtype (fp32, bf16, fp16); None: the scenario's precision."""
    reduce_dtype: str | None = None
    """The dtype gradients are reduce-scattered in; None: fp32 below fp32 precision."""
    cpu_offload: bool = False
    """Keep the sharded parameters, gradients and optimizer step in host memory (CPUOffloadPolicy)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in POLICY_DTYPES:
                raise OptionError(f"option {name!r} must be one of {', '.join(POLICY_DTYPES)} or None, got {value!r}")

    def unavailable(self, device: str) -> str | None:
        if self.cpu_offload and device == "cpu":
            return "fsdp2's cpu_offload moves GPU shards to host memory: on the cpu profile there is nothing to offload"
        return None


@dataclass(frozen=True)
class TPPPOptions(ParallelOptions):
    """The layout, plus the step options of an engine that builds its own step."""

    optimizer: str = "adamw"
    """As :attr:`StepOptions.optimizer`."""
    activation_checkpointing: bool = False
    """As :attr:`StepOptions.activation_checkpointing`."""

    def __post_init__(self) -> None:
        check_optimizer(self.optimizer)

    def probe(self, rank_path: str) -> str | None:
        return optimizer_problem(self.optimizer, rank_path)


@dataclass(frozen=True)
class ShardedDDPOptions(WrappedOptimizerOptions):
    reduce_buffer_size: int = 0
    """ShardedDDP's bucket, in elements. fairscale's own default (2**23) packs
    small gradients into per-rank buckets that every rank keeps whole, so below
    ~8M parameters nothing would be sharded; 0 reduces parameter by parameter
    and frees the foreign gradients."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reduce_buffer_size < 0:
            raise OptionError(f"option 'reduce_buffer_size' must be >= 0, got {self.reduce_buffer_size}")


@dataclass(frozen=True)
class ZeroOptions(StepOptions):
    stage: int | None = None
    """ZeRO stage 0-3: 1 shards optimizer states, 2 also gradients, 3 also parameters.
    Required unless ``config`` gives ``zero_optimization.stage`` (then equal to it if given)."""
    offload_optimizer: bool = False
    """Keep optimizer states in CPU memory (stages 1-3)."""
    param_persistence_threshold: int | None = None
    """ZeRO-3 keeps parameters of at most this many elements whole on every
    rank; None leaves DeepSpeed's default (1e5), which on a CPU-sized model
    replicates nearly everything, so scaled-down scenarios lower it."""
    config: Mapping[str, Any] | None = None
    """The team's own DeepSpeed config, as a dict or the path of its JSON file (the scenario keeps
    the content). It runs as given, but perfsuite owns the batch keys and the precision: the same
    values are accepted, different ones refused. An ``optimizer`` in it wins over option ``optimizer``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        stage = check_config_stage(self.config, self.stage)
        if self.config is not None:
            object.__setattr__(self, "config", MappingProxyType(dict(self.config)))
            object.__setattr__(self, "stage", stage)
            if self.offload_optimizer or self.param_persistence_threshold is not None:
                raise OptionError(
                    "options 'offload_optimizer' and 'param_persistence_threshold' are ZeRO settings: with a "
                    "'config', set them there (zero_optimization.offload_optimizer, "
                    "zero_optimization.stage3_param_persistence_threshold)"
                )
        if self.stage is None:
            raise OptionError("lacks required option 'stage' (or zero_optimization.stage in its 'config')")
        if self.stage not in (0, 1, 2, 3):
            raise OptionError(f"option 'stage' must be one of 0, 1, 2, 3; got {self.stage!r}")
        if self.offload_optimizer and self.stage == 0:
            raise OptionError("option 'offload_optimizer' needs ZeRO stage 1, 2 or 3, got stage 0")
        threshold = self.param_persistence_threshold
        if threshold is not None and (threshold < 0 or self.stage != 3):
            raise OptionError(
                f"option 'param_persistence_threshold' must be >= 0 and applies to stage 3 only; "
                f"got {threshold} with stage {self.stage}"
            )

    @classmethod
    def normalise(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        config = options.get("config")
        if not isinstance(config, str):
            return dict(options)
        try:
            content = json.loads(Path(config).read_text())
        except (OSError, ValueError) as exc:
            raise OptionError(f"option 'config' names {config!r}, which is no readable DeepSpeed JSON: {exc}") from None
        if not isinstance(content, dict):
            raise OptionError(f"option 'config' names {config!r}, whose JSON is not an object")
        return {**options, "config": content}

    @classmethod
    def rescaled(cls, options: Mapping[str, Any], run: RunShape) -> dict[str, Any]:
        config = options.get("config")
        if isinstance(config, Mapping) and isinstance(config.get("train_batch_size"), int):
            return {**options, "config": {**config, "train_batch_size": run.global_batch}}
        return dict(options)

    def check_run(self, run: RunShape) -> None:
        if self.config is not None:
            check_batch_keys(self.config, run)
            check_auto(self.config)

    def unavailable(self, device: str) -> str | None:
        return config_optimizer_problem(self.config, device) if self.config is not None else None


@dataclass(frozen=True)
class MegatronOptions(ParallelOptions):
    refused: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            "optimizer": "megatron-core builds its own optimizer (get_megatron_optimizer: its Adam, "
            "distributed with option distributed_optimizer)",
            "activation_checkpointing": "megatron-core recomputes activations through its own TransformerConfig "
            "(recompute_granularity), which perfsuite does not set",
        }
    )

    distributed_optimizer: bool = False
    """megatron's DistributedOptimizer (ZeRO-1 over dp)."""
    overlap_grad_reduce: bool = False
    """Overlap the dp gradient reduction with the backward. Off by default so
    the comparison with tp_pp (which reduces after the whole backward) is like for like."""


SPLITTABLE = ("megatron_gpt",)  # embed / blocks / head stages, nn.Linear projections
COMPILED = ("eager", "compile")
NO_COMPILE_FAIRSCALE = (
    "fairscale's wrappers predate torch.compile and document no way to compose with it; perfsuite compiles "
    "under ddp, torch_zero, fsdp2, deepspeed_zero and tp_pp"
)
#: Why an engine other than DDP takes no ORTModule graph.
ORT_WRAPS_DDP_ONLY = "ORTModule's recipe wraps DDP alone (DDP(ORTModule(model)))"
#: What fairscale's three engines share: their extra, their import and why none compiles.
FAIRSCALE: Mapping[str, Any] = MappingProxyType(
    {
        "extra": "fairscale",
        "requires": ("fairscale",),
        "packages": ("fairscale",),
        "why_not_graph": NO_COMPILE_FAIRSCALE,
    }
)

for spec in (
    EngineSpec(
        "ddp",
        "perfsuite.rank.strategies.ddp:DDPStrategy",
        options=DDPOptions,
        graphs=("eager", "compile", "ort"),
        description="torch DistributedDataParallel",
    ),
    EngineSpec(
        "torch_zero",
        "perfsuite.rank.strategies.torch_zero:TorchZeroStrategy",
        options=WrappedOptimizerOptions,
        graphs=COMPILED,
        why_not_graph=ORT_WRAPS_DDP_ONLY,
        description="torch ZeroRedundancyOptimizer + DDP (optimizer-state sharding)",
    ),
    EngineSpec(
        "fsdp2",
        "perfsuite.rank.strategies.fsdp2:FSDP2Strategy",
        options=FSDP2Options,
        graphs=COMPILED,
        why_not_graph=ORT_WRAPS_DDP_ONLY,
        description="torch fully_shard per block",
    ),
    EngineSpec(
        "fairscale_oss",
        "perfsuite.rank.strategies.fairscale_oss:FairscaleOSSStrategy",
        options=WrappedOptimizerOptions,
        description="fairscale OSS + DDP",
        **FAIRSCALE,
    ),
    EngineSpec(
        "fairscale_sdp",
        "perfsuite.rank.strategies.fairscale_sdp:FairscaleSDPStrategy",
        options=ShardedDDPOptions,
        description="fairscale OSS + ShardedDataParallel",
        **FAIRSCALE,
    ),
    EngineSpec(
        "fairscale_fsdp",
        "perfsuite.rank.strategies.fairscale_fsdp:FairscaleFSDPStrategy",
        devices=("cuda",),
        why_not={
            "cpu": (
                "fairscale FSDP needs CUDA: FullyShardedDataParallel runs its all-gather, fp32->fp16 cast "
                "and post-backward reduce-scatter on torch.cuda streams (torch.cuda.stream(...) in "
                "_rebuild_full_params/_post_backward_hook, torch.cuda.current_stream() in _free_full_params)"
            )
        },
        options=StepOptions,
        description="fairscale FullyShardedDataParallel per block",
        **FAIRSCALE,
    ),
    EngineSpec(
        "deepspeed_zero",
        "perfsuite.rank.strategies.deepspeed_zero:DeepSpeedZeroStrategy",
        options=ZeroOptions,
        graphs=COMPILED,
        why_not_graph=ORT_WRAPS_DDP_ONLY,
        extra="deepspeed",
        requires=("deepspeed",),
        packages=("deepspeed",),
        smoke_options={"stage": 2},
        description="DeepSpeed ZeRO stages 0-3 through deepspeed.initialize",
    ),
    EngineSpec(
        "tp_pp",
        "perfsuite.rank.strategies.tp_pp:TPPPStrategy",
        options=TPPPOptions,
        axes=("dp", "tp", "pp"),
        model_families=SPLITTABLE,
        graphs=COMPILED,
        why_not_graph=ORT_WRAPS_DDP_ONLY,
        description="DTensor tensor parallel x torch.distributed.pipelining x dp gradient averaging",
    ),
    EngineSpec(
        "megatron_core",
        "perfsuite.rank.strategies.megatron_core:MegatronCoreStrategy",
        options=MegatronOptions,
        axes=("dp", "tp", "pp"),
        schedules=("1f1b", "interleaved_1f1b"),
        model_families=SPLITTABLE,
        why_not_graph="megatron-core builds its own model with its own fused kernels; perfsuite does not compile it",
        devices=("cuda",),
        why_not={"cpu": "megatron-core's tensor/pipeline-parallel layers and fused kernels need CUDA"},
        extra="megatron",
        requires=("megatron.core",),
        packages=("megatron-core",),
        description="megatron-core GPTModel, schedules, DDP and optimizer",
    ),
):
    ENGINES.register(spec)
