"""The built-in engines. Adding one: its options dataclass and EngineSpec here,
its Strategy in ``perfsuite/strategies/<name>.py``."""

from __future__ import annotations

from dataclasses import dataclass

from perfsuite.engines.base import ENGINES, EngineOptions, EngineSpec, OptionError, ParallelOptions


@dataclass(frozen=True)
class ShardedDDPOptions(EngineOptions):
    reduce_buffer_size: int = 0
    """ShardedDDP's bucket, in elements. fairscale's own default (2**23) packs
    small gradients into per-rank buckets that every rank keeps whole, so below
    ~8M parameters nothing would be sharded; 0 reduces parameter by parameter
    and frees the foreign gradients."""

    def __post_init__(self) -> None:
        if self.reduce_buffer_size < 0:
            raise OptionError(f"option 'reduce_buffer_size' must be >= 0, got {self.reduce_buffer_size}")


@dataclass(frozen=True)
class ZeroOptions(EngineOptions):
    stage: int
    """ZeRO stage 0-3: 1 shards optimizer states, 2 also gradients, 3 also parameters."""
    offload_optimizer: bool = False
    """Keep optimizer states in CPU memory (stages 1-3)."""
    param_persistence_threshold: int | None = None
    """ZeRO-3 keeps parameters of at most this many elements whole on every
    rank; None leaves DeepSpeed's default (1e5), which on a CPU-sized model
    replicates nearly everything, so scaled-down scenarios lower it."""

    def __post_init__(self) -> None:
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


@dataclass(frozen=True)
class MegatronOptions(ParallelOptions):
    distributed_optimizer: bool = False
    """megatron's DistributedOptimizer (ZeRO-1 over dp)."""
    overlap_grad_reduce: bool = False
    """Overlap the dp gradient reduction with the backward. Off by default so
    the comparison with tp_pp (which reduces after the whole backward) is like for like."""


SPLITTABLE = ("megatron_gpt",)  # embed / blocks / head stages, nn.Linear projections

for spec in (
    EngineSpec("ddp", "perfsuite.strategies.ddp:DDPStrategy", description="torch DistributedDataParallel"),
    EngineSpec(
        "torch_zero",
        "perfsuite.strategies.torch_zero:TorchZeroStrategy",
        description="torch ZeroRedundancyOptimizer + DDP (optimizer-state sharding)",
    ),
    EngineSpec("fsdp2", "perfsuite.strategies.fsdp2:FSDP2Strategy", description="torch fully_shard per block"),
    EngineSpec(
        "fairscale_oss",
        "perfsuite.strategies.fairscale_oss:FairscaleOSSStrategy",
        description="fairscale OSS + DDP",
        extra="fairscale",
        requires=("fairscale",),
        packages=("fairscale",),
    ),
    EngineSpec(
        "fairscale_sdp",
        "perfsuite.strategies.fairscale_sdp:FairscaleSDPStrategy",
        options=ShardedDDPOptions,
        description="fairscale OSS + ShardedDataParallel",
        extra="fairscale",
        requires=("fairscale",),
        packages=("fairscale",),
    ),
    EngineSpec(
        "fairscale_fsdp",
        "perfsuite.strategies.fairscale_fsdp:FairscaleFSDPStrategy",
        devices=("cuda",),
        why_not={
            "cpu": (
                "fairscale FSDP needs CUDA: FullyShardedDataParallel runs its all-gather, fp32->fp16 cast "
                "and post-backward reduce-scatter on torch.cuda streams (torch.cuda.stream(...) in "
                "_rebuild_full_params/_post_backward_hook, torch.cuda.current_stream() in _free_full_params)"
            )
        },
        description="fairscale FullyShardedDataParallel per block",
        extra="fairscale",
        requires=("fairscale",),
        packages=("fairscale",),
    ),
    EngineSpec(
        "deepspeed_zero",
        "perfsuite.strategies.deepspeed_zero:DeepSpeedZeroStrategy",
        options=ZeroOptions,
        extra="deepspeed",
        requires=("deepspeed",),
        packages=("deepspeed",),
        smoke_options={"stage": 2},
        description="DeepSpeed ZeRO stages 0-3 through deepspeed.initialize",
    ),
    EngineSpec(
        "tp_pp",
        "perfsuite.strategies.tp_pp:TPPPStrategy",
        options=ParallelOptions,
        axes=("dp", "tp", "pp"),
        model_families=SPLITTABLE,
        description="DTensor tensor parallel x torch.distributed.pipelining x dp gradient averaging",
    ),
    EngineSpec(
        "megatron_core",
        "perfsuite.strategies.megatron_core:MegatronCoreStrategy",
        options=MegatronOptions,
        axes=("dp", "tp", "pp"),
        schedules=("1f1b", "interleaved_1f1b"),
        model_families=SPLITTABLE,
        devices=("cuda",),
        why_not={"cpu": "megatron-core's tensor/pipeline-parallel layers and fused kernels need CUDA"},
        extra="megatron",
        requires=("megatron.core",),
        packages=("megatron-core",),
        description="megatron-core GPTModel, schedules, DDP and optimizer",
    ),
):
    ENGINES.register(spec)
