"""A team's own engine configuration in a scenario (issue 38), checked at collection:
a whole DeepSpeed config (dict or JSON file), DDP's and FSDP2's own settings, the
optimizer and activation checkpointing of engines that build their own step (a factory
imported by the collection step's child interpreter), and torch.compile with every engine
that takes it. All torch-free: the pytest side."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import interpreter_path

from perfsuite import ModelSpec, Scenario, ScenarioError
from perfsuite.core.engines import ENGINES, ZeroOptions, deepspeed_config
from perfsuite.judge.definition import changes, definition
from perfsuite.plugin import collection

GPT = ModelSpec("megatron_gpt", layers=2, hidden=64, heads=2, vocab=512, max_positions=32)
SHAPE: dict[str, Any] = dict(world_size=2, micro_batch=4, global_batch=16, seq_len=32)

#: ZeRO-3 with bf16, overlap_comm and bucket sizes, as DeepSpeed's documentation shows it
#: (docs/_pages/config-json.md, "ZeRO optimizations"; batch keys as this scenario has them).
DOCUMENTED_ZERO3: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e5,
        "stage3_prefetch_bucket_size": 5e5,
        "stage3_param_persistence_threshold": 1e3,
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
    },
}


def zero(config: dict[str, Any], **fields: Any) -> Scenario:
    return Scenario(
        "ds",
        "team",
        GPT,
        strategy="deepspeed_zero",
        strategy_options={"config": config},
        **{**SHAPE, "precision": "bf16", **fields},
    )


def test_a_documented_deepspeed_config_is_accepted_and_gives_the_stage() -> None:
    scenario = zero(DOCUMENTED_ZERO3)
    options = scenario.engine_options
    assert isinstance(options, ZeroOptions) and options.stage == 3
    assert scenario.to_config()["strategy_options"]["config"]["zero_optimization"]["overlap_comm"] is True


def test_a_config_file_is_stored_as_its_content_not_its_path(tmp_path: Path) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(DOCUMENTED_ZERO3))
    scenario = zero(str(path))  # type: ignore[arg-type]
    stored = scenario.to_config()["strategy_options"]["config"]
    assert stored == json.loads(json.dumps(DOCUMENTED_ZERO3)) and str(path) not in json.dumps(scenario.to_config())
    path.write_text(json.dumps({**DOCUMENTED_ZERO3, "zero_optimization": {"stage": 2}}))
    edited = zero(str(path))  # type: ignore[arg-type]
    found = changes(definition(scenario.to_config()), definition(edited.to_config()))
    assert any(line.startswith("strategy_options.config.zero_optimization.stage 3 -> 2") for line in found)


def test_an_unreadable_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"field 'strategy_options' option 'config' names '.*missing.json'"):
        zero(str(tmp_path / "missing.json"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("train_micro_batch_size_per_gpu", 8, "micro_batch"),
        ("gradient_accumulation_steps", 1, "grad_accum"),
        ("train_batch_size", 64, "global_batch"),
    ],
)
def test_a_contradicting_batch_key_is_refused_naming_it(key: str, value: int, field: str) -> None:
    with pytest.raises(
        ScenarioError, match=rf"sets config key '{key}' to {value}, but the scenario's {field} makes it"
    ):
        zero({**DOCUMENTED_ZERO3, key: value})


def test_the_same_batch_values_and_auto_are_accepted() -> None:
    zero({**DOCUMENTED_ZERO3, "train_batch_size": 16, "gradient_accumulation_steps": "auto"})


def test_a_config_that_enables_another_precision_is_refused() -> None:
    with pytest.raises(ScenarioError, match=r"'bf16.enabled' to true, but the scenario's precision is 'fp32'"):
        zero(DOCUMENTED_ZERO3, precision="fp32")


def test_a_stage_given_twice_must_agree() -> None:
    with pytest.raises(ScenarioError, match=r"option 'stage' is 2 but its config's zero_optimization.stage is 3"):
        Scenario(
            "ds",
            "team",
            GPT,
            strategy="deepspeed_zero",
            precision="bf16",
            **SHAPE,
            strategy_options={"stage": 2, "config": DOCUMENTED_ZERO3},
        )


def test_fitting_to_fewer_ranks_rescales_the_configs_train_batch_size() -> None:
    scenario = zero({**DOCUMENTED_ZERO3, "train_batch_size": 16}, world_size=2)
    fitted = scenario.at_world_size(1)
    assert fitted.global_batch == 8 and fitted.strategy_options["config"]["train_batch_size"] == 8


def test_an_optimizer_op_this_machine_cannot_build_skips_naming_torch_adam(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("deepspeed")
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    deepspeed_config._op_problem.cache_clear()
    config = {**DOCUMENTED_ZERO3, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    reason = zero(config).precondition("cpu")
    assert "optimizer 'AdamW' needs DeepSpeed's FusedAdamBuilder op" in reason
    assert "no C++ compiler" in reason and '"torch_adam": true' in reason
    torch_adam = {**config, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    assert zero(torch_adam).precondition("cpu") is None
    deepspeed_config._op_problem.cache_clear()


def collected(scenario: Scenario, rank_path: str = "") -> Scenario:
    """``scenario`` once the collection step has checked it, the ranks' path being ``rank_path``
    (default: this interpreter's); raises the first problem the step reports."""
    problems = collection.problems([scenario], rank_path or interpreter_path())
    if problems:
        raise problems[0]
    return scenario


@pytest.mark.parametrize(
    ("strategy", "options", "message"),
    [
        ("ddp", {"bucket_cap_mb": 0}, "option 'bucket_cap_mb' must be > 0"),
        ("ddp", {"static_graph": True}, "static_graph with 2 micro-batches per step.*pytorch/pytorch#143580"),
        ("ddp", {"optimizer": "adam"}, "option 'optimizer' must be one of adamw, adamw_fused, sgd or a"),
        ("fsdp2", {"param_dtype": "fp8"}, "option 'param_dtype' must be one of fp32, bf16, fp16"),
        ("torch_zero", {"optimizer": "teampkg.opt:make"}, "wraps an optimizer class in its own sharded optimizer"),
        ("ddp", {"optimizer": "nosuchpkg.opt:make"}, "option 'optimizer' 'nosuchpkg.opt:make' cannot be imported"),
        (
            "deepspeed_zero",
            {"config": {"zero_optimization": {"stage": 1}}, "offload_optimizer": True},
            "with a 'config', set them there",
        ),
    ],
)
def test_bad_step_options_are_refused_naming_the_option(strategy: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        collected(Scenario("g", "n", GPT, strategy=strategy, strategy_options=options, **SHAPE))


def test_megatron_core_refuses_the_optimizer_option_with_its_reason() -> None:
    with pytest.raises(ScenarioError, match="refuses: megatron-core builds its own optimizer"):
        Scenario("g", "n", GPT, strategy="megatron_core", strategy_options={"optimizer": "sgd"}, **SHAPE)


def test_a_team_optimizer_factory_is_checked_by_importing_it(tmp_path: Path) -> None:
    (tmp_path / "teamopt.py").write_text(
        "def make(params, lr):\n    import torch\n    return torch.optim.SGD(params, lr)\n"
    )
    # On the ranks' path, as a team's package is (the collection step's child imports it from there).
    path = os.pathsep.join((str(tmp_path), interpreter_path()))
    collected(Scenario("g", "n", GPT, strategy="fsdp2", strategy_options={"optimizer": "teamopt:make"}, **SHAPE), path)
    with pytest.raises(ScenarioError, match="names no function: module 'teamopt' has no callable 'build'"):
        collected(
            Scenario("g", "n", GPT, strategy="fsdp2", strategy_options={"optimizer": "teamopt:build"}, **SHAPE), path
        )


def test_a_factory_only_a_variant_names_is_checked_in_that_variant() -> None:
    # The declared options take a named optimizer; the cpu variant's factory is refused naming the variant.
    bad = {"strategy_options": {"optimizer": "nosuchpkg.opt:make"}}
    scenario = Scenario("g", "n", GPT, strategy="ddp", variants={"cpu": bad}, **SHAPE)
    with pytest.raises(ScenarioError, match=r"'nosuchpkg.opt:make' cannot be imported.*\(in variants\['cpu'\]\)$"):
        collected(scenario)


def test_every_option_is_part_of_the_definition() -> None:
    plain = Scenario("g", "n", GPT, strategy="ddp", **SHAPE)
    tuned = Scenario("g", "n", GPT, strategy="ddp", strategy_options={"gradient_as_bucket_view": True}, **SHAPE)
    found = changes(definition(plain.to_config()), definition(tuned.to_config()))
    assert found == ["strategy_options.gradient_as_bucket_view (unset) -> True"]


@pytest.mark.parametrize("strategy", ["ddp", "torch_zero", "fsdp2", "deepspeed_zero", "tp_pp"])
def test_compile_composes_with_every_engine_that_takes_it(strategy: str) -> None:
    options = {"stage": 3} if strategy == "deepspeed_zero" else {}
    Scenario("g", "n", GPT, strategy=strategy, strategy_options=options, graph="compile", **SHAPE)


@pytest.mark.parametrize(
    ("strategy", "graph", "reason"),
    [
        ("fairscale_oss", "compile", "fairscale's wrappers predate torch.compile"),
        ("megatron_core", "compile", "megatron-core builds its own model"),
        ("fsdp2", "ort", "ORTModule's recipe wraps DDP alone"),
    ],
)
def test_an_engine_that_cannot_compile_is_refused_with_the_reason(strategy: str, graph: str, reason: str) -> None:
    with pytest.raises(
        ScenarioError,
        match=rf"field 'graph' '{graph}' does not compose with strategy '{strategy}': "
        rf"{reason}.*; engines that take it: ddp",
    ):
        Scenario("g", "n", GPT, strategy=strategy, graph=graph, **SHAPE)  # type: ignore[arg-type]


def test_every_engine_declares_the_graph_modes_it_takes() -> None:
    for engine in ENGINES:
        assert engine.graphs[0] == "eager" and (
            set(engine.graphs) == {"eager", "compile", "ort"} or engine.why_not_graph
        )


def _bench_scenarios() -> dict[str, Any]:
    """Every scenario of bench_tests/, by id (its modules import only the pytest side)."""
    import importlib.util

    found: dict[str, Any] = {}
    for path in sorted((Path(__file__).parents[1] / "bench_tests").glob("test_*.py")):
        spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found.update({scenario.id: scenario for scenario in getattr(module, "SCENARIOS", [])})
    return found


def test_every_committed_baseline_is_still_its_scenarios_definition() -> None:
    """New options, rows and defaults changed no seed row: each committed baseline's stored
    definition is what its scenario resolves to on that profile today (cpu and the GPU
    profiles alike; the gate only sees cpu's)."""
    scenarios = _bench_scenarios()
    checked = 0
    for path in sorted((Path(__file__).parents[1] / "baselines").glob("*/*.json")):
        profile = path.parent.name.split("@")[0]
        keys = (profile, "cpu" if profile == "cpu" else "cuda")
        for sid, entry in json.loads(path.read_text()).get("scenarios", {}).items():
            recorded = entry.get("definition") if isinstance(entry, dict) else None
            if not isinstance(recorded, dict) or sid not in scenarios:
                continue
            resolved = scenarios[sid].resolve(keys).fit(recorded["world_size"])
            assert changes(recorded, definition(resolved.to_config())) == [], f"{path.parent.name}/{sid}"
            checked += 1
    assert checked > 50


#: ZeRO-3 as transformers' DeepSpeed integration documents it for the Trainer: "auto" throughout,
#: the optimizer and the parameters offloaded.
TRAINER_ZERO3: dict[str, Any] = {
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def test_a_trainer_config_is_accepted_and_other_auto_keys_are_refused_naming_each() -> None:
    # The keys transformers' Trainer fills, the ranks fill the same way (through its own class).
    assert isinstance(zero(TRAINER_ZERO3).engine_options, ZeroOptions)
    unknown = {**TRAINER_ZERO3, "activation_checkpointing": {"number_checkpoints": "auto"}}
    with pytest.raises(ScenarioError, match=r'"auto" for activation_checkpointing.number_checkpoints: transformers'):
        zero(unknown)


def test_without_transformers_every_auto_key_is_refused_at_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(ScenarioError) as refused:
        zero(TRAINER_ZERO3)
    message = str(refused.value)
    named = [
        "optimizer.params.lr (the Trainer uses TrainingArguments.learning_rate)",
        "optimizer.params.betas",
        "optimizer.params.eps",
        "optimizer.params.weight_decay",
        "scheduler.params.warmup_min_lr",
        "scheduler.params.warmup_max_lr",
        "scheduler.params.warmup_num_steps",
        "gradient_clipping (the Trainer uses max_grad_norm)",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold",
        "accelerate is not installed",
    ]
    assert all(key in message for key in named), message
    # What perfsuite fills from the scenario is not named: the batch keys and the precision sections.
    assert "train_batch_size" not in message and "bf16.enabled" not in message and "fp16" not in message


def test_a_trainer_config_with_its_values_given_is_accepted() -> None:
    given = json.loads(json.dumps(TRAINER_ZERO3))
    given["optimizer"]["params"] = {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    given["scheduler"]["params"] = {"warmup_min_lr": 0, "warmup_max_lr": 1e-4, "warmup_num_steps": 0}
    given["gradient_clipping"] = 1.0
    given["zero_optimization"].update(
        reduce_bucket_size=4096, stage3_prefetch_bucket_size=3686, stage3_param_persistence_threshold=640
    )
    assert isinstance(zero(given).engine_options, ZeroOptions)
