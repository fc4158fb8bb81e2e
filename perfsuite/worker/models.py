"""Models built from transformers configs with random weights, and synthetic batches.

Nothing is downloaded: configs are constructed in code and weights initialised
by the model's own ``_init_weights``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

MLM_PROBABILITY = 0.15  # BERT pre-training masks 15% of tokens
IGNORE_INDEX = -100


def build_model(spec: Mapping[str, Any]) -> nn.Module:
    family = spec["model"]["family"]
    builder = _BUILDERS.get(family)
    if builder is None:
        raise ValueError(f"unknown model family {family!r}")
    return builder(spec["model"])


def _bert(m: Mapping[str, Any]) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=m["vocab"],
        hidden_size=m["hidden"],
        num_hidden_layers=m["layers"],
        num_attention_heads=m["heads"],
        intermediate_size=m["ffn"] or 4 * m["hidden"],
        max_position_embeddings=m["max_positions"],
    )
    return BertForMaskedLM(config)


def _gpt2(m: Mapping[str, Any]) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=m["vocab"],
        n_embd=m["hidden"],
        n_layer=m["layers"],
        n_head=m["heads"],
        n_inner=m["ffn"],
        n_positions=m["max_positions"],
    )
    return GPT2LMHeadModel(config)


def _megatron_gpt(m: Mapping[str, Any]) -> nn.Module:
    from perfsuite.worker.megatron_gpt import build

    return build(m)


_BUILDERS = {"bert": _bert, "gpt2": _gpt2, "megatron_gpt": _megatron_gpt}


def synthetic_batch(
    spec: Mapping[str, Any], device: torch.device, rows: int, seed: int
) -> dict[str, torch.Tensor]:
    """``rows`` sequences of random tokens with the family's training labels."""
    m = spec["model"]
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, spec["seq_len"])
    input_ids = torch.randint(0, m["vocab"], shape, generator=gen)
    if m["family"] == "bert":
        # Masked-LM: predict 15% of positions, ignore the rest.
        masked = torch.rand(shape, generator=gen) < MLM_PROBABILITY
        labels = torch.where(masked, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    else:
        labels = input_ids.clone()  # causal LM: the model shifts labels itself
    return {"input_ids": input_ids.to(device), "labels": labels.to(device)}
