"""Model builders: what a ModelSpec says reaches the built model."""

from __future__ import annotations

import pytest
from torch import nn

from perfsuite import ModelSpec
from perfsuite.models import FAMILIES
from perfsuite.models.build import build_model

# Attention dropout is an argument of a functional call under SDPA, so it is
# read from the config; a new family with dropout needs its entry here.
ATTENTION_DROPOUT = {
    "bert": "attention_probs_dropout_prob",
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
