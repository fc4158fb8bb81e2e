"""Model builders: what a ModelSpec says reaches the built model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from perfsuite import ModelSpec
from perfsuite.core.models import FAMILIES, NEXT_SENTENCE_LABELS
from perfsuite.rank.models.build import IGNORE_INDEX, build_model, synthetic_batch

# Attention dropout is an argument of a functional call under SDPA, so it is
# read from the config; a new family with dropout needs its entry here.
ATTENTION_DROPOUT = {
    "bert": "attention_probs_dropout_prob",
    "bert_pretraining": "attention_probs_dropout_prob",
    "bert_cls": "attention_probs_dropout_prob",
    "gpt2": "attn_pdrop",
}


@pytest.mark.parametrize("family", sorted(name for name, f in FAMILIES.items() if f.has_dropout))
def test_dropout_reaches_every_dropout_layer_of_the_built_model(family: str) -> None:
    def probabilities(dropout: float | None) -> set[float]:
        spec = ModelSpec(family, layers=1, hidden=32, heads=2, vocab=64, max_positions=16, dropout=dropout)
        model = build_model(spec)
        attention = getattr(model.config, ATTENTION_DROPOUT[family])
        return {m.p for m in model.modules() if isinstance(m, nn.Dropout)} | {attention}

    assert probabilities(None) == {0.1}  # the family's default
    assert probabilities(0.0) == {0.0}


# Seed A1's BERT-base (bench_tests/test_mixed_precision.py declares the same shape).
A1: dict[str, int] = dict(layers=12, hidden=768, heads=12, vocab=30522, max_positions=512)


@pytest.mark.parametrize(
    ("family", "params"),
    [
        ("bert_pretraining", 110_106_428),  # seed A1's count: both pre-training heads
        ("bert", 109_514_298),  # masked-LM head only: no pooler (h*h + h), no next-sentence classifier (2h + 2)
    ],
)
def test_bert_base_has_the_seeds_parameter_count(family: str, params: int) -> None:
    with torch.device("meta"):  # shapes only: no 440 MB of fp32 weights
        model = build_model(ModelSpec(family, **A1))
    assert all(p.is_meta for p in model.parameters())
    # parameters() counts the decoder weight, tied to the word embeddings, once.
    assert sum(p.numel() for p in model.parameters()) == params


def test_the_a1_scenarios_train_the_pretraining_model_at_the_seed_shape() -> None:
    from bench_tests.test_mixed_precision import SCENARIOS

    for scenario in SCENARIOS:
        assert scenario.model == ModelSpec("bert_pretraining", **A1)
        assert scenario.resolve(("cpu",)).model.family == "bert_pretraining"  # type: ignore[attr-defined]


def test_pretraining_batches_carry_both_labels_and_the_loss_sums_both_heads() -> None:
    spec = ModelSpec("bert_pretraining", layers=1, hidden=32, heads=2, vocab=64, max_positions=16, dropout=0.0)
    batch = synthetic_batch(spec, 16, torch.device("cpu"), rows=4, seed=0)
    assert set(batch) == {"input_ids", "labels", "next_sentence_label"}
    assert batch["next_sentence_label"].shape == (4,)
    assert 0 <= int(batch["next_sentence_label"].min()) <= int(batch["next_sentence_label"].max()) < 2
    # The masked-LM labels are drawn as the bert family's: the same rows for the same seed.
    mlm = synthetic_batch(
        ModelSpec("bert", layers=1, hidden=32, heads=2, vocab=64, max_positions=16),
        16,
        torch.device("cpu"),
        rows=4,
        seed=0,
    )
    assert torch.equal(batch["input_ids"], mlm["input_ids"]) and torch.equal(batch["labels"], mlm["labels"])
    assert set(mlm) == {"input_ids", "labels"}

    torch.manual_seed(0)
    model = build_model(spec)
    out = model(**batch)
    lm = nn.functional.cross_entropy(
        out.prediction_logits.view(-1, 64), batch["labels"].view(-1), ignore_index=IGNORE_INDEX
    )
    nsp = nn.functional.cross_entropy(
        out.seq_relationship_logits.view(-1, NEXT_SENTENCE_LABELS), batch["next_sentence_label"]
    )
    assert torch.allclose(out.loss, lm + nsp)
