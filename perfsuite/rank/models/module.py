"""Your own ``nn.Module`` as a scenario's model (``ModelSpec.module``): the protocol a team's
build function follows, and the adapter that lets every engine train it like perfsuite's own
models. Rank side (imports torch).

A build function takes the device and the parameters' dtype, and the options the spec
gives, and returns a :class:`Recipe`::

    def build(device: torch.device, dtype: torch.dtype, hidden: int = 256) -> Recipe:
        model = MyNet(hidden).to(device=device, dtype=dtype)

        def batch(rows: int, seq_len: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
            x = torch.randn(rows, seq_len, hidden, generator=gen)
            return {"x": x, "target": torch.randn(rows, seq_len, hidden, generator=gen)}

        return Recipe(model, batch, loss=lambda out, b: F.mse_loss(out, b["target"]), inputs=("x",))

perfsuite calls ``build`` once per rank with fp32 and the device the engine builds on: the
rank's own (data-parallel engines), or ``meta`` when the engine shards the model before it
has storage (FSDP2: it then gives each rank's shard storage and runs ``Recipe.init_weights``,
or each submodule's ``reset_parameters``). An engine casts for mixed precision itself. At
collection it also calls ``build`` in a child interpreter on the ``meta`` device, so that a
wrong import path or return type fails before any launch: a build function must work there
(no data-dependent code at construction). The batches are made on the CPU with a seeded
generator and moved to the device.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from perfsuite.core.models import ModelSpec
from perfsuite.core.protocol import import_object

Batch = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Recipe:
    """What a build function returns."""

    model: nn.Module
    """The model, on the device and dtype it was asked for."""
    batch: Callable[[int, int, torch.Generator], Batch]
    """``batch(rows, seq_len, generator)``: one micro-batch of CPU tensors, by name."""
    loss: Callable[[Any, Batch], torch.Tensor] | None = None
    """``loss(output, batch)``: the scalar to minimise. None: ``output.loss`` (a transformers
    model's output), or the output itself when it is a scalar tensor."""
    inputs: Sequence[str] | None = None
    """The batch entries passed to the model as keyword arguments; None: all of them."""
    init_weights: Callable[[nn.Module], None] | None = None
    """``init_weights(model)``: the model's initialisation, run (under ``torch.no_grad``) on each
    rank's part when an engine built it on the ``meta`` device and gave it storage (FSDP2).
    None: each submodule's ``reset_parameters``, torch's default."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise TypeError(f"Recipe.model must be a torch.nn.Module, got {type(self.model).__name__}")
        for name in ("batch", "loss", "init_weights"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"Recipe.{name} must be callable, got {type(value).__name__}")


class RecipeModel(nn.Module):
    """A recipe's model behind perfsuite's model interface: ``model(**batch).loss``, which every
    engine calls. ``step`` (the spec's) replaces the forward and the loss when given."""

    def __init__(self, recipe: Recipe, step: Callable[[nn.Module, Batch], torch.Tensor] | None = None) -> None:
        super().__init__()
        self.module = recipe.model
        self.recipe = recipe
        self._step = step

    def init_weights(self) -> None:
        """The recipe's initialisation of storage an engine gave a meta-built model."""
        from perfsuite.rank.models.materialise import reset_parameters

        if self.recipe.init_weights is not None:
            self.recipe.init_weights(self.module)
        else:
            reset_parameters(self.module)

    def forward(self, **batch: torch.Tensor) -> SimpleNamespace:
        if self._step is not None:
            return SimpleNamespace(loss=self._step(self.module, batch))
        names = self.recipe.inputs
        output = self.module(**(batch if names is None else {name: batch[name] for name in names}))
        if self.recipe.loss is not None:
            return SimpleNamespace(loss=self.recipe.loss(output, batch))
        loss = getattr(output, "loss", output)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(
                f"{type(self.module).__name__}'s output has no scalar loss: give the Recipe a loss(output, batch)"
            )
        return SimpleNamespace(loss=loss)


def make_recipe(spec: ModelSpec, device: torch.device, dtype: torch.dtype = torch.float32) -> Recipe:
    """The spec's build function called, its result checked."""
    recipe = import_object(str(spec.source))(device, dtype, **spec.config)
    if not isinstance(recipe, Recipe):
        raise TypeError(
            f"{spec.source} must return a perfsuite.rank.models.module.Recipe, returned {type(recipe).__name__}"
        )
    return recipe


def build(spec: ModelSpec) -> nn.Module:
    """The family's builder (``FAMILIES["module"]``): the recipe behind the adapter, on the device the
    engine builds on (torch's default device: the rank's, or ``meta``)."""
    step = import_object(spec.step) if spec.step else None
    return RecipeModel(make_recipe(spec, torch.get_default_device()), step)


def recipe_batch(model: nn.Module, seq_len: int, rows: int, seed: int) -> Batch:
    """One micro-batch from the recipe behind ``model`` (a :class:`RecipeModel`)."""
    if not isinstance(model, RecipeModel):
        raise TypeError(f"a module-family model is a RecipeModel, got {type(model).__name__}")
    return model.recipe.batch(rows, seq_len, torch.Generator().manual_seed(seed))


def check_build(source: str, step: str, options: str) -> dict[str, str]:
    """Import, build on meta, check the type: what :mod:`perfsuite.core.models.probe` asks a child
    interpreter (``{}`` when all is well, else the field at fault and the problem)."""

    def resolve(name: str, path: str) -> Any:
        module, _, function = path.partition(":")
        try:
            found = importlib.import_module(module)
        except Exception as exc:
            raise LookupError(name, f"cannot be imported: {type(exc).__name__}: {exc}") from None
        if not callable(getattr(found, function, None)):
            raise LookupError(name, f"names no function: module {module!r} has no callable {function!r}")
        return getattr(found, function)

    try:
        build = resolve("source", source)
        if step:
            resolve("step", step)
    except LookupError as exc:
        return {"field": exc.args[0], "problem": exc.args[1]}
    try:
        recipe = build(torch.device("meta"), torch.float32, **json.loads(options))
    except Exception as exc:
        return {"field": "source", "problem": f"failed to build on the meta device: {type(exc).__name__}: {exc}"}
    if not isinstance(recipe, Recipe):
        return {
            "field": "source",
            "problem": f"must return a perfsuite.rank.models.module.Recipe, returned {type(recipe).__name__}",
        }
    return {}


if __name__ == "__main__":
    # Run as a script this file is ``__main__``, whose Recipe is not the one a team's module imports.
    from perfsuite.rank.models.module import check_build as _check_build

    print(json.dumps(_check_build(*sys.argv[1:4])))
