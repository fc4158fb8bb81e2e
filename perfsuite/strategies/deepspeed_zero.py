"""DeepSpeed ZeRO stages 0-3 driven through ``deepspeed.initialize``.

torchrun has already started the ranks and the worker has already called
``torch.distributed.init_process_group``; ``deepspeed.init_distributed`` sees an
initialised default group and only wraps it (``TorchBackend`` skips
``init_process_group`` when ``torch.distributed.is_initialized()``), so
DeepSpeed's collectives run on the worker's gloo/nccl group.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from perfsuite.engines import ZeroOptions
from perfsuite.primitives import DTYPES, StateTensors, optimizer_state_tensors
from perfsuite.strategies.base import EngineUnavailable, Strategy, StrategyContext, require

SHM_COMM_OP = "deepspeed_shm_comm"  # deepspeed.ops.op_builder.cpu.comm.ShareMemCommBuilder.NAME
ALL_GATHER_DEPRECATION = r"`torch\.distributed\.all_gather_into_tensor` is deprecated"
NEVER_PRINT = 2**31 - 1  # steps_per_print: DeepSpeed logs progress every N steps
# DeepSpeed only uses the micro-batch size for its throughput log and data
# loader, neither of which runs here; StrategyContext does not carry it.
MICRO_BATCH_PLACEHOLDER = 1


def import_deepspeed(device: torch.device) -> Any:
    """Import deepspeed with its accelerator pinned to the run's device type.

    Left to auto-detection, DeepSpeed picks CUDA whenever a GPU is visible, even
    for a CPU run, and logs a warning when it falls back to CPU.
    """
    os.environ.setdefault("DS_ACCELERATOR", device.type)
    deepspeed = require("deepspeed", "deepspeed")
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator().device_name()
    if accelerator != device.type:
        raise EngineUnavailable(
            f"DeepSpeed's accelerator is {accelerator!r} but this run's device is {device.type!r} "
            f"(DS_ACCELERATOR={os.environ.get('DS_ACCELERATOR')!r})"
        )
    if device.type == "cpu":
        skip_shm_comm_build(deepspeed)
    return deepspeed


def skip_shm_comm_build(deepspeed: Any) -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory collective on CPU.

    TorchBackend builds it whenever the op probes as compatible (a g++/ninja
    build of about a minute on a cold cache, a crash without a compiler), yet
    only ``inference_all_reduce`` uses it; training collectives go through
    torch.distributed. ``deepspeed.ops`` caches the probe result in one dict
    whose edits persist, so this only marks that one op unavailable.
    """
    compatible = deepspeed.ops.__compatible_ops__
    if SHM_COMM_OP in compatible:
        compatible[SHM_COMM_OP] = False


def check_precision(deepspeed: Any, precision: str, device: torch.device) -> None:
    """Skip where DeepSpeed would refuse the half type (engine._do_sanity_check)."""
    accelerator = deepspeed.accelerator.get_accelerator()
    supported = {"fp16": accelerator.is_fp16_supported, "bf16": accelerator.is_bf16_supported}
    if precision not in supported or supported[precision]():
        return
    why = ""
    if device.type == "cpu":
        why = (
            " (its CPU accelerator has fp16 only where torch.ops.mkldnn._is_mkldnn_fp16_supported() "
            "is true, i.e. CPUs with AVX512-FP16/AMX-FP16)"
        )
    raise EngineUnavailable(f"DeepSpeed {deepspeed.__version__} does not support {precision} on {device.type}{why}")


def bucket_elements(model_numel: int) -> int:
    """DeepSpeed's reduce bucket, capped at the model's size.

    ZeRO allocates the whole bucket (``torch.empty(reduce_bucket_size)``) on
    every backward; its 5e8-element default is 2 GB in fp32, which a CPU rank
    budget rejects. All gradients fit either way, so for models below 5e8
    parameters the reductions are the same as with the default.
    """
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    return min(int(DeepSpeedZeroConfig().reduce_bucket_size), model_numel)


def zero_config(options: ZeroOptions, model_numel: int) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": options.stage, "reduce_bucket_size": bucket_elements(model_numel)}
    if options.stage == 3:
        # Same reasoning for ZeRO-3's prefetch buffer (default 5e7 elements).
        zero["stage3_prefetch_bucket_size"] = min(int(5e7), model_numel)
    if options.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if options.param_persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = options.param_persistence_threshold
    return zero


def ds_config(ctx: StrategyContext, options: ZeroOptions, model_numel: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH_PLACEHOLDER,
        "gradient_accumulation_steps": ctx.grad_accum,
        # The caller owns the boundary, as perfsuite's loop does: backward()
        # accumulates, step() reduces and updates. In the managed default,
        # ZeRO-1 reduces inside the last backward and frees its full gradients
        # before the loop counts state, so it would look like ZeRO-2.
        "managed_gradient_accumulation": False,
        "zero_optimization": zero_config(options, model_numel),
        # torch_adam: plain torch.optim.AdamW (a ZeRO-supported optimizer), so
        # no FusedAdam/DeepSpeedCPUAdam op has to be compiled, offload included.
        "optimizer": {"type": "AdamW", "params": {"lr": ctx.lr, "torch_adam": True}},
        "wall_clock_breakdown": False,
        "steps_per_print": NEVER_PRINT,
    }
    if ctx.precision in ("fp16", "bf16"):
        config[ctx.precision] = {"enabled": True}
    return config


class DeepSpeedZeroStrategy(Strategy):
    engine: Any

    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        check_precision(import_deepspeed(ctx.device), ctx.precision, ctx.device)

    @property
    def options(self) -> ZeroOptions:
        assert isinstance(self.ctx.options, ZeroOptions)
        return self.ctx.options

    def setup(self, model: nn.Module) -> None:
        # DeepSpeed's ZeRO all-gathers call an API torch 2.13 deprecates, once per rank.
        warnings.filterwarnings("ignore", message=ALL_GATHER_DEPRECATION, category=FutureWarning)
        deepspeed = import_deepspeed(self.ctx.device)
        config = ds_config(self.ctx, self.options, sum(p.numel() for p in model.parameters()))
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    def forward_backward(self, batch: Mapping[str, torch.Tensor], sync_grads: bool) -> torch.Tensor:
        # With managed_gradient_accumulation off, backward only accumulates and
        # step() is the boundary, so sync_grads needs no action: the loop calls
        # optimizer_step exactly once, after the last micro-batch.
        dtype = DTYPES.get(self.ctx.precision)
        if dtype is not None:
            # DeepSpeed casts the weights, not the inputs: floating inputs (a module's features, a
            # ViT's pixels) follow the weights; token ids and integer labels stay as they are.
            batch = {name: t.to(dtype) if t.is_floating_point() else t for name, t in batch.items()}
        loss = self.engine(**batch).loss
        self.engine.backward(loss)  # divides by gradient_accumulation_steps itself
        return loss.detach()  # unscaled, as TorchStrategy reports it

    def optimizer_step(self) -> bool:
        self.engine.step()  # reduces (stage 0/1) or finalises (stage 2/3), then updates
        return bool(self.engine.was_step_applied())  # False after an fp16 overflow

    def state_tensors(self) -> StateTensors:
        """What this rank holds, found where DeepSpeed 0.19.8 keeps it.

        params: every weight copy: the module's working parameters (ZeRO-1/2:
          views into ``bit16_groups_flat``; ZeRO-3: the partition ``ds_tensor``
          plus the full data of persistent parameters) and the fp32 master
          weights (stage 0 fp16/bf16 ``fp32_groups``, ZeRO-1/2
          ``single_partition_of_fp32_groups``, ZeRO-3
          ``fp32_partitioned_groups_flat``). DeepSpeed's estimators call the
          masters "params_32bit", and autocast strategies count their fp32
          weights as params, so optimizer figures compare across strategies.
        grads: ``param.grad``/``grad_accum`` (stage 0 and ZeRO-1, which reduce
          in step()), the reduced partitions (``averaged_gradients``,
          ``all_grad_tensors``, ``grads_in_partition``; ZeRO-3
          ``grad_partitions_flat_buffer``) and the masters' fp32 ``.grad``
          (held between steps only with offload_optimizer).
        optimizer: the inner torch optimizer's states (moments and step).

        Left out: the ipg reduce buckets (communication staging; ZeRO-3 keeps
        its bucket allocated), offload staging copies, and meta tensors.
        """
        optimizer = self.engine.optimizer
        masters = list(master_weights(optimizer))
        params = list(self.engine.module.parameters())
        return {
            "params": [*params, *(getattr(p, "ds_tensor", None) for p in params), *masters],
            "grads": [*param_grads(params), *partitioned_grads(optimizer), *(m.grad for m in masters)],
            "optimizer": list(optimizer_state_tensors(getattr(optimizer, "optimizer", optimizer))),
        }


# Attributes of DeepSpeed's optimizer wrappers (stage_1_and_2.DeepSpeedZeroOptimizer,
# stage3.DeepSpeedZeroOptimizer_Stage3, fp16.unfused_optimizer.FP16_UnfusedOptimizer)
# that hold gradients or fp32 master weights; absent ones are skipped, so the
# plain torch optimizer of stage 0 fp32 yields nothing here.
GRAD_ATTRIBUTES = (
    "averaged_gradients",
    "all_grad_tensors",
    "grads_in_partition",
    "grad_partitions_flat_buffer",
    "accumulated_grads_in_cpu",
)
MASTER_ATTRIBUTES = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups")


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Tensors in nested lists/tuples/dicts; meta tensors have no memory."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "meta":
            yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


def param_grads(params: Iterable[nn.Parameter]) -> Iterator[torch.Tensor | None]:
    for p in params:
        yield p.grad
        yield getattr(p, "grad_accum", None)  # ZeRO-1/2 separate accumulator, when enabled


def partitioned_grads(optimizer: Any) -> Iterator[torch.Tensor]:
    for name in GRAD_ATTRIBUTES:
        yield from tensors_in(getattr(optimizer, name, None))


def master_weights(optimizer: Any) -> Iterator[torch.Tensor]:
    for name in MASTER_ATTRIBUTES:
        yield from tensors_in(getattr(optimizer, name, None))
