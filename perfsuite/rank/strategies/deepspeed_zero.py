"""DeepSpeed ZeRO stages 0-3 driven through ``deepspeed.initialize``.

torchrun has already started the ranks and the worker has already called
``torch.distributed.init_process_group``; ``deepspeed.init_distributed`` sees an
initialised default group and only wraps it (``TorchBackend`` skips
``init_process_group`` when ``torch.distributed.is_initialized()``), so
DeepSpeed's collectives run on the worker's gloo/nccl group.

A team's own config (option ``config``) runs as given, with the batch keys and the
precision set from the scenario (:mod:`perfsuite.core.engines.deepspeed_config` refused any that
disagreed at collection) and perfsuite's optimizer only where the config has none. At
stage 3 the model is built inside ``deepspeed.zero.Init``: each module's parameters are
partitioned as it is constructed, so no rank ever holds the whole model.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import types
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from perfsuite.core.engines import ZeroOptions
from perfsuite.core.engines.base import OPTIMIZERS
from perfsuite.core.engines.deepspeed_config import AUTO, PRECISION_KEYS, auto_keys
from perfsuite.rank.models.materialise import ModelFactory
from perfsuite.rank.primitives import DTYPES, StateTensors, optimizer_state_tensors
from perfsuite.rank.strategies import steps
from perfsuite.rank.strategies.base import EngineUnavailable, Strategy, StrategyContext, require

SHM_COMM_OP = "deepspeed_shm_comm"  # deepspeed.ops.op_builder.cpu.comm.ShareMemCommBuilder.NAME
ALL_GATHER_DEPRECATION = r"`torch\.distributed\.all_gather_into_tensor` is deprecated"
NEVER_PRINT = 2**31 - 1  # steps_per_print: DeepSpeed logs progress every N steps
#: Named optimizers DeepSpeed builds itself from its config (torch_adam: plain torch.optim.AdamW,
#: a ZeRO-supported optimizer, so no FusedAdam/DeepSpeedCPUAdam op is compiled, offload included).
DS_OPTIMIZERS: Mapping[str, dict[str, Any]] = {
    "adamw": {"type": "AdamW", "params": {"torch_adam": True}},
    "adamw_fused": {"type": "AdamW", "params": {"torch_adam": True, "fused": True}},
    "sgd": {"type": "SGD", "params": {}},
}


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
    """The config deepspeed.initialize gets: the team's (option ``config``) or perfsuite's own,
    with the batch and precision of the scenario."""
    config: dict[str, Any]
    if options.config is not None:
        config = json.loads(json.dumps(dict(options.config)))  # a deep copy of plain JSON
    else:
        config = {"zero_optimization": zero_config(options, model_numel), "wall_clock_breakdown": False}
    config["train_micro_batch_size_per_gpu"] = ctx.micro_batch
    config["gradient_accumulation_steps"] = ctx.grad_accum
    # DeepSpeed derives the rest (micro x accumulation x its world size); collection checked that
    # a train_batch_size the config gave is that. zero.Init reads the config before DeepSpeed's
    # communicator knows the world size, and would refuse any other value.
    config.pop("train_batch_size", None)
    # The caller owns the boundary, as perfsuite's loop does: backward()
    # accumulates, step() reduces and updates. In the managed default,
    # ZeRO-1 reduces inside the last backward and frees its full gradients
    # before the loop counts state, so it would look like ZeRO-2.
    config.setdefault("managed_gradient_accumulation", False)
    config.setdefault("steps_per_print", NEVER_PRINT)
    if "optimizer" not in config:
        section = ds_optimizer(options.optimizer, ctx.lr)
        if section is not None:
            config["optimizer"] = section
    if config.get("optimizer", {}).get("type") == "SGD" or "optimizer" not in config:
        config.setdefault("zero_allow_untested_optimizer", True)  # SGD or a team factory: plain torch
    if ctx.precision in ("fp16", "bf16"):
        section = config.get(ctx.precision)
        config[ctx.precision] = {**(section if isinstance(section, Mapping) else {}), "enabled": True}
    for key, precision in PRECISION_KEYS.items():  # "auto", as the Trainer fills it: on for the run's own
        section = config.get(key)
        if isinstance(section, dict) and section.get("enabled") == AUTO:
            section["enabled"] = precision == ctx.precision
    return trainer_filled(config, ctx) if auto_keys(config) else config


def ds_optimizer(name: str, lr: float) -> dict[str, Any] | None:
    """The config's ``optimizer`` section for a named optimizer; None for the team's factory
    (deepspeed.initialize then gets it as the client optimizer)."""
    if name not in OPTIMIZERS:
        return None
    named = DS_OPTIMIZERS.get(name)
    if named is None:
        # Else the name would silently train with a client torch optimizer, not DeepSpeed's own.
        raise RuntimeError(f"optimizer {name!r} is a named optimizer, but DS_OPTIMIZERS has no DeepSpeed config for it")
    return {"type": named["type"], "params": {"lr": lr, **named["params"]}}


def trainer_filled(config: dict[str, Any], ctx: StrategyContext) -> dict[str, Any]:
    """A config of the HF Trainer's kind with its "auto" values filled as the Trainer fills them:
    by transformers' own HfTrainerDeepSpeedConfig, from TrainingArguments' defaults, the scenario's
    learning rate and batch, the model's hidden size and the run's steps (collection refused the
    keys it does not fill)."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments) if f.init}
    args = types.SimpleNamespace(
        **{
            **defaults,
            "world_size": ctx.layout.dp,
            "per_device_train_batch_size": ctx.micro_batch,
            "gradient_accumulation_steps": ctx.grad_accum,
            "learning_rate": ctx.lr,
            "fp16": ctx.precision == "fp16",
            "bf16": ctx.precision == "bf16",
        },
    )
    args.get_warmup_steps = functools.partial(TrainingArguments.get_warmup_steps, args)
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=ctx.hidden)) if ctx.hidden else None
    filled = HfTrainerDeepSpeedConfig(config)
    try:  # it also registers itself for transformers' from_pretrained, which perfsuite does not want
        filled.trainer_config_process(args)
        filled.trainer_config_finalize(args, model, ctx.steps)
    finally:
        unset_hf_deepspeed_config()
    return dict(filled.config)


class DeepSpeedZeroStrategy(Strategy[ZeroOptions]):
    engine: Any

    def __init__(self, ctx: StrategyContext) -> None:
        super().__init__(ctx)
        # deepspeed.initialize's config: made in place() (ZeRO-3's zero.Init reads it while the
        # model is built), else in setup().
        self.config: dict[str, Any] | None = None

    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        check_precision(import_deepspeed(ctx.device), ctx.precision, ctx.device)

    def place(self, factory: ModelFactory) -> nn.Module:
        # DeepSpeed's ZeRO all-gathers call an API torch 2.13 deprecates, once per rank.
        warnings.filterwarnings("ignore", message=ALL_GATHER_DEPRECATION, category=FutureWarning)
        config = self.config = ds_config(self.ctx, self.options, factory.numel())
        if self.options.stage != 3:
            return factory.on_device(self.ctx.device)
        deepspeed = import_deepspeed(self.ctx.device)
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = factory.build(self.ctx.device)
        factory.how = "zero.Init"
        return model

    def setup(self, model: nn.Module) -> None:
        deepspeed = import_deepspeed(self.ctx.device)
        config = self.config
        if config is None:  # set up without build(): a model made elsewhere
            config = self.config = ds_config(self.ctx, self.options, sum(p.numel() for p in model.parameters()))
        steps.prepare_blocks(model, self.options.activation_checkpointing, compile_blocks=False)
        client = None
        if "optimizer" not in config:  # the team's factory
            client = steps.make_optimizer(self.options.optimizer, model.parameters(), self.ctx.lr)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), optimizer=client, config=config
        )
        if self.ctx.graph == "compile":
            self.engine.compile()  # DeepSpeed's own: compiles the module it wraps, ZeRO hooks left out

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
