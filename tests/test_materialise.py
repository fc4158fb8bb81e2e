"""Models built where they will live (issue 38): on the meta device, then given storage and
the model's own initialisation (perfsuite.rank.models.materialise). Rank side, one process."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from perfsuite.core.models import ModelSpec
from perfsuite.rank.models.materialise import ModelFactory, init_weights
from perfsuite.rank.models.megatron_gpt import INIT_STD, MegatronGPT

GPT_1_3B = ModelSpec("gpt2", layers=24, hidden=2048, heads=32, vocab=50304, max_positions=1024)
TINY_GPT2 = ModelSpec("gpt2", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)
TINY_BERT = ModelSpec("bert_pretraining", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)


def test_a_meta_build_counts_tied_weights_once() -> None:
    pytest.importorskip("transformers")
    assert ModelFactory(GPT_1_3B).numel() == 1_313_722_368  # the seed's count, with tied embeddings


def test_a_materialised_transformers_model_is_initialised_and_stays_tied() -> None:
    pytest.importorskip("transformers")
    factory = ModelFactory(TINY_GPT2)
    model = factory.on_meta("meta, then sharded")
    assert all(p.is_meta for p in model.parameters()) and factory.how == "meta, then sharded"
    factory.materialise(model, torch.device("cpu"))
    lm_head, wte = model.lm_head.weight, model.transformer.wte.weight  # type: ignore[union-attr]
    assert lm_head is wte, "to_empty unties the head; materialise ties it again"
    assert abs(float(model.transformer.h[0].mlp.c_fc.weight.std()) - 0.02) < 0.005  # type: ignore[index,union-attr]
    assert torch.equal(model.transformer.ln_f.weight, torch.ones(64))  # type: ignore[union-attr]
    batch = {"input_ids": torch.randint(0, 512, (2, 8)), "labels": torch.randint(0, 512, (2, 8))}
    assert math.isfinite(float(model(**batch).loss))


def test_buffers_a_meta_build_left_empty_are_filled() -> None:
    pytest.importorskip("transformers")
    factory = ModelFactory(TINY_BERT)
    model = factory.on_meta("meta, then sharded")
    factory.materialise(model, torch.device("cpu"))
    positions = model.bert.embeddings.position_ids  # type: ignore[union-attr]
    assert torch.equal(positions, torch.arange(32).expand((1, -1)))


def test_a_pipeline_stage_is_initialised_as_a_slice_of_the_whole() -> None:
    with torch.device("meta"):
        model = MegatronGPT(vocab=256, hidden=64, layers=8, heads=2, ffn=256, max_positions=32)
    stage = model.stage(1, 2)
    ModelFactory(ModelSpec("megatron_gpt", layers=8, hidden=64, heads=2, vocab=256)).materialise(
        stage, torch.device("cpu")
    )
    projections = torch.cat([b.attn.out.weight.flatten() for b in stage.blocks])  # type: ignore[union-attr]
    assert abs(float(projections.std()) - INIT_STD / math.sqrt(2 * 8)) < 0.001  # the whole model's 8 layers
    assert model.embed.tokens.weight.is_meta, "another stage's embedding never gets storage"  # type: ignore[union-attr]


def test_a_recipes_own_initialisation_runs_else_torchs_defaults() -> None:
    from perfsuite.rank.models.module import Recipe, RecipeModel

    def batch(rows: int, seq_len: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(rows, seq_len, 4, generator=gen)}

    own = RecipeModel(Recipe(nn.Linear(4, 4, device="meta"), batch, init_weights=lambda m: nn.init.ones_(m.weight)))
    default = RecipeModel(Recipe(nn.Linear(4, 4, device="meta"), batch))
    for model in (own, default):
        model.to_empty(device="cpu")
        init_weights(model)
    assert torch.equal(own.module.weight, torch.ones(4, 4))
    assert not torch.equal(default.module.weight, torch.ones(4, 4)) and float(default.module.weight.abs().max()) <= 0.5
