from __future__ import annotations

import re

import pytest

from perfsuite import ModelSpec, Scenario, ScenarioError, parametrize

TINY = ModelSpec("bert", layers=1, hidden=32, heads=2, vocab=512, max_positions=64)


def make(**overrides: object) -> Scenario:
    fields = dict(group="g", name="n", model=TINY, world_size=2, micro_batch=2, global_batch=4, seq_len=16)
    fields.update(overrides)
    return Scenario(**fields)  # type: ignore[arg-type]


def test_id_is_group_dot_name_and_survives_resolution() -> None:
    scenario = make(variants={"cpu": {"micro_batch": 1, "global_batch": 2}})
    resolved = scenario.resolve(("cpu-x", "cpu"))
    assert scenario.id == resolved.id == "g.n"
    assert resolved.micro_batch == 1 and resolved.variants == {}


def test_profile_name_beats_device_kind() -> None:
    scenario = make(variants={"cpu": {"steps": 4}, "special": {"steps": 7}})
    assert scenario.resolve(("special", "cpu")).steps == 7
    assert scenario.resolve(("other", "cpu")).steps == 4
    assert scenario.resolve(("other", "cuda")).steps == 10


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"micro_batch": 0}, "micro_batch"),
        ({"global_batch": 5}, "global_batch"),
        ({"precision": "fp8"}, "precision"),
        ({"strategy": "no_such_engine"}, "strategy"),
        ({"seq_len": 1000}, "seq_len"),
        ({"steps": 1}, "steps"),
        ({"tolerances": {"samples_per_s": 1.5}}, "tolerances"),
        ({"tolerances": {"latency": 0.1}}, "tolerances"),
        ({"expect": {"cpu": "maybe"}}, "expect"),
        ({"name": "Bad Name"}, "name"),
        ({"variants": {"cpu": {"colour": 1}}}, "variants['cpu']"),
        ({"variants": {"cpu": {"global_batch": 3}}}, "global_batch"),
        ({"only_on": "cpu"}, "only_on"),  # read letter by letter, it would skip everywhere
        ({"only_on": ("cuda", "")}, "only_on"),
    ],
)
def test_bad_field_is_named(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ScenarioError, match=f"field '{field}'" if "[" not in field else "variants"):
        make(**overrides)


def test_model_heads_must_divide_hidden() -> None:
    with pytest.raises(ScenarioError, match="field 'heads'"):
        ModelSpec("bert", layers=1, hidden=30, heads=4)


@pytest.mark.parametrize(
    ("family", "dropout", "message"),
    [
        ("gpt2", 1.0, "field 'dropout' must be a probability in [0, 1) or None, got 1.0"),
        ("gpt2", True, "field 'dropout' must be a probability"),
        ("megatron_gpt", 0.1, "field 'dropout' must be None or 0: family megatron_gpt has no dropout to set"),
    ],
)
def test_a_bad_dropout_is_refused_naming_the_field(family: str, dropout: object, message: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(message)):
        ModelSpec(family, layers=2, hidden=32, heads=2, dropout=dropout)  # type: ignore[arg-type]


def test_a_family_without_dropout_accepts_zero() -> None:
    assert ModelSpec("megatron_gpt", layers=2, hidden=32, heads=2, dropout=0).dropout == 0


def test_grad_accum_and_config() -> None:
    scenario = make(global_batch=8)
    assert scenario.grad_accum == 2
    config = scenario.to_config()
    assert config["grad_accum"] == 2 and config["model"]["hidden"] == 32


def test_expected_outcome_lookup() -> None:
    scenario = make(expect={"cpu": "oom"})
    assert scenario.expected_outcome(("cpu",)) == "oom"
    assert scenario.expected_outcome(("h100", "cuda")) == "ok"


def test_parametrize_rejects_duplicate_ids() -> None:
    with pytest.raises(ScenarioError, match="duplicate"):
        parametrize([make(), make()])


def test_spec_is_frozen() -> None:
    scenario = make(strategy="deepspeed_zero", strategy_options={"stage": 1})
    with pytest.raises(AttributeError):
        scenario.steps = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        scenario.strategy_options["stage"] = 2  # type: ignore[index]


GPT = ModelSpec("megatron_gpt", layers=4, hidden=64, heads=4, vocab=512, max_positions=64)


@pytest.mark.parametrize(
    ("options", "world", "message"),
    [
        ({"tp": 3}, 4, "tp=3 x pp=1 = 3 does not divide world_size=4"),
        ({"pp": 3, "schedule": "gpipe"}, 3, "4 layers do not split evenly into 3 pipeline stages"),
        ({"pp": 2}, 2, "1f1b needs microbatches (1) >= pp (2)"),
        ({"tp": 2, "pp": 2, "schedule": "zigzag"}, 4, "option 'schedule': must be one of"),
        ({"pp": 2, "schedule": "interleaved_1f1b", "microbatches": 2}, 2, "virtual_stages >= 2"),
    ],
)
def test_bad_parallel_layout_is_refused_with_a_readable_error(options: dict, world: int, message: str) -> None:
    with pytest.raises(ScenarioError, match="field 'strategy_options'") as info:
        Scenario(
            "g",
            "n",
            GPT,
            strategy="tp_pp",
            strategy_options=options,
            world_size=world,
            micro_batch=1,
            global_batch=world,
            seq_len=16,
        )
    assert message in str(info.value)


def test_layout_derives_dp_and_checks_pipeline_batch() -> None:
    ok = Scenario(
        "g",
        "n",
        GPT,
        strategy="tp_pp",
        strategy_options={"tp": 2, "pp": 2, "microbatches": 4},
        world_size=8,
        micro_batch=1,
        global_batch=8,
        seq_len=16,
    )
    assert (ok.layout.dp, ok.layout.tp, ok.layout.pp, ok.grad_accum) == (2, 2, 2, 4)
    with pytest.raises(ScenarioError, match="micro_batch x microbatches x dp"):
        Scenario(
            "g",
            "n",
            GPT,
            strategy="tp_pp",
            strategy_options={"pp": 2, "microbatches": 4},
            world_size=2,
            micro_batch=1,
            global_batch=2,
            seq_len=16,
        )


def test_bubble_fraction_formulas() -> None:
    from perfsuite.core.layout import ParallelLayout

    assert ParallelLayout(dp=1, pp=4, microbatches=8, schedule="gpipe").bubble_fraction() == pytest.approx(3 / 11)
    assert ParallelLayout(
        dp=1, pp=4, microbatches=8, schedule="interleaved_1f1b", virtual_stages=2
    ).bubble_fraction() == pytest.approx(3 / 19)


def test_world_sizes_keep_the_work_per_rank_and_fit_the_hardware() -> None:
    scenario = make(world_size=4, world_sizes=(2, 1), micro_batch=2, global_batch=16)
    assert (scenario.fit(8).world_size, scenario.fit(4).world_size) == (4, 4)
    two, one = scenario.fit(3), scenario.fit(1)
    assert (two.world_size, two.global_batch, two.grad_accum) == (2, 8, 2)
    assert (one.world_size, one.global_batch, one.grad_accum) == (1, 4, 2)
    assert one.id == scenario.id and scenario.fit(0) is scenario


def test_a_world_size_the_layout_cannot_take_is_refused() -> None:
    with pytest.raises(ScenarioError, match=r"field 'world_sizes'.*2 is not a multiple of tp x pp = 4"):
        Scenario(
            "g",
            "n",
            GPT,
            strategy="tp_pp",
            strategy_options={"tp": 2, "pp": 2, "microbatches": 2},
            world_size=4,
            world_sizes=(2,),
            micro_batch=1,
            global_batch=2,
            seq_len=16,
        )
