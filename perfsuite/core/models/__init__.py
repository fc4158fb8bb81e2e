"""Model families: which transformer a scenario trains, built on the ranks from a
config with random weights (nothing is downloaded). Besides perfsuite's own
families, :meth:`ModelSpec.hf` names any transformers architecture by its model
type (or a local ``config.json``) and a task.

This ``__init__`` is torch-free, because scenarios (in the pytest process)
declare and validate a :class:`ModelSpec`. The builders live beside it and
import torch: :mod:`perfsuite.rank.models.build` (entry point and synthetic
batches), :mod:`perfsuite.rank.models.hf` (transformers' BERT with a masked-LM head, with
the pre-training heads, or with a sequence-classification head, and GPT-2) and
:mod:`perfsuite.rank.models.megatron_gpt` (a GPT of plain ``nn.Linear`` layers that
tensor and pipeline parallelism can split).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from perfsuite.core.models.probe import build_problem, hf_attribute_map, hf_model_types, reference_problem
from perfsuite.core.validation import ScenarioError, check_choice, check_int, fail

Objective = Literal["mlm", "mlm_nsp", "causal_lm", "classification", "image_classification", "custom"]
#: The tasks :meth:`ModelSpec.hf` accepts: the transformers auto class that puts the head on.
HF_TASKS: Mapping[str, str] = MappingProxyType(
    {
        "causal_lm": "AutoModelForCausalLM",
        "mlm": "AutoModelForMaskedLM",
        "classification": "AutoModelForSequenceClassification",
        "image_classification": "AutoModelForImageClassification",
    }
)
#: perfsuite's shape fields as the config keys transformers' configs share (``attribute_map``
#: maps them for architectures that name them otherwise, e.g. GPT-2's ``n_embd``).
HF_SHAPE_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "layers": "num_hidden_layers",
        "hidden": "hidden_size",
        "heads": "num_attention_heads",
        "vocab": "vocab_size",
        "ffn": "intermediate_size",
        "max_positions": "max_position_embeddings",
    }
)
#: perfsuite's families built from a transformers config (``ModelSpec.config`` overrides its fields).
TRANSFORMERS_FAMILIES = ("bert", "bert_pretraining", "bert_cls", "gpt2")
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
    formula: bool = True
    """Whether perfsuite.judge.flops' analytic FLOP formula fits it (False: the ranks count its FLOPs)."""
    imports: tuple[str, ...] = ()
    """Modules its builder imports (transformers' model classes: 3.7 s of a cpu launch's 4.7 s build)."""


def hf_classes(model_type: str) -> str:
    """The module of transformers' classes for ``model_type`` (its ``models/<type>/modeling_<type>.py``)."""
    name = model_type.replace("-", "_")
    return f"transformers.models.{name}.modeling_{name}"


BERT_CLASSES = hf_classes("bert")

FAMILIES: Mapping[str, ModelFamily] = MappingProxyType(
    {
        f.name: f
        for f in (
            ModelFamily(
                "bert",
                "perfsuite.rank.models.hf:bert",
                "mlm",
                "transformers BertForMaskedLM",
                has_dropout=True,
                imports=(BERT_CLASSES,),
            ),
            ModelFamily(
                "bert_pretraining",
                "perfsuite.rank.models.hf:bert_pretraining",
                "mlm_nsp",
                "transformers BertForPreTraining (masked-LM and next-sentence heads: BERT's pre-training)",
                has_dropout=True,
                imports=(BERT_CLASSES,),
            ),
            ModelFamily(
                "bert_cls",
                "perfsuite.rank.models.hf:bert_cls",
                "classification",
                "transformers BertForSequenceClassification (fine-tuning)",
                has_dropout=True,
                imports=(BERT_CLASSES,),
            ),
            ModelFamily(
                "gpt2",
                "perfsuite.rank.models.hf:gpt2",
                "causal_lm",
                "transformers GPT2LMHeadModel",
                has_dropout=True,
                imports=(hf_classes("gpt2"),),
            ),
            ModelFamily(
                "megatron_gpt",
                "perfsuite.rank.models.megatron_gpt:build",
                "causal_lm",
                "Megatron-style GPT of nn.Linear layers, splittable into pipeline stages",
            ),
            # The objective of an ``hf`` model is its spec's task.
            ModelFamily(
                "hf",
                "perfsuite.rank.models.hf:auto",
                "causal_lm",
                "any transformers architecture (ModelSpec.hf)",
                formula=False,
            ),
            # Its objective is the recipe's loss.
            ModelFamily(
                "module",
                "perfsuite.rank.models.module:build",
                "custom",
                "your own nn.Module and batches (ModelSpec.module, perfsuite.rank.models.module.Recipe)",
                formula=False,
            ),
        )
    }
)


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a transformer built from a config with random weights."""

    family: str
    """A key of :data:`FAMILIES`."""
    layers: int = 0
    """Blocks; this and ``hidden`` and ``heads`` are required by every family but ``module``."""
    hidden: int = 0
    heads: int = 0
    vocab: int = 30522
    ffn: int | None = None
    """MLP width; defaults to 4 x hidden, as in BERT and GPT."""
    max_positions: int = 512
    dropout: float | None = None
    """Probability of every dropout layer (hidden states, embeddings, attention
    probabilities); None keeps the family's default (0.1 in transformers' BERT
    and GPT-2). Families whose builder has no dropout to set (perfsuite's
    megatron_gpt) accept only None or 0."""
    source: str | None = None
    """Family ``hf`` only: the transformers model type (``"llama"``)."""
    task: Objective | None = None
    """Family ``hf`` only: a key of :data:`HF_TASKS`."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """Family ``hf``: further config fields (``num_key_value_heads``, ``image_size``...); perfsuite's
    transformers families (bert, bert_pretraining, bert_cls, gpt2): config fields over the family's
    own (``{"activation_function": "gelu_pytorch_tanh", "attn_implementation": "sdpa"}``); family
    ``module``: the keyword arguments of its build function. Plain JSON."""
    step: str | None = None
    """Family ``module`` only: ``module:function`` computing one micro-batch's loss from the model
    and the batch, when ``model(**batch)`` and the recipe's ``loss`` do not describe the step."""

    @classmethod
    def module(cls, build: str, *, step: str | None = None, **options: Any) -> ModelSpec:
        """Your own ``nn.Module``: ``build`` is ``"package.module:function"``, called on every rank as
        ``function(device, dtype, **options)`` and returning a :class:`perfsuite.rank.models.module.Recipe`
        (the model, a batch maker, how to get the loss). ``step`` optionally names a function
        ``step(model, batch) -> loss`` to time instead of perfsuite's forward. Checked at
        collection (:meth:`probe`) by a child interpreter that imports both and builds on the meta device."""
        return cls("module", source=build, task="custom", config=options, step=step)

    @classmethod
    def hf(cls, model: str, task: Objective = "causal_lm", **fields: Any) -> ModelSpec:
        """Any transformers architecture, built offline from its config with random weights.

        ``model`` is a model type (``"llama"``, ``"qwen2"``, ``"vit"``: transformers'
        ``AutoConfig.for_model``) or the path of a local ``config.json``, whose fields
        are taken as they are. ``fields`` are perfsuite's shape fields (``layers``,
        ``hidden``, ``heads``, ``vocab``, ``ffn``, ``max_positions``), required unless
        the file gives them, then any further config field. A Hub name
        (``"meta-llama/Llama-3.2-1B"``) is refused: it would need the network.
        """
        config: dict[str, Any] = {}
        stored: Mapping[str, str] = {}
        if model.endswith(".json"):
            model, config = _config_file(model)
            stored = _stored_keys(model)
        shape = {name: fields.pop(name, config.pop(stored.get(key, key), None)) for name, key in HF_SHAPE_KEYS.items()}
        for name in ("vocab", "ffn", "max_positions"):  # the dataclass's own defaults where neither gave one
            if shape[name] is None:
                del shape[name]
        missing = [name for name in ("layers", "hidden", "heads") if shape[name] is None]
        if missing:
            raise fail(f"model {model}", missing[0], "must be given (a shape field of ModelSpec.hf)")
        return cls("hf", **shape, source=model, task=task, config={**config, **fields})

    def __hash__(self) -> int:  # ``config`` is a dict
        return hash(json.dumps(asdict(self), sort_keys=True, default=str))

    def __post_init__(self) -> None:
        owner = f"model {self.family}"
        check_choice(owner, "family", self.family, FAMILIES)
        if self.family == "module":
            self._check_module()
            return
        self._check_hf(owner)
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
    def imports(self) -> tuple[str, ...]:
        """Modules its builder imports (an ``hf`` model: its ``source``'s transformers classes)."""
        if self.family == "hf" and self.source:
            return (hf_classes(self.source),)
        return FAMILIES[self.family].imports

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    def _check_module(self) -> None:
        owner = f"model {self.source}"
        for name in ("layers", "hidden", "heads", "ffn", "dropout"):
            if getattr(self, name):
                raise fail(owner, name, "is not a field of your own module's spec: give it to your build function")
        self._check_config_json(owner)
        problem = reference_problem(self.source, self.step)
        if problem:
            raise fail(owner, *problem)

    def probe(self, rank_path: str) -> ScenarioError | None:
        """What a child interpreter finds wrong with this model (None: nothing): a ``module`` reference
        that a child on ``rank_path`` (the ranks' PYTHONPATH) cannot build on the meta device, an
        ``hf`` model type or task this transformers lacks. The collection step asks
        (:mod:`perfsuite.plugin.collection`), never construction: a rank decodes the same spec."""
        owner = f"model {self.source}"
        if self.family == "module":
            problem = build_problem(str(self.source), self.step, self.config, rank_path)
            return fail(owner, *problem) if problem else None
        if self.family == "hf":
            return _transformers_problem(owner, str(self.source), str(self.task))
        return None

    def _check_config_json(self, owner: str) -> None:
        try:
            json.dumps(self.config, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise fail(owner, "config", f"must be plain JSON (it crosses to the ranks): {exc}") from None

    def _check_hf(self, owner: str) -> None:
        if self.family != "hf":
            for name in ("source", "task", "step"):
                if getattr(self, name):
                    raise fail(owner, name, "is for family 'hf' only (ModelSpec.hf)")
            if self.config and self.family not in TRANSFORMERS_FAMILIES:
                raise fail(
                    owner,
                    "config",
                    f"is for transformers' families only ({', '.join(TRANSFORMERS_FAMILIES)}, "
                    "hf); family megatron_gpt is perfsuite's own",
                )
            self._check_config_json(owner)
            return
        owner = f"model {self.source}"
        if not isinstance(self.source, str) or not self.source:
            raise fail(owner, "source", f"must name a transformers model type, got {self.source!r}")
        if "/" in self.source:
            raise fail(
                owner,
                "source",
                f"names the Hub model {self.source!r}, which would need the network: perfsuite "
                "builds models offline, from a model type with config fields or a local config.json",
            )
        check_choice(owner, "task", self.task, HF_TASKS)
        self._check_config_json(owner)

    @property
    def objective(self) -> Objective:
        if self.family == "hf" and self.task is not None:
            return self.task
        return FAMILIES[self.family].objective

    def hf_config(self) -> dict[str, Any]:
        """Family ``hf``: the keyword arguments of ``AutoConfig.for_model`` besides the model type."""
        shape = {key: getattr(self, name) for name, key in HF_SHAPE_KEYS.items() if name != "ffn"}
        labels = (
            {"num_labels": CLASSIFICATION_LABELS} if self.task in ("classification", "image_classification") else {}
        )
        return {**shape, HF_SHAPE_KEYS["ffn"]: self.ffn_size, **labels, **self.config}


def hf_tasks_by_type() -> Mapping[str, tuple[str, ...]]:
    """Each model type this transformers knows, with the tasks of :data:`HF_TASKS` it has a model
    for, in that table's order (asked of a child once; empty when transformers is missing)."""
    return hf_model_types(tuple(HF_TASKS.items()))


def _transformers_problem(owner: str, model_type: str, task: str) -> ScenarioError | None:
    """The model type and the task against this transformers (asked of a child once; None when it
    takes them or transformers is missing)."""
    known = hf_tasks_by_type()
    if not known:
        return None
    if model_type not in known:
        return fail(
            owner,
            "source",
            f"is no transformers model type here (transformers knows {len(known)}, "
            "e.g. llama, qwen2, mistral, vit); a Hub model's own type is its config.json's model_type",
        )
    if task not in known[model_type]:
        takes = ", ".join(known[model_type]) or f"none of {', '.join(HF_TASKS)}"
        return fail(
            owner,
            "task",
            f"{task!r} has no {model_type} model in transformers ({HF_TASKS[task]} lacks "
            f"it); {model_type} takes: {takes}",
        )
    return None


def _stored_keys(model_type: str) -> Mapping[str, str]:
    """The keys a ``model_type`` config.json stores the shape under (GPT-2: ``n_layer``...), as its
    config class maps them: what :meth:`ModelSpec.hf` builds the spec from, so asked of transformers
    when a scenario file calls it (a rank decodes the finished spec and never calls it)."""
    found = hf_attribute_map(model_type)
    if found is None:
        raise fail(
            f"model {model_type}",
            "source",
            "could not be read: the child interpreter asking transformers "
            "for this type's config keys failed (is the machine short of memory or time?)",
        )
    return found


def _config_file(path: str) -> tuple[str, dict[str, Any]]:
    """A local ``config.json``: its model type and its other fields."""
    owner = f"model {path}"
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise fail(owner, "source", f"cannot be read as a config.json: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise fail(owner, "source", "has no 'model_type': is it a transformers config.json?")
    # Fields transformers writes that are no architecture (and would pin a version or a dtype).
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        data.pop(key, None)
    return data.pop("model_type"), data


__all__ = ["CLASSIFICATION_LABELS", "FAMILIES", "HF_TASKS", "NEXT_SENTENCE_LABELS", "ModelFamily", "ModelSpec"]
