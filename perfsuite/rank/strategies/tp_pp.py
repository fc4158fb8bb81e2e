"""3D parallelism: data x pipeline x tensor parallel with PyTorch-native parts.

The layout comes from ``strategy_options`` (``tp``, ``pp``, ``schedule``,
``microbatches``, ``virtual_stages``; see :class:`perfsuite.core.engines.ParallelOptions`);
dp is what tp x pp leaves of the world. Ranks form a DeviceMesh of shape
(dp, pp, tp): tensor-parallel groups are adjacent ranks (rank = d*pp*tp + p*tp + t).

The model must be splittable like :mod:`perfsuite.rank.models.megatron_gpt` (``embed``,
``blocks``, ``head`` and ``stage(index, count)``); GPT-2's Conv1D projections are
refused by DTensor tensor parallelism.

* **Tensor parallel** (tp > 1): ``parallelize_module`` per block, Megatron
  style: q/k/v and fc1 ``ColwiseParallel``, the attention output projection and
  fc2 ``RowwiseParallel`` (one all-reduce after attention, one after the MLP in
  the forward, the same two in the backward). The token embedding is
  vocab-parallel (:class:`VocabParallelEmbedding`: a ``Shard(0)`` DTensor
  table, masked local lookup, outputs all-reduced) and the LM head is
  vocab-parallel (``ColwiseParallel``) with its logits all-gathered
  (``output_layouts=Replicate()``), so the loss is an ordinary cross entropy
  over full-vocab logits (no ``loss_parallel``). Replicated on every tp rank:
  LayerNorms, the position embedding and the row-parallel biases (0.17% of
  GPT-1.3B at tp=2).
* **Pipeline parallel** (pp > 1): ``torch.distributed.pipelining``. The blocks
  are split evenly into pp x virtual_stages stages (stage 0 also owns the
  embeddings, the last stage the final LayerNorm, LM head and loss); rank p of
  a pipeline holds stages p, p + pp, ... (the looped placement that
  ``ScheduleInterleaved1F1B`` expects). Schedules: ``gpipe`` ->
  ``ScheduleGPipe``, ``1f1b`` -> ``Schedule1F1B``, ``interleaved_1f1b`` ->
  ``ScheduleInterleaved1F1B``, each with ``microbatches`` micro-batches of
  ``micro_batch`` rows. With pp == 1 there is no pipeline: the step's rows are
  run as ``grad_accum`` micro-batches of ``micro_batch`` rows, one after the
  other (the scenario sets ``global_batch = micro_batch x microbatches x dp``
  for a pipeline, so for pp > 1 grad_accum == microbatches).
* **Data parallel** (dp > 1): after the whole step's backward, gradients
  (their local shards) are averaged over the dp group with bucketed all-reduces
  (about 25M elements a bucket). Simple and exact, but not overlapped with the
  backward the way DDP / FSDP2 overlap it.

Every rank of one data-parallel replica (its pp x tp ranks) sees the same
batch: the worker seeds synthetic batches by replica, not by rank.

Precision: fp32; bf16 and fp16 run every stage's forward (and the loss) under
autocast, the backward outside it. fp16 scales the loss with a GradScaler
whose inf check is all-reduced over the whole world, so every tp, pp and dp
rank skips the same steps (each holds different gradients).

Loss: the mean of the step's micro-batch losses, computed on the last
pipeline stage and broadcast over the pp group, so every rank reports the same
loss for its replica (replicas train on different data, as under DDP).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from perfsuite.core.engines import TPPPOptions
from perfsuite.rank.models.materialise import ModelFactory
from perfsuite.rank.models.megatron_gpt import INIT_STD, Block, GPTStage, causal_lm_loss
from perfsuite.rank.primitives import Precision, StateTensors, local_tensor, optimizer_state_tensors
from perfsuite.rank.strategies import steps
from perfsuite.rank.strategies.base import EngineUnavailable, Strategy, StrategyContext

BUCKET_ELEMENTS = 25 * 2**20  # data-parallel all-reduce bucket, like DDP's 25 MiB default (in elements)


def _engines() -> dict[str, ModuleType]:
    """torch.distributed.pipelining, tensor.parallel and device_mesh, or a precise reason."""
    if not dist.is_available():
        raise EngineUnavailable(f"torch {torch.__version__} was built without torch.distributed")
    found: dict[str, ModuleType] = {}
    for key, module, names in (
        (
            "pipelining",
            "torch.distributed.pipelining",
            ("PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B"),
        ),
        ("tp", "torch.distributed.tensor.parallel", ("parallelize_module", "ColwiseParallel", "RowwiseParallel")),
        ("mesh", "torch.distributed.device_mesh", ("init_device_mesh",)),
        ("tensor", "torch.distributed.tensor", ("DTensor", "Replicate")),
    ):
        try:
            found[key] = importlib.import_module(module)
        except ImportError as exc:
            raise EngineUnavailable(f"{module} cannot be imported in torch {torch.__version__}: {exc}") from None
        missing = [n for n in names if not hasattr(found[key], n)]
        if missing:
            raise EngineUnavailable(
                f"{module} in torch {torch.__version__} lacks {', '.join(missing)}; tp_pp needs a newer torch"
            )
    return found


class VocabParallelEmbedding(nn.Module):
    """Megatron's vocab-parallel embedding on DTensor: the table is a
    ``Shard(0)`` DTensor parameter; each rank looks up the token ids that fall
    in its rows, zeroes the others, and the partial outputs are all-reduced.

    Used instead of ``RowwiseParallel`` on ``nn.Embedding``, whose DTensor
    backward (torch 2.13) computes the weight gradient as a *replicated*
    vocab x hidden tensor on every tp rank, so each rank would hold the full
    gradient of a sharded table. Here the gradient flows through
    ``to_local()`` and is the local ``Shard(0)`` rows only.
    """

    def __init__(self, embedding: nn.Embedding, tp_mesh: Any) -> None:
        super().__init__()
        from torch.distributed.tensor import Shard, distribute_tensor

        vocab, size = embedding.num_embeddings, tp_mesh.size()
        if vocab % size:
            raise ValueError(f"tp_pp: vocab={vocab} is not divisible by tp={size}")
        self.mesh = tp_mesh
        self.rows = vocab // size
        self.start = tp_mesh.get_local_rank() * self.rows
        self.weight = nn.Parameter(distribute_tensor(embedding.weight.detach(), tp_mesh, [Shard(0)]))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT's embedding init, for a table materialised after it was sharded."""
        nn.init.normal_(self.weight, std=INIT_STD)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Partial, Replicate

        shifted = input_ids - self.start
        outside = (shifted < 0) | (shifted >= self.rows)
        out = F.embedding(shifted.masked_fill(outside, 0), local_tensor(self.weight))
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        # Partial -> Replicate is the all-reduce; its backward passes the
        # (replicated) output gradient through unchanged.
        return DTensor.from_local(out, self.mesh, [Partial()]).redistribute(self.mesh, [Replicate()]).to_local()


class _Autocast(nn.Module):
    """Runs the wrapped stage's forward under the precision's autocast; the
    pipeline schedule runs the backward outside it."""

    def __init__(self, module: nn.Module, precision: Precision) -> None:
        super().__init__()
        self.module = module
        self.precision = precision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast():
            return self.module(x)


def _split_rows(rows: int, chunks: int) -> int:
    if chunks < 1 or rows % chunks:
        raise ValueError(f"tp_pp: a step's {rows} rows do not split into {chunks} micro-batches")
    return rows // chunks


class TPPPStrategy(Strategy[TPPPOptions]):
    pipelined = True

    @classmethod
    def check(cls, ctx: StrategyContext) -> None:
        _engines()  # the layout itself was validated at collection (perfsuite.core.engines)

    # -- setup --------------------------------------------------------------
    def place(self, factory: ModelFactory) -> nn.Module:
        # On meta: each rank gives storage to its own stages' (tensor-parallel) shards only.
        return factory.on_meta("meta, then split")

    def setup(self, model: nn.Module) -> None:
        eng = _engines()
        ctx = self.ctx
        for attr in ("embed", "blocks", "head", "stage"):
            if not hasattr(model, attr):
                raise TypeError(
                    f"tp_pp needs a model splittable into embed/blocks/head stages (family megatron_gpt); "
                    f"{type(model).__name__} has no {attr!r}"
                )
        layout = self.layout = ctx.layout
        if layout.pp > 1:
            layout.check_layers(len(model.blocks))  # type: ignore[arg-type]
        self.precision = Precision(ctx.precision, ctx.device, rank_agreed=True)
        if self.precision.scaler is not None:
            # The scale is created lazily by the first scale() call, which only
            # the last pipeline stage makes; every rank needs it to unscale.
            self.precision.scaler.scale(torch.zeros((), device=ctx.device))

        mesh = eng["mesh"].init_device_mesh(
            ctx.device.type, (layout.dp, layout.pp, layout.tp), mesh_dim_names=("dp", "pp", "tp")
        )
        self.mesh = mesh
        self.dp_group = mesh["dp"].get_group()
        self.pp_group = mesh["pp"].get_group()
        self.pp_rank = mesh["pp"].get_local_rank()

        # Stages of this pipeline rank: p, p + pp, ... (one unless interleaved).
        stages_total = layout.stages if layout.pp > 1 else 1
        self.stage_ids = list(range(self.pp_rank, stages_total, max(layout.pp, 1)))
        self.parts: list[GPTStage] = [model.stage(i, stages_total) for i in self.stage_ids]  # type: ignore[operator]
        for part in self.parts:
            if layout.tp > 1:
                self._tensor_parallel(part, mesh["tp"], eng)
            if any(p.is_meta for p in part.parameters()):
                self.factory.materialise(part, ctx.device)
            # After the split: tensor parallelism names the blocks' own submodules.
            steps.prepare_blocks(
                part, self.options.activation_checkpointing, ctx.graph == "compile", blocks=part.blocks
            )
        self.has_first = any(i == 0 for i in self.stage_ids)
        self.has_last = any(i == stages_total - 1 for i in self.stage_ids)

        if layout.pp > 1:
            self.schedule = self._make_schedule(eng["pipelining"], stages_total)
        self.optimizer = self._make_optimizer(eng["tensor"].DTensor)

    def _tensor_parallel(self, part: GPTStage, tp_mesh: Any, eng: Mapping[str, ModuleType]) -> None:
        tp, Replicate = eng["tp"], eng["tensor"].Replicate
        size = self.layout.tp
        for block in part.blocks:
            if not isinstance(block, Block):
                raise TypeError(
                    f"tp_pp splits megatron_gpt Blocks (attn.q/k/v/out, mlp.fc1/fc2), not {type(block).__name__}"
                )
            attn, mlp = block.attn, block.mlp
            for name, value in (("heads", attn.q.out_features // attn.head_dim), ("ffn", mlp.fc1.out_features)):
                if value % size:
                    raise ValueError(f"tp_pp: model {name}={value} is not divisible by tp={size}")
            tp.parallelize_module(
                block,
                tp_mesh,
                {
                    "attn.q": tp.ColwiseParallel(),
                    "attn.k": tp.ColwiseParallel(),
                    "attn.v": tp.ColwiseParallel(),
                    "attn.out": tp.RowwiseParallel(),
                    "mlp.fc1": tp.ColwiseParallel(),
                    "mlp.fc2": tp.RowwiseParallel(),
                },
            )
        if part.embed is not None:
            # Vocab-parallel embedding: each rank holds vocab/tp rows.
            part.embed.tokens = VocabParallelEmbedding(part.embed.tokens, tp_mesh)  # type: ignore[assignment]
        if part.head is not None:
            # Vocab-parallel LM head; logits all-gathered for a plain cross entropy.
            tp.parallelize_module(
                part.head.lm_head,
                tp_mesh,
                tp.ColwiseParallel(output_layouts=Replicate()),
            )

    def _make_schedule(self, pipelining: ModuleType, stages_total: int) -> Any:
        layout, ctx = self.layout, self.ctx
        stages = [
            pipelining.PipelineStage(
                _Autocast(part, self.precision), index, stages_total, ctx.device, group=self.pp_group
            )
            for index, part in zip(self.stage_ids, self.parts, strict=True)
        ]
        if layout.schedule == "interleaved_1f1b":
            return pipelining.ScheduleInterleaved1F1B(stages, n_microbatches=layout.microbatches, loss_fn=self._loss)
        cls = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[layout.schedule]
        return cls(stages[0], n_microbatches=layout.microbatches, loss_fn=self._loss)

    def _make_optimizer(self, dtensor_type: type) -> torch.optim.Optimizer:
        params = [p for part in self.parts for p in part.parameters()]
        # Separate groups: one foreach kernel never mixes DTensors and plain tensors.
        sharded = [p for p in params if isinstance(p, dtensor_type)]
        plain = [p for p in params if not isinstance(p, dtensor_type)]
        groups = [{"params": g} for g in (sharded, plain) if g]
        return steps.make_optimizer(self.options.optimizer, groups, self.ctx.lr)

    # -- one step -----------------------------------------------------------
    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Pipeline loss of one micro-batch (last stage): scaled for fp16."""
        loss = causal_lm_loss(logits, labels)  # logits in the autocast dtype, loss in fp32
        scaler = self.precision.scaler
        return scaler.scale(loss) if scaler is not None else loss

    def forward_backward(self, batch: Mapping[str, torch.Tensor], sync_grads: bool) -> torch.Tensor:
        input_ids, labels = batch["input_ids"], batch["labels"]
        loss = self._accumulate(input_ids, labels) if self.layout.pp == 1 else self._pipeline(input_ids, labels)
        if self.layout.dp > 1:
            self._average_grads()
        return loss

    def _accumulate(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        (model,) = self.parts
        chunks = self.ctx.grad_accum
        rows = _split_rows(input_ids.shape[0], chunks)
        total = torch.zeros((), device=input_ids.device)
        for ids, lab in zip(input_ids.split(rows), labels.split(rows), strict=True):
            with self.precision.autocast():
                loss = causal_lm_loss(model(ids), lab)
            self.precision.backward(loss / chunks)
            total += loss.detach()
        return total / chunks

    def _pipeline(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        _split_rows(input_ids.shape[0], self.layout.microbatches)
        losses: list[torch.Tensor] = []
        if self.has_first:
            self.schedule.step(input_ids, target=labels if self.has_last else None, losses=losses)
        elif self.has_last:
            self.schedule.step(target=labels, losses=losses)
        else:
            self.schedule.step()
        if self.has_last:
            loss = torch.stack(losses).detach().mean()
            if self.precision.scaler is not None:  # a power of two: the division is exact
                loss = loss / self.precision.scaler.get_scale()
        else:
            loss = torch.zeros((), device=input_ids.device)
        last = dist.get_global_rank(self.pp_group, self.layout.pp - 1)
        dist.broadcast(loss, src=last, group=self.pp_group)
        return loss

    @torch.no_grad()
    def _average_grads(self) -> None:
        """Average the local gradient shards over the data-parallel group."""
        grads = [local_tensor(p.grad) for part in self.parts for p in part.parameters() if p.grad is not None]
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, group=self.dp_group)
            flat.div_(self.layout.dp)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def optimizer_step(self) -> bool:
        applied = self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return applied

    def state_tensors(self) -> StateTensors:
        params = [p for part in self.parts for p in part.parameters()]
        return {
            "params": params,
            "grads": [p.grad for p in params],
            "optimizer": list(optimizer_state_tensors(self.optimizer)),
        }


def _buckets(grads: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Consecutive same-dtype groups of at most BUCKET_ELEMENTS elements (one
    larger tensor makes a bucket of its own)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads:
        if bucket and (size + g.numel() > BUCKET_ELEMENTS or g.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(g)
        size += g.numel()
    if bucket:
        yield bucket
