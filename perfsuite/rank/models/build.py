"""Rank side: build a family's model and its synthetic training batches."""

from __future__ import annotations

import torch
from torch import nn

from perfsuite.core.models import CLASSIFICATION_LABELS, FAMILIES, NEXT_SENTENCE_LABELS, ModelSpec
from perfsuite.core.protocol import import_object

MLM_PROBABILITY = 0.15  # BERT pre-training masks 15% of tokens
IGNORE_INDEX = -100


def build_model(spec: ModelSpec) -> nn.Module:
    """The family's model with random weights, on torch's default device (the CPU unless a caller
    builds under ``with torch.device(...)``: see :mod:`perfsuite.rank.models.materialise`)."""
    model: nn.Module = import_object(FAMILIES[spec.family].builder)(spec)
    return model


def synthetic_batch(
    spec: ModelSpec, seq_len: int, device: torch.device, rows: int, seed: int
) -> dict[str, torch.Tensor]:
    """``rows`` sequences of random tokens with the family's training labels
    (``mlm_nsp`` also gives each row a ``next_sentence_label``: the model's loss
    is then the sum of both, as in BERT's pre-training)."""
    gen = torch.Generator().manual_seed(seed)
    if spec.objective == "image_classification":
        return {name: tensor.to(device) for name, tensor in images(spec, rows, gen).items()}
    shape = (rows, seq_len)
    input_ids = torch.randint(0, spec.vocab, shape, generator=gen)
    extra: dict[str, torch.Tensor] = {}
    if spec.objective in ("mlm", "mlm_nsp"):
        # Masked-LM: predict 15% of positions, ignore the rest.
        masked = torch.rand(shape, generator=gen) < MLM_PROBABILITY
        labels = torch.where(masked, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
        if spec.objective == "mlm_nsp":  # is the second segment the next one: one label per row
            extra["next_sentence_label"] = torch.randint(0, NEXT_SENTENCE_LABELS, (rows,), generator=gen)
    elif spec.objective == "classification":
        labels = torch.randint(0, CLASSIFICATION_LABELS, (rows,), generator=gen)  # one class per row
    else:
        labels = input_ids.clone()  # causal LM: the model shifts labels itself
    batch = {"input_ids": input_ids, "labels": labels, **extra}
    return {name: tensor.to(device) for name, tensor in batch.items()}


def training_batch(
    model: nn.Module, spec: ModelSpec, seq_len: int, device: torch.device, rows: int, seed: int
) -> dict[str, torch.Tensor]:
    """One micro-batch for ``model``: a recipe's own (family ``module``), else synthetic."""
    if spec.family == "module":
        from perfsuite.rank.models.module import recipe_batch

        return {name: tensor.to(device) for name, tensor in recipe_batch(model, seq_len, rows, seed).items()}
    return synthetic_batch(spec, seq_len, device, rows, seed)


def transformer_blocks(model: nn.Module) -> nn.ModuleList:
    """The repeated blocks: the ModuleList holding the most parameters
    (GPT-2: ``transformer.h``, BERT: ``bert.encoder.layer``), which sharding
    engines wrap one by one; empty for a model without one."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:  # your own module without repeated blocks: the engine shards it as one unit
        return nn.ModuleList()
    return max(lists, key=lambda blocks: sum(p.numel() for p in blocks.parameters()))


def images(spec: ModelSpec, rows: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random images of the config's size (``image_size``, ``num_channels``; transformers' ViT
    defaults 224 and 3) with one class per row. ``seq_len`` plays no part: the patches are the tokens."""
    size, channels = int(spec.config.get("image_size", 224)), int(spec.config.get("num_channels", 3))
    return {
        "pixel_values": torch.randn((rows, channels, size, size), generator=gen),
        "labels": torch.randint(0, CLASSIFICATION_LABELS, (rows,), generator=gen),
    }
