"""3D parallelism with megatron-core as the engine: the tp x pp x dp grid of
:mod:`perfsuite.rank.strategies.tp_pp`, run by NVIDIA's own layers and schedules.

Written against megatron-core 0.19.2 (which needs Python >= 3.12 and CUDA).
The layout comes from the same ``strategy_options`` as ``tp_pp`` (``tp``,
``pp``, ``schedule``, ``microbatches``, ``virtual_stages``), plus two optional
flags (see :class:`perfsuite.core.engines.MegatronOptions`):

* ``distributed_optimizer`` (default False): megatron's DistributedOptimizer
  (ZeRO-1: fp32 main params and Adam moments sharded over dp, gradients
  reduce-scattered, params all-gathered after the step).
* ``overlap_grad_reduce`` (default False): bucketed dp gradient reduction
  overlapped with the backward. Off by default so the comparison with
  ``tp_pp`` (which reduces after the whole backward) is like for like.

How it maps onto megatron-core:

* **Process groups**: ``parallel_state.initialize_model_parallel`` with
  ``order="tp-cp-ep-pp-dp"`` (Megatron-LM's ``--use-tp-pp-dp-mapping``), so
  rank = d*pp*tp + p*tp + t, the (dp, pp, tp) mesh of ``tp_pp``. The worker
  seeds synthetic batches by replica as ``rank // (tp * pp)``; megatron's
  default order (``tp-cp-ep-dp-pp``) would put the stages of one pipeline on
  different replicas, so the last stage would score labels of another batch.
* **Model**: the passed model is only read for its dimensions; megatron
  builds its own ``GPTModel`` from ``get_gpt_layer_local_spec()`` (no
  Transformer Engine), with learned absolute positions, untied embedding and
  LM head, no dropout and tanh GELU, the shape of
  :mod:`perfsuite.rank.models.megatron_gpt`. One ``GPTModel`` per virtual stage
  (``vp_stage``); megatron places chunk v of pipeline rank p at stage
  p + v*pp, the looped placement ``tp_pp`` uses.
* **Precision**: megatron's own scheme, not autocast. fp16/bf16 keep the
  model in half precision (``Float16Module``) and fp32 main params in the
  optimizer. Model state per param: bf16 18 bytes (2 param + 4 fp32 gradient
  buffer, Megatron-LM's bf16 default + 4 main + 8 Adam), fp16 16 (2-byte
  gradient buffer), fp32 16; ``tp_pp`` holds 16 (fp32 params under
  autocast). fp16 uses megatron's DynamicGradScaler.
* **Loss**: megatron's vocab-parallel cross entropy on the last stage (no
  full-vocab logits all-gather, unlike ``tp_pp``), next-token targets shifted
  here, the mean of the step's micro-batch losses broadcast over the pp group
  so every rank reports its replica's loss.
* **Optimizer**: ``get_megatron_optimizer`` with Adam (decoupled weight decay,
  i.e. AdamW, weight decay 0.01 as torch's AdamW default), no gradient
  clipping (``tp_pp`` clips nothing), no learning-rate schedule.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from perfsuite.core.engines import MegatronOptions
from perfsuite.core.layout import ParallelLayout
from perfsuite.rank.models.materialise import ModelFactory
from perfsuite.rank.primitives import StateTensors, optimizer_state_tensors
from perfsuite.rank.strategies.base import EngineUnavailable, Strategy, StrategyContext

INSTALL_HINT = "megatron-core is not installed: pip install 'perfsuite[megatron]'"
VERIFIED_VERSION = (0, 19)  # the release whose API this module was checked against
RANK_ORDER = "tp-cp-ep-pp-dp"  # rank = d*pp*tp + p*tp + t, as the worker's replica seeding assumes
HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SEED_PP_STRIDE = 100  # Megatron-LM's _set_random_seed: every pipeline stage gets its own seed
INITIAL_LOSS_SCALE = 2.0**16  # torch GradScaler's default; megatron's 2**32 would skip the first ~32 steps
IGNORE_INDEX = -100  # labels the loss skips (perfsuite.rank.models.build)

LossFunc = Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]

# Megatron's tensor-parallel overlap relies on one CUDA work queue so that its
# communication kernels are issued in order; it must be set before the CUDA
# context exists, which is why the worker imports strategies first.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")


# -- engine import and options ---------------------------------------------------
@dataclass(frozen=True)
class Megatron:
    """The megatron-core entry points this strategy uses, imported on demand so
    the module itself imports without megatron-core (or CUDA)."""

    parallel_state: ModuleType
    tensor_parallel: ModuleType
    TransformerConfig: Any
    GPTModel: Any
    get_gpt_layer_local_spec: Callable[..., Any]
    Float16Module: Any
    openai_gelu: Callable[[torch.Tensor], torch.Tensor]
    DistributedDataParallel: Any
    DistributedDataParallelConfig: Any
    finalize_model_grads: Callable[..., None]
    OptimizerConfig: Any
    get_megatron_optimizer: Callable[..., Any]
    get_forward_backward_func: Callable[..., Callable[..., list[dict[str, torch.Tensor]]]]


def import_megatron() -> Megatron:
    """megatron-core's entry points, or EngineUnavailable with the precise reason."""
    core = _import_core()
    _check_version(core)
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.utils import openai_gelu

    return Megatron(
        parallel_state,
        tensor_parallel,
        TransformerConfig,
        GPTModel,
        get_gpt_layer_local_spec,
        Float16Module,
        openai_gelu,
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
        OptimizerConfig,
        get_megatron_optimizer,
        get_forward_backward_func,
    )


def _import_core() -> ModuleType:
    try:
        return importlib.import_module("megatron.core")
    except ModuleNotFoundError as exc:
        if exc.name in ("megatron", "megatron.core"):
            raise EngineUnavailable(INSTALL_HINT) from None
        # megatron.core is there but one of its own imports is not: say which.
        raise EngineUnavailable(f"megatron-core is installed but cannot be imported: {exc}") from None
    except ImportError as exc:
        raise EngineUnavailable(f"megatron-core is installed but cannot be imported: {exc}") from None


def _check_version(core: ModuleType) -> None:
    """Refuse releases older than the one this module was checked against:
    their optimizer and schedule signatures differ, and a mid-setup TypeError
    is a worse skip reason than this one."""
    version = str(getattr(core, "__version__", ""))
    match = re.match(r"(\d+)\.(\d+)", version)
    if match and (int(match[1]), int(match[2])) < VERIFIED_VERSION:
        wanted = ".".join(map(str, VERIFIED_VERSION))
        raise EngineUnavailable(
            f"megatron-core {version} is older than {wanted}, the API this strategy is written for; "
            f"pip install 'megatron-core>={wanted}' (it needs Python >= 3.12)"
        )


# -- model dimensions ------------------------------------------------------------
@dataclass(frozen=True)
class GPTDims:
    vocab: int
    hidden: int
    layers: int
    heads: int
    ffn: int
    max_positions: int

    @classmethod
    def from_model(cls, model: nn.Module) -> GPTDims:
        """Dimensions of a :class:`perfsuite.rank.models.megatron_gpt.MegatronGPT`
        (StrategyContext carries none, so the built model is the source)."""
        gpt: Any = model  # attributes of MegatronGPT, looked up dynamically
        try:
            tokens, positions, block = gpt.embed.tokens, gpt.embed.positions, gpt.blocks[0]
            return cls(
                vocab=tokens.num_embeddings,
                hidden=tokens.embedding_dim,
                layers=len(gpt.blocks),
                heads=tokens.embedding_dim // block.attn.head_dim,
                ffn=block.mlp.fc1.out_features,
                max_positions=positions.num_embeddings,
            )
        except (AttributeError, IndexError, TypeError) as exc:
            raise TypeError(
                f"megatron_core reads the model shape from a megatron_gpt model (embed/blocks/head); "
                f"{type(model).__name__} does not have it ({exc})"
            ) from None


# -- micro-batches -----------------------------------------------------------------
@dataclass(frozen=True)
class MicroBatch:
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor  # next-token labels, aligned with input positions
    loss_mask: torch.Tensor  # 1.0 where the position is scored


def split_micro_batches(batch: Mapping[str, torch.Tensor], count: int) -> list[MicroBatch]:
    """The step's rows as ``count`` equal micro-batches in megatron's terms.

    Megatron's GPT loss scores position t against ``labels[t]``; perfsuite's
    batches follow the transformers convention (position t predicts label
    t + 1). So targets are the labels shifted left by one, and the last
    position (no next token) and ignored labels are masked out: the same
    mean next-token cross entropy as :func:`causal_lm_loss`.
    """
    input_ids, labels = batch["input_ids"], batch["labels"]
    rows, seq = input_ids.shape
    if count < 1 or rows % count:
        raise ValueError(f"megatron_core: a step's {rows} rows do not split into {count} micro-batches")
    targets = labels.roll(-1, dims=1)
    mask = (targets != IGNORE_INDEX).float()
    mask[:, -1] = 0.0
    targets = targets.masked_fill(targets == IGNORE_INDEX, 0)  # keep ids in range; masked anyway
    size = rows // count
    positions = torch.arange(seq, device=input_ids.device).expand(size, seq)
    return [
        MicroBatch(ids, positions, tgt, msk)
        for ids, tgt, msk in zip(input_ids.split(size), targets.split(size), mask.split(size), strict=True)
    ]


def masked_mean_loss(
    loss_mask: torch.Tensor, token_losses: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Megatron's two-value loss-function contract: (loss to backpropagate,
    values to report). The schedule divides the first by the number of
    micro-batches in place, so the reported copy must not share its storage."""
    loss = (token_losses.float() * loss_mask).sum() / loss_mask.sum().clamp(min=1.0)
    return loss, {"loss": loss.detach().clone()}


# -- the strategy --------------------------------------------------------------------
class MegatronCoreStrategy(Strategy[MegatronOptions]):
    pipelined = True

    mc: Megatron
    layout: ParallelLayout
    chunks: list[Any]  # megatron DistributedDataParallel, one per virtual stage of this rank
    optimizer: Any  # megatron.core.optimizer.ChainedOptimizer
    num_microbatches: int
    forward_backward_func: Callable[..., list[dict[str, torch.Tensor]]]

    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        # CUDA and the schedule (no GPipe in megatron-core) are checked before
        # launch from its EngineSpec; the version only a live import can tell.
        import_megatron()

    # -- setup ------------------------------------------------------------------------
    def place(self, factory: ModelFactory) -> nn.Module:
        # megatron's GPTModel builds each rank's partition; perfsuite's model only gives the shape.
        return factory.on_meta("engine's own")

    def setup(self, model: nn.Module) -> None:
        ctx = self.ctx
        self.mc = import_megatron()
        self.layout = ctx.layout
        dims = GPTDims.from_model(model)
        if self.layout.pp > 1:
            self.layout.check_layers(dims.layers)
        # The worker keeps its reference until setup returns, so `del` alone
        # would hold a second full model on the device while megatron's is built.
        model.to(device="meta")
        del model
        self.num_microbatches = self.layout.microbatches if self.layout.pp > 1 else ctx.grad_accum
        self._init_parallel_state()
        config = self._transformer_config(dims)
        built = [self._build_chunk(config, dims, vp) for vp in self._vp_stages()]
        self.chunks = [self._wrap(config, chunk, i) for i, chunk in enumerate(built)]
        self.optimizer = self.mc.get_megatron_optimizer(
            self._optimizer_config(), self.chunks, use_gloo_process_groups=False
        )
        self._hook_schedule(config)
        self.forward_backward_func = self.mc.get_forward_backward_func()

    @property
    def interleaved(self) -> bool:
        return self.layout.pp > 1 and self.layout.schedule == "interleaved_1f1b"

    def _vp_stages(self) -> Sequence[int | None]:
        return range(self.layout.virtual_stages) if self.interleaved else [None]

    def _init_parallel_state(self) -> None:
        ps, layout = self.mc.parallel_state, self.layout
        ps.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.virtual_stages if self.interleaved else None,
            order=RANK_ORDER,
            # Gloo groups only serve megatron's checkpoint code; skip their setup cost.
            create_gloo_process_groups=False,
        )
        # Same seed on every dp replica (identical initial weights without a
        # broadcast), a different one per pipeline stage; megatron derives the
        # per-tp-rank seeds of sharded weights from it.
        seed = (torch.initial_seed() + SEED_PP_STRIDE * ps.get_pipeline_model_parallel_rank()) % 2**63
        torch.manual_seed(seed)
        self.mc.tensor_parallel.model_parallel_cuda_manual_seed(seed)

    def _transformer_config(self, dims: GPTDims) -> Any:
        layout, precision = self.layout, self.ctx.precision
        dtype = HALF_DTYPES.get(precision, torch.float32)
        return self.mc.TransformerConfig(
            num_layers=dims.layers,
            hidden_size=dims.hidden,
            num_attention_heads=dims.heads,
            ffn_hidden_size=dims.ffn,
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.virtual_stages if self.interleaved else None,
            fp16=precision == "fp16",
            bf16=precision == "bf16",
            params_dtype=dtype,
            pipeline_dtype=dtype,  # p2p activations travel in the model dtype (Megatron-LM's choice)
            use_cpu_initialization=False,  # sharded weights initialised on the GPU, per tp rank
            hidden_dropout=0.0,  # perfsuite's GPT has no dropout
            attention_dropout=0.0,
            activation_func=self.mc.openai_gelu,  # tanh GELU, as perfsuite's GPT
            deallocate_pipeline_outputs=True,  # Megatron-LM's default: frees sent activations early
        )

    def _build_chunk(self, config: Any, dims: GPTDims, vp_stage: int | None) -> nn.Module:
        ps = self.mc.parallel_state
        chunk: nn.Module = self.mc.GPTModel(
            config=config,
            transformer_layer_spec=self.mc.get_gpt_layer_local_spec(),
            vocab_size=dims.vocab,
            max_sequence_length=dims.max_positions,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=False,  # untied, as perfsuite's GPT
            position_embedding_type="learned_absolute",
            vp_stage=vp_stage,
        )
        # LayerNorms and the position embedding are plain torch modules built
        # on the CPU; only megatron's parallel layers honour use_cpu_initialization.
        chunk.to(self.ctx.device)
        for param in chunk.parameters():
            self.mc.tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        if self.ctx.precision in HALF_DTYPES:
            # Casts the first stage's float inputs and the last stage's outputs.
            chunk = self.mc.Float16Module(config, chunk)
        return chunk

    def _wrap(self, config: Any, chunk: nn.Module, index: int) -> nn.Module:
        ddp_config = self.mc.DistributedDataParallelConfig(
            # Megatron-LM accumulates and reduces bf16 gradients in fp32.
            grad_reduce_in_fp32=self.ctx.precision == "bf16",
            overlap_grad_reduce=self.options.overlap_grad_reduce,
            use_distributed_optimizer=self.options.distributed_optimizer,
        )
        # Later chunks reduce in one bucket, as Megatron-LM's get_model does.
        wrapped: nn.Module = self.mc.DistributedDataParallel(config, ddp_config, chunk, disable_bucketing=index > 0)
        return wrapped

    def _optimizer_config(self) -> Any:
        precision = self.ctx.precision
        return self.mc.OptimizerConfig(
            optimizer="adam",
            lr=self.ctx.lr,
            weight_decay=0.01,  # torch AdamW's default, which the native strategies use
            decoupled_weight_decay=True,  # AdamW, as the native strategies
            fp16=precision == "fp16",
            bf16=precision == "bf16",
            params_dtype=HALF_DTYPES.get(precision, torch.float32),
            use_distributed_optimizer=self.options.distributed_optimizer,
            clip_grad=0.0,  # the native strategies do not clip
            initial_loss_scale=INITIAL_LOSS_SCALE,
        )

    def _hook_schedule(self, config: Any) -> None:
        """What Megatron-LM's training loop wires into the shared config: loss
        scaling and the end-of-backward gradient reduction (dp all-reduce or
        reduce-scatter, run by finalize_model_grads, not by DDP itself)."""
        config.grad_scale_func = self.optimizer.scale_loss
        config.finalize_model_grads_func = self.mc.finalize_model_grads
        if self.options.overlap_grad_reduce:
            config.no_sync_func = _per_chunk([c.no_sync for c in self.chunks])
            config.grad_sync_func = _per_chunk([c.start_grad_sync for c in self.chunks])

    # -- one step ---------------------------------------------------------------------
    def forward_backward(self, batch: Mapping[str, torch.Tensor], sync_grads: bool) -> torch.Tensor:
        # sync_grads is always True here: a pipelined strategy gets the whole
        # step in one call, and the schedule itself defers the dp reduction.
        micro = split_micro_batches(batch, self.num_microbatches)
        for chunk in self.chunks:
            chunk.zero_grad_buffer()  # main grads accumulate into the buffer; clear it per step
        reported = self.forward_backward_func(
            forward_step_func=self._forward_step,
            data_iterator=[iter(micro) for _ in self.chunks],  # every chunk runs every micro-batch
            model=self.chunks,
            num_microbatches=len(micro),
            seq_length=batch["input_ids"].shape[1],
            micro_batch_size=micro[0].input_ids.shape[0],
            forward_only=False,
        )
        return self._step_loss(reported)

    def _forward_step(self, data_iterator: Iterator[MicroBatch], model: nn.Module) -> tuple[torch.Tensor, LossFunc]:
        """Megatron's forward_step contract. Stages other than the first take
        their input from the schedule (set_input_tensor) and ignore the ids;
        stages other than the last ignore the labels and return hidden states."""
        mb = next(data_iterator)
        # attention_mask None: the local spec's causal attention builds its own mask.
        output = model(mb.input_ids, mb.position_ids, None, labels=mb.targets)
        return output, functools.partial(masked_mean_loss, mb.loss_mask)

    def _step_loss(self, reported: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """Mean micro-batch loss of the last stage, broadcast over the pp group."""
        ps = self.mc.parallel_state
        if reported:
            loss = torch.stack([r["loss"] for r in reported]).mean()
        else:
            loss = torch.zeros((), device=self.ctx.device)
        if self.layout.pp > 1:
            dist.broadcast(
                loss, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
            )
        return loss

    def optimizer_step(self) -> bool:
        # (success, grad_norm, num_zeros): success is False when megatron's fp16
        # scaler found inf/NaN and skipped the update (every rank agrees).
        success, _grad_norm, _num_zeros = self.optimizer.step()
        # Drops the main params' .grad (fp32 copies of the main grads under
        # fp16); the grad buffer itself is zeroed at the start of the next step.
        self.optimizer.zero_grad()
        return bool(success)

    def state_tensors(self) -> StateTensors:
        params = [p for chunk in self.chunks for p in chunk.parameters()]
        return {
            "params": params,
            # DDP's contiguous grad buffer: each main_grad is a view into it.
            "grads": [getattr(p, "main_grad", None) for p in params],
            "optimizer": list(_optimizer_tensors(self.optimizer)),
        }


def _per_chunk(funcs: list[Callable[..., Any]]) -> Callable[..., Any] | list[Callable[..., Any]]:
    """Megatron's config takes one function for a single chunk, a list for
    several (interleaved schedules)."""
    return funcs[0] if len(funcs) == 1 else funcs


def _optimizer_tensors(optimizer: Any) -> Iterable[torch.Tensor]:
    """Main params and Adam moments of megatron's optimizer.

    The inner torch optimizer's param groups hold what it updates: the fp32
    main copies (Float16OptimizerWithFloat16Params), this rank's fp32 shards
    (DistributedOptimizer) or the model params themselves (FP32Optimizer,
    already counted under params). Its ``state`` holds exp_avg / exp_avg_sq.
    """
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(part, "optimizer", None)
        if inner is None:  # a stub optimizer: no parameters on this rank
            continue
        for group in inner.param_groups:
            yield from (p for p in group["params"] if isinstance(p, torch.Tensor))
        yield from optimizer_state_tensors(inner)
