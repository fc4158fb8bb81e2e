"""transformers models built from configs with random weights (the model's own
``_init_weights``); nothing is downloaded."""

from __future__ import annotations

from typing import Any

from torch import nn

from perfsuite.core.models import CLASSIFICATION_LABELS, HF_TASKS, ModelSpec


def _bert_config(m: ModelSpec, **extra: Any) -> Any:
    from transformers import BertConfig

    fields = {
        "vocab_size": m.vocab,
        "hidden_size": m.hidden,
        "num_hidden_layers": m.layers,
        "num_attention_heads": m.heads,
        "intermediate_size": m.ffn_size,
        "max_position_embeddings": m.max_positions,
        **_dropout(m, "hidden_dropout_prob", "attention_probs_dropout_prob"),
        **extra,
    }
    return BertConfig(**{**fields, **m.config})  # the spec's config fields win over the family's


def _dropout(m: ModelSpec, *names: str) -> dict[str, float]:
    """The config's dropout fields set to ``m.dropout``; none when it is None (the family's default)."""
    return {} if m.dropout is None else dict.fromkeys(names, float(m.dropout))


def bert(m: ModelSpec) -> nn.Module:
    from transformers import BertForMaskedLM

    return BertForMaskedLM(_bert_config(m))


def bert_pretraining(m: ModelSpec) -> nn.Module:
    """BERT with both pre-training heads: the masked-LM head (its decoder tied
    to the word embeddings) and the pooler with the next-sentence classifier.
    BERT-base's shape has 110,106,428 parameters (BertForMaskedLM: 109,514,298)."""
    from transformers import BertForPreTraining

    return BertForPreTraining(_bert_config(m))


def bert_cls(m: ModelSpec) -> nn.Module:
    """BERT with a sequence-classification head (transformers 4.44 to 5.x).

    ``problem_type`` is set up front: the model otherwise infers it during its
    first call, a change that makes torch.compile recompile on step 2. Attention
    is transformers' eager implementation (the seed's), in every row alike:
    ORTModule 1.19 cannot build the gradient of SDPA with attention dropout
    (``GradientBuilderBase::O ... OutputDefs().size()``). A spec's
    ``config={"attn_implementation": "sdpa"}`` overrides it (the best-practice rows)."""
    from transformers import BertForSequenceClassification

    config = _bert_config(
        m, num_labels=CLASSIFICATION_LABELS, problem_type="single_label_classification", attn_implementation="eager"
    )
    return BertForSequenceClassification(config)


def gpt2(m: ModelSpec) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    fields = {
        "vocab_size": m.vocab,
        "n_embd": m.hidden,
        "n_layer": m.layers,
        "n_head": m.heads,
        "n_inner": m.ffn,
        "n_positions": m.max_positions,
        **_dropout(m, "resid_pdrop", "embd_pdrop", "attn_pdrop"),
    }
    return GPT2LMHeadModel(GPT2Config(**{**fields, **m.config}))


def auto(m: ModelSpec) -> nn.Module:
    """Any transformers architecture (``ModelSpec.hf``): its config from the model type and the
    spec's fields, the task's head on top, random weights."""
    import transformers

    config = transformers.AutoConfig.for_model(m.source, **m.hf_config())
    if m.task == "classification" and config.pad_token_id is None:
        # Decoder-only types (llama, qwen2, gpt2) define no pad token, and their classification
        # head finds each row's last token by it: without one, a batch over 1 row fails.
        config.pad_token_id = 0
    auto_class = getattr(transformers, HF_TASKS[m.task or "causal_lm"])
    model: nn.Module = auto_class.from_config(config)
    return model
