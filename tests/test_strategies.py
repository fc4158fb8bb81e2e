"""The strategy interface (perfsuite.rank.strategies.base) in one process: each engine's options
class declared once by its generic base and read one way, and ``build`` a final template around
each engine's ``place``. The engines themselves train in bench_tests/ (cpu profile)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from perfsuite.core.engines import (  # noqa: E402
    ENGINES,
    DDPOptions,
    EngineOptions,
    EngineSpec,
    StepOptions,
    ZeroOptions,
)
from perfsuite.core.engines.base import OPTIMIZERS, NoOptions  # noqa: E402
from perfsuite.core.layout import ParallelLayout  # noqa: E402
from perfsuite.core.models import ModelSpec  # noqa: E402
from perfsuite.rank.models.materialise import ModelFactory  # noqa: E402
from perfsuite.rank.strategies.base import StrategyContext, TorchStrategy, load_strategy  # noqa: E402
from perfsuite.rank.strategies.ddp import DDPStrategy  # noqa: E402
from perfsuite.rank.strategies.deepspeed_zero import DS_OPTIMIZERS, DeepSpeedZeroStrategy, ds_optimizer  # noqa: E402

TINY = ModelSpec("megatron_gpt", layers=1, hidden=32, heads=2, vocab=64, max_positions=16)


def context(options: EngineOptions) -> StrategyContext:
    return StrategyContext(
        device=torch.device("cpu"),
        rank=0,
        world_size=1,
        precision="fp32",
        lr=1e-3,
        grad_accum=1,
        options=options,
        layout=ParallelLayout(dp=1),
    )


@pytest.mark.parametrize("spec", list(ENGINES), ids=lambda spec: spec.name)
def test_each_engine_declares_the_options_class_of_its_spec(spec: EngineSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # what importing megatron_core sets
    assert load_strategy(spec.implementation).options_type is spec.options


def test_a_subclass_keeps_its_parents_options_and_a_bare_torch_strategy_takes_step_options() -> None:
    class Team(DDPStrategy):
        pass

    class Bare(TorchStrategy):
        pass

    assert Team.options_type is DDPOptions and Bare.options_type is StepOptions


def test_options_of_another_class_keep_the_fields_both_have_and_defaults_for_the_rest() -> None:
    assert DDPStrategy(context(NoOptions())).options == DDPOptions()  # a user engine named by its path
    options = DDPStrategy(context(StepOptions(optimizer="sgd", activation_checkpointing=True))).options
    assert options == DDPOptions(optimizer="sgd", activation_checkpointing=True)
    own = DDPOptions(static_graph=True)
    assert DDPStrategy(context(own)).options is own


def test_options_that_cannot_be_made_from_another_class_are_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"takes ZeroOptions options and cannot make them from NoOptions: .*'stage'"):
        DeepSpeedZeroStrategy(context(NoOptions()))


class Recorder(DDPStrategy):
    """A strategy that says where it placed the model."""

    def place(self, factory: ModelFactory) -> nn.Module:
        return factory.on_meta("engine's own")


def test_build_keeps_the_factory_and_places_the_model_where_the_strategy_says() -> None:
    strategy = Recorder(context(DDPOptions()))
    with pytest.raises(RuntimeError, match="needs its model from build"):
        _ = strategy.factory
    factory = ModelFactory(TINY)
    model = strategy.build(factory)
    assert strategy.factory is factory and factory.how == "engine's own"
    assert all(p.is_meta for p in model.parameters())


def test_deepspeed_builds_every_named_optimizer_itself() -> None:
    assert set(DS_OPTIMIZERS) == set(OPTIMIZERS)
    assert ds_optimizer("sgd", 0.5) == {"type": "SGD", "params": {"lr": 0.5}}
    assert ds_optimizer("teampkg.optim:make", 0.5) is None  # the team's factory: a client optimizer


def test_a_named_optimizer_deepspeed_has_no_config_for_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(DS_OPTIMIZERS, "sgd")
    with pytest.raises(RuntimeError, match="'sgd' is a named optimizer, but DS_OPTIMIZERS has no DeepSpeed config"):
        ds_optimizer("sgd", 0.5)


def test_zero_options_stay_typed_on_the_strategy() -> None:
    options = ZeroOptions(stage=2)
    strategy = DeepSpeedZeroStrategy(context(options))
    assert strategy.options is options and strategy.config is None
