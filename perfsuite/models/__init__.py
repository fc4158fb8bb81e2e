"""Model families: which transformer a scenario trains, built on the ranks from a
config with random weights (nothing is downloaded).

This ``__init__`` is torch-free, because scenarios (in the pytest process)
declare and validate a :class:`ModelSpec`. The builders live beside it and
import torch: :mod:`perfsuite.models.build` (entry point and synthetic
batches), :mod:`perfsuite.models.hf` (transformers' BERT with a masked-LM head, with
the pre-training heads, or with a sequence-classification head, and GPT-2) and
:mod:`perfsuite.models.megatron_gpt` (a GPT of plain ``nn.Linear`` layers that
tensor and pipeline parallelism can split).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from perfsuite.validation import check_choice, check_int, fail

Objective = Literal["mlm", "mlm_nsp", "causal_lm", "classification"]
#: Classes of the ``classification`` objective's synthetic labels (binary, like GLUE's MRPC or SST-2).
CLASSIFICATION_LABELS = 2
#: Classes of next-sentence prediction (is next / random), fixed by BERT's pre-training head.
NEXT_SENTENCE_LABELS = 2


@dataclass(frozen=True)
class ModelFamily:
    """One family a :class:`ModelSpec` can name."""

    name: str
    """The value of ``ModelSpec.family``."""
    builder: str
    """``module:function`` that builds the ``nn.Module`` from a ModelSpec (rank side)."""
    objective: Objective
    """Training labels of its synthetic batches: masked-LM (15% of tokens), masked-LM
    plus a next-sentence label per row (BERT pre-training), next-token, or one
    class per row (sequence classification)."""
    description: str = ""
    has_dropout: bool = False
    """Whether its builder applies ``ModelSpec.dropout`` (False: only None or 0 is accepted)."""


FAMILIES: Mapping[str, ModelFamily] = MappingProxyType(
    {
        f.name: f
        for f in (
            ModelFamily("bert", "perfsuite.models.hf:bert", "mlm", "transformers BertForMaskedLM", has_dropout=True),
            ModelFamily(
                "bert_pretraining",
                "perfsuite.models.hf:bert_pretraining",
                "mlm_nsp",
                "transformers BertForPreTraining (masked-LM and next-sentence heads: BERT's pre-training)",
                has_dropout=True,
            ),
            ModelFamily(
                "bert_cls",
                "perfsuite.models.hf:bert_cls",
                "classification",
                "transformers BertForSequenceClassification (fine-tuning)",
                has_dropout=True,
            ),
            ModelFamily(
                "gpt2", "perfsuite.models.hf:gpt2", "causal_lm", "transformers GPT2LMHeadModel", has_dropout=True
            ),
            ModelFamily(
                "megatron_gpt",
                "perfsuite.models.megatron_gpt:build",
                "causal_lm",
                "Megatron-style GPT of nn.Linear layers, splittable into pipeline stages",
            ),
        )
    }
)


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a transformer built from a config with random weights."""

    family: str
    """A key of :data:`FAMILIES`."""
    layers: int
    hidden: int
    heads: int
    vocab: int = 30522
    ffn: int | None = None
    """MLP width; defaults to 4 x hidden, as in BERT and GPT."""
    max_positions: int = 512
    dropout: float | None = None
    """Probability of every dropout layer (hidden states, embeddings, attention
    probabilities); None keeps the family's default (0.1 in transformers' BERT
    and GPT-2). Families whose builder has no dropout to set (perfsuite's
    megatron_gpt) accept only None or 0."""

    def __post_init__(self) -> None:
        owner = f"model {self.family}"
        check_choice(owner, "family", self.family, FAMILIES)
        for name in ("layers", "hidden", "heads", "vocab", "max_positions"):
            check_int(owner, name, getattr(self, name), 1)
        if self.ffn is not None:
            check_int(owner, "ffn", self.ffn, 1)
        if self.hidden % self.heads:
            raise fail(owner, "heads", f"must divide hidden={self.hidden}, got {self.heads}")
        self._check_dropout(owner)

    def _check_dropout(self, owner: str) -> None:
        p = self.dropout
        if p is None:
            return
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
            raise fail(owner, "dropout", f"must be a probability in [0, 1) or None, got {p!r}")
        if p and not FAMILIES[self.family].has_dropout:
            raise fail(owner, "dropout", f"must be None or 0: family {self.family} has no dropout to set, got {p!r}")

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def objective(self) -> Objective:
        return FAMILIES[self.family].objective


__all__ = ["CLASSIFICATION_LABELS", "FAMILIES", "NEXT_SENTENCE_LABELS", "ModelFamily", "ModelSpec"]
