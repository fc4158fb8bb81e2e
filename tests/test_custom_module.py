"""A team's own ``nn.Module`` as a scenario's model (issue 29): ``ModelSpec.module`` names a build
function by import path, collection refuses what cannot be built (naming the field: construction
checks the form, the collection step builds it in a child interpreter), and a repo
perfsuite has never seen records baselines of its module under DDP and ZeRO-2 (bf16) on cpu, with
its own step. (The example repo, tests/test_init.py, trains a module under DDP and FSDP2 and catches
a planted slowdown.)"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import interpreter_path, record_team, require

from perfsuite.core.models import ModelSpec
from perfsuite.core.protocol import COUNTED_FLOPS
from perfsuite.core.validation import ScenarioError
from perfsuite.plugin import collection

#: A team's package: blocks in a ModuleList (FSDP2 shards them one by one), a regression loss,
#: and a custom step that runs the model twice (a consistency loss).
TEAM_MODELS = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perfsuite.rank.models.module import Recipe


    class Net(nn.Module):
        def __init__(self, width, depth):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                                      nn.Linear(4 * width, width)) for _ in range(depth))

        def forward(self, x):
            for block in self.blocks:
                x = x + block(x)
            return x


    def build(device, dtype, width=32, depth=2):
        model = Net(width, depth).to(device=device, dtype=dtype)

        def batch(rows, seq_len, gen):
            return {"x": torch.randn(rows, seq_len, width, generator=gen),
                    "target": torch.randn(rows, seq_len, width, generator=gen)}

        return Recipe(model, batch, loss=lambda out, b: F.mse_loss(out, b["target"]), inputs=("x",))


    def twice(model, batch):
        return F.mse_loss(model(batch["x"]), batch["target"]) + model(batch["x"]).pow(2).mean()


    def not_a_recipe(device, dtype):
        return Net(8, 1)
    """
)


@pytest.fixture
def team_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """teampkg importable here and, for the collection check's child, on the ranks' path (:func:`checked`)."""
    (tmp_path / "teampkg").mkdir()
    (tmp_path / "teampkg" / "__init__.py").write_text("")
    (tmp_path / "teampkg" / "models.py").write_text(TEAM_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path


def checked(spec: ModelSpec, team: Path) -> ModelSpec:
    """``spec`` once the collection step's child has built it, with ``team``'s package on the ranks'
    path; raises the problem the step reports."""
    error = spec.probe(os.pathsep.join((str(team), interpreter_path())))
    if error is not None:
        raise error
    return spec


def test_a_module_reference_is_checked_by_building_it_on_meta(team_package: Path) -> None:
    spec = checked(ModelSpec.module("teampkg.models:build", step="teampkg.models:twice", width=16), team_package)
    assert (spec.family, spec.source, spec.step, spec.config, spec.objective) == (
        "module",
        "teampkg.models:build",
        "teampkg.models:twice",
        {"width": 16},
        "custom",
    )


@pytest.mark.parametrize(
    ("source", "options", "field", "words"),
    [
        ("teampkg.models.build", {}, "source", "must be 'package.module:function'"),
        ("teampkg.nowhere:build", {}, "source", "cannot be imported: ModuleNotFoundError"),
        ("teampkg.models:biuld", {}, "source", "names no function: module 'teampkg.models' has no callable 'biuld'"),
        (
            "teampkg.models:not_a_recipe",
            {},
            "source",
            "must return a perfsuite.rank.models.module.Recipe, returned Net",
        ),
        ("teampkg.models:build", {"widht": 8}, "source", "failed to build on the meta device: TypeError"),
    ],
)
def test_a_bad_module_reference_fails_naming_the_field(
    team_package: Path, source: str, options: dict, field: str, words: str
) -> None:
    with pytest.raises(ScenarioError, match=f"field '{field}' {words}"):
        checked(ModelSpec.module(source, **options), team_package)


def test_a_module_beside_the_tests_that_the_ranks_cannot_import_fails_collection(pytester: pytest.Pytester) -> None:
    # pytest prepends bench_tests/ to its own path, so it imports my_model; the ranks get the
    # rootdir and the invocation folder only, and would fail on every rank after collection passed.
    pytester.makeini("[pytest]")
    pytester.mkdir("bench_tests")
    (pytester.path / "bench_tests" / "my_model.py").write_text(TEAM_MODELS)
    (pytester.path / "bench_tests" / "test_team.py").write_text(
        "from perfsuite import ModelSpec, Scenario, parametrize\n"
        "MINE = Scenario('team', 'mine', ModelSpec.module('my_model:build'), world_size=1, micro_batch=2,"
        " global_batch=2, seq_len=8)\n"
        "@parametrize([MINE])\ndef test_team(perf, scenario):\n    perf.check(scenario)\n"
    )
    collected = pytester.runpytest_subprocess("bench_tests", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert collected.ret != 0
    collected.stdout.fnmatch_lines(["*field 'source' cannot be imported: ModuleNotFoundError*my_model*"])


def test_a_bad_step_reference_names_the_step(team_package: Path) -> None:
    with pytest.raises(ScenarioError, match="field 'step' names no function"):
        checked(ModelSpec.module("teampkg.models:build", step="teampkg.models:thrice"), team_package)


def test_shape_fields_belong_to_the_build_function(team_package: Path) -> None:
    with pytest.raises(ScenarioError, match="field 'layers' is not a field of your own module's spec"):
        ModelSpec("module", layers=2, source="teampkg.models:build", task="custom")


TEAM_BENCH = """
from perfsuite import ModelSpec, Scenario, parametrize

NET = ModelSpec.module("teampkg.models:build", width=32, depth=2)
TWICE = ModelSpec.module("teampkg.models:build", step="teampkg.models:twice", width=32, depth=2)
SHAPE = dict(world_size=2, micro_batch=4, global_batch=8, seq_len=16, warmup_steps=1, steps=4)
SCENARIOS = [
    Scenario("team", "net_ddp", NET, strategy="ddp", **SHAPE),
    Scenario("team", "net_twice_ddp", TWICE, strategy="ddp", **SHAPE),
    Scenario("team", "net_zero2_bf16", NET, strategy="deepspeed_zero", strategy_options={"stage": 2},
             precision="bf16", **SHAPE),
]

@parametrize(SCENARIOS)
def test_team(perf, scenario):
    perf.check(scenario)
"""


def test_a_team_module_trains_under_ddp_and_zero2_and_its_own_step_counts_its_flops(pytester: pytest.Pytester) -> None:
    require("deepspeed")
    pytester.mkpydir("teampkg")
    (pytester.path / "teampkg" / "models.py").write_text(TEAM_MODELS)
    results = record_team(pytester, TEAM_BENCH, passed=3)
    state = {k.split(".")[1]: r["metrics"]["model_state_bytes_per_rank"] for k, r in results.items()}
    assert state["net_zero2_bf16"] < state["net_ddp"]  # sharded
    # The step that runs the model twice counts twice the forward FLOPs of the plain one.
    flops = {k.split(".")[1]: r["metrics"]["detail"][COUNTED_FLOPS] for k, r in results.items()}
    assert flops["net_twice_ddp"] > 1.2 * flops["net_ddp"]


def test_tensor_and_pipeline_engines_refuse_a_module_at_collection(team_package: Path) -> None:
    from perfsuite import Scenario

    spec = ModelSpec.module("teampkg.models:build")
    with pytest.raises(ScenarioError, match="family 'module' cannot be trained by engine 'tp_pp'"):
        Scenario("team", "tp", spec, strategy="tp_pp", world_size=2, micro_batch=2, global_batch=4, seq_len=16)


def test_a_rank_decodes_its_job_without_building_in_a_child_interpreter(team_package: Path, tmp_path: Path) -> None:
    # The pytest process checked the reference at collection; the rank builds it anyway, so decoding
    # its job must not pay another child interpreter (3-4 s a rank). A reference the rank cannot
    # import decodes, and fails where the rank builds it.
    from perfsuite import Scenario
    from perfsuite.core.protocol import RankJob

    scenario = Scenario(
        "team", "x", ModelSpec.module("teampkg.models:build"), world_size=2, micro_batch=2, global_batch=4, seq_len=16
    )
    doc = RankJob(spec=scenario.rank_spec(), device="cpu", reports_dir=str(tmp_path)).to_json()
    doc["spec"]["model"]["source"] = "teampkg.gone:build"
    decoded = RankJob.from_json(doc)
    assert decoded.spec.model.source == "teampkg.gone:build"  # type: ignore[attr-defined]
    with pytest.raises(ScenarioError, match="cannot be imported"):  # the collection step checks the same spec
        checked(ModelSpec.module("teampkg.gone:build"), team_package)


def test_construction_checks_the_form_and_the_collection_step_the_build(team_package: Path) -> None:
    # A scenario file's values start no child (a rank decodes the same ones): the step does, with the
    # ranks' path as its argument, and finds each problem once however many scenarios share the model.
    from perfsuite import Scenario

    gone = ModelSpec.module("teampkg.gone:build")
    shape: dict[str, Any] = dict(world_size=1, micro_batch=2, global_batch=2, seq_len=16)
    scenarios = [Scenario("team", "a", gone, **shape), Scenario("team", "b", gone, **shape)]
    path = os.pathsep.join((str(team_package), interpreter_path()))
    assert [str(e) for e in collection.problems(scenarios, path)] == [
        "scenario 'model teampkg.gone:build': field 'source' cannot be imported: ModuleNotFoundError: "
        f"No module named 'teampkg.gone' (the ranks import it with PYTHONPATH={path}: put its package under "
        "the rootdir, beside the root conftest.py, or install it into this environment)"
    ]
    built = Scenario("team", "c", ModelSpec.module("teampkg.models:build"), **shape)
    assert collection.problems([built], path) == []
