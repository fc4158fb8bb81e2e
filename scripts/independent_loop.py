"""An independent training loop (issue 55, fidelity): the cpu shape of a perfsuite row written
with torch and transformers alone, no perfsuite code, to check that a launch measures what a
team's own training would. Run under torchrun; rank 0 prints one JSON line:
``{"row": ..., "samples_per_s": mean over measured steps of global batch / slowest rank's step}``,
the same definition as perfsuite's ``samples_per_s``.

    python -m torch.distributed.run --standalone --nproc-per-node 2 scripts/independent_loop.py ROW

ROW: ``mixed_precision.fp32`` (BertForPreTraining, 2 layers of 128, micro-batch 4, seq 128, fp32)
or ``model_state_sharding.ddp_amp`` (GPT-2, 8 layers of 64, micro-batch 32, seq 256, bf16 autocast).
The shapes are copied from bench_tests on purpose: reading them through perfsuite would make the
loop depend on what it checks."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import BertConfig, BertForPreTraining, GPT2Config, GPT2LMHeadModel

ROWS = {
    "mixed_precision.fp32": dict(micro=4, seq=128, warmup=3, steps=12, bf16=False),
    "model_state_sharding.ddp_amp": dict(micro=32, seq=256, warmup=1, steps=4, bf16=True),
}


def model(row: str) -> torch.nn.Module:
    if row == "mixed_precision.fp32":
        config = BertConfig(
            vocab_size=8192,
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=512,
            max_position_embeddings=128,
        )
        return BertForPreTraining(config)
    config = GPT2Config(
        vocab_size=512,
        n_embd=64,
        n_layer=8,
        n_head=2,
        n_positions=256,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def batch(row: str, micro: int, seq: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    if row == "mixed_precision.fp32":
        ids = torch.randint(0, 8192, (micro, seq), generator=gen)
        masked = torch.rand((micro, seq), generator=gen) < 0.15
        return {
            "input_ids": ids,
            "labels": torch.where(masked, ids, torch.full_like(ids, -100)),
            "next_sentence_label": torch.randint(0, 2, (micro,), generator=gen),
        }
    ids = torch.randint(0, 512, (micro, seq), generator=gen)
    return {"input_ids": ids, "labels": ids.clone()}


def main(row: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = ROWS[row]
    torch.manual_seed(0)
    ddp = DistributedDataParallel(model(row))
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    batches = [batch(row, shape["micro"], shape["seq"], rank * 1000 + i) for i in range(2)]
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if shape["bf16"] else contextlib.nullcontext
    times = []
    for step in range(shape["warmup"] + shape["steps"]):
        start = time.perf_counter()
        with autocast():
            loss = ddp(**batches[step % 2]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())
        times.append(time.perf_counter() - start)
    measured = torch.tensor(times[shape["warmup"] :], dtype=torch.float64)
    dist.all_reduce(measured, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
    global_batch = shape["micro"] * world
    if rank == 0:
        rates = global_batch / measured
        print(json.dumps({"row": row, "samples_per_s": float(rates.mean()), "std": float(rates.std())}))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
