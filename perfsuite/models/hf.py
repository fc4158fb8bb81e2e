"""transformers models built from configs with random weights (the model's own
``_init_weights``); nothing is downloaded."""

from __future__ import annotations

from torch import nn

from perfsuite.models import ModelSpec


def bert(m: ModelSpec) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=m.vocab,
        hidden_size=m.hidden,
        num_hidden_layers=m.layers,
        num_attention_heads=m.heads,
        intermediate_size=m.ffn_size,
        max_position_embeddings=m.max_positions,
    )
    return BertForMaskedLM(config)


def gpt2(m: ModelSpec) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=m.vocab,
        n_embd=m.hidden,
        n_layer=m.layers,
        n_head=m.heads,
        n_inner=m.ffn,
        n_positions=m.max_positions,
    )
    return GPT2LMHeadModel(config)
