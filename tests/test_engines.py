"""Engine specs: options validated at collection, impossible scenarios refused or
skipped before anything launches (issue: engine specs importable without torch)."""

from __future__ import annotations

import pytest

from perfsuite import ModelSpec, Scenario, ScenarioError
from perfsuite.core.engines import ENGINES, EngineSpec, MissingPackage, OptionError, ZeroOptions, engine_spec
from perfsuite.launch.fingerprint import tracked_packages

GPT = ModelSpec("megatron_gpt", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)
MODULE = """
from perfsuite import ModelSpec, Scenario, parametrize

GPT = ModelSpec("megatron_gpt", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)

@parametrize([Scenario("g", "n", GPT, strategy={strategy!r}, strategy_options={options!r},
                       world_size=2, micro_batch=1, global_batch=2, seq_len=16)])
def test_bench(perf, scenario):
    perf.check(scenario)
"""


@pytest.mark.parametrize(
    ("strategy", "options", "message"),
    [
        (
            "deepspeed_zero",
            {"stag": 2},
            "*field 'strategy_options' has unknown option 'stag' for engine 'deepspeed_zero'; "
            "valid options: optimizer, activation_checkpointing, stage, offload_optimizer, param_persistence_threshold, config*",
        ),
        (
            "tp_pp",
            {"shedule": "gpipe"},
            "*field 'strategy_options' has unknown option 'shedule' for engine 'tp_pp'; valid options: tp, pp, schedule,*",
        ),
        (
            "ddp",
            {"tp": 2},
            "*field 'strategy_options' sets tp=2, but engine 'ddp' implements dp parallelism only; "
            "engines with tp parallelism: tp_pp, megatron_core*",
        ),
    ],
)
def test_bad_engine_options_fail_collection(
    pytester: pytest.Pytester, strategy: str, options: dict[str, object], message: str
) -> None:
    pytester.makepyfile(test_bench=MODULE.format(strategy=strategy, options=options))
    result = pytester.runpytest_subprocess("--collect-only", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])


def make(strategy: str, options: dict[str, object], model: ModelSpec = GPT, world: int = 2) -> Scenario:
    return Scenario(
        "g",
        "n",
        model,
        strategy=strategy,
        strategy_options=options,
        world_size=world,
        micro_batch=1,
        global_batch=world,
        seq_len=16,
    )


@pytest.mark.parametrize(
    ("strategy", "options", "model", "field", "message"),
    [
        ("deepspeed_zero", {}, GPT, "strategy_options", "lacks required option 'stage'"),
        ("deepspeed_zero", {"stage": True}, GPT, "strategy_options", "option 'stage': expected int, got True"),
        ("deepspeed_zero", {"stage": 4}, GPT, "strategy_options", "'stage' must be one of 0, 1, 2, 3"),
        ("deepspeed_zero", {"stage": 2, "param_persistence_threshold": 0}, GPT, "strategy_options", "stage 3 only"),
        ("fairscale_sdp", {"reduce_buffer_size": -1}, GPT, "strategy_options", "must be >= 0"),
        (
            "megatron_core",
            {"pp": 2, "schedule": "gpipe", "microbatches": 2},
            GPT,
            "strategy_options",
            "schedule 'gpipe', which engine 'megatron_core' does not have",
        ),
        (
            "tp_pp",
            {},
            ModelSpec("gpt2", 2, 64, 2, 512, 32),
            "model",
            "family 'gpt2' cannot be trained by engine 'tp_pp'",
        ),
        ("warp_drive", {}, GPT, "strategy", "neither a registered engine"),
        ("no_such_pkg.mod:Cls", {}, GPT, "strategy", "importable 'package.module:Class' path"),
    ],
)
def test_impossible_scenarios_are_refused_naming_the_field(
    strategy: str, options: dict[str, object], model: ModelSpec, field: str, message: str
) -> None:
    with pytest.raises(ScenarioError, match=f"field '{field}'") as info:
        make(strategy, options, model)
    assert message in str(info.value)


def test_options_reach_the_ranks_typed() -> None:
    scenario = make("deepspeed_zero", {"stage": 3, "param_persistence_threshold": 0})
    spec = scenario.rank_spec()
    assert spec.engine_options() == ZeroOptions(stage=3, param_persistence_threshold=0)
    assert spec.implementation == "perfsuite.rank.strategies.deepspeed_zero:DeepSpeedZeroStrategy"


def test_cuda_only_and_missing_engines_say_why_before_launch() -> None:
    assert "fairscale FSDP needs CUDA" in engine_spec("fairscale_fsdp").unavailable("cpu")
    assert "megatron-core's tensor/pipeline-parallel layers" in engine_spec("megatron_core").unavailable("cpu")
    phantom = EngineSpec("phantom", "phantom_engine:Strategy", extra="phantom", requires=("phantom_engine_pkg",))
    assert phantom.unavailable("cpu") == (
        "phantom_engine_pkg is not installed; install it with: pip install 'perfsuite[phantom]'"
    )
    assert engine_spec("ddp").unavailable("cpu") is None
    # The same decision as data: what is missing and the extra that installs it (the message is built on it).
    assert phantom.missing_package("cpu") == MissingPackage("phantom_engine_pkg", "phantom")
    assert phantom.missing_package("cpu").describe() == phantom.unavailable("cpu")  # type: ignore[union-attr]
    assert engine_spec("megatron_core").missing_package("cpu") is None, "the device rules it out first"
    assert engine_spec("ddp").missing_package("cpu") is None


def test_every_builtin_engine_names_an_implementation_module_and_its_packages_are_tracked() -> None:
    import importlib.util

    for spec in ENGINES:
        module = spec.implementation.split(":")[0]
        assert importlib.util.find_spec(module) is not None, spec.name
    assert {"deepspeed", "fairscale", "megatron-core", "torch"} <= set(tracked_packages())


def test_option_error_lists_the_valid_options() -> None:
    with pytest.raises(
        OptionError,
        match="valid options: optimizer, activation_checkpointing, stage, offload_optimizer, param_persistence_threshold, config",
    ):
        ZeroOptions.parse("deepspeed_zero", {"stage": 1, "offload": True})
