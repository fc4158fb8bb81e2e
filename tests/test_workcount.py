"""The step's work, counted and judged exactly (issue 56): what one step calls (top-level ops by
name and dtype), its host syncs, collectives and the bytes its ops return, recorded with the
baselines and compared with no tolerance for noise, on any processor.

Real counts come from a real profiler over a real training step (in this process, and in a team's
repository at world size 2 through the plugin); the judgement is pure and tested on values."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import record_team, require, team_gate

from perfsuite.core.workcount import MAX_GROWTH, WorkCount, compare, merge
from perfsuite.judge.compare import Judgement
from perfsuite.judge.work import WORK_CHANGED, applied, decide
from perfsuite.store.baselines import BaselineError
from perfsuite.store.workstore import StoredWork, WorkStore

BASE = WorkCount(
    {"aten::mm(float)": 12.0, "aten::add_(float)": 40.0, "aten::item": 2.0},
    {"all_reduce": 1.0},
    collective_bytes=4096.0,
    op_bytes=2.0**30,
    graphs=2,
    graph_breaks=1,
    ranks=2,
)
PACKAGES = {"torch": "2.13.0+cpu", "transformers": "5.24.0"}


def with_ops(changes: dict[str, float]) -> WorkCount:
    """BASE with these ops' calls per step."""
    return dataclasses.replace(BASE, ops={**BASE.ops, **changes})


# -- the judgement, on values -----------------------------------------------------------------------


def test_the_same_counts_are_unchanged() -> None:
    diff = compare(BASE, WorkCount(**{**BASE.__dict__}))
    assert not diff.changed and diff.describe() == "work unchanged"


def test_a_new_host_sync_fails_naming_the_op() -> None:
    diff = compare(BASE, with_ops({"aten::item": 4.0}))
    assert diff.failed
    assert "host syncs aten::item: 4 per step, was 2" in diff.describe()


def test_a_second_all_reduce_fails_however_few_bytes_it_moves() -> None:
    current = WorkCount(BASE.ops, {"all_reduce": 2.0}, BASE.collective_bytes, ranks=BASE.ranks)
    assert "collective all_reduce: 2 per step, was 1" in compare(BASE, current).describe()


def test_more_op_calls_fail_beyond_the_stated_growth_and_pass_within_it() -> None:
    calls = BASE.calls
    within = with_ops({"aten::add_(float)": 40.0 + calls * MAX_GROWTH * 0.5})
    beyond = with_ops({"aten::add_(float)": 40.0 + calls * MAX_GROWTH * 2})
    assert not compare(BASE, within).failed and compare(BASE, within).changed
    assert compare(BASE, beyond).failed
    assert "op calls:" in compare(BASE, beyond).describe()


def test_a_different_mix_with_nothing_costed_growing_passes_and_is_listed() -> None:
    # A fused kernel for two ops: fewer calls, no new sync or collective.
    ops = {k: v for k, v in BASE.ops.items() if k != "aten::add_(float)"} | {"aten::_foreach_add_(float)": 4.0}
    diff = compare(BASE, WorkCount(ops, BASE.collectives, BASE.collective_bytes, ranks=BASE.ranks))
    assert diff.changed and not diff.failed
    assert diff.describe().startswith("op calls per step: aten::add_(float) -40, aten::_foreach_add_(float) +4")


def test_more_collective_bytes_fail_in_mib() -> None:
    current = WorkCount(BASE.ops, BASE.collectives, BASE.collective_bytes + 64 * 2**20, ranks=BASE.ranks)
    assert "+64 MiB moved by collectives per step (+1638400.0%)" in compare(BASE, current).describe()


def test_ops_reading_more_bytes_fail_beyond_the_stated_growth_even_with_the_same_calls() -> None:
    # An upcast: the same calls, the logits' ops reading float32 instead of bfloat16.
    upcast = dataclasses.replace(BASE, op_bytes=BASE.op_bytes * 1.25)
    assert "+256 MiB read by ops per step (+25.0%)" in compare(BASE, upcast).describe()
    within = dataclasses.replace(BASE, op_bytes=BASE.op_bytes * (1 + MAX_GROWTH / 2))
    assert not compare(BASE, within).failed


@pytest.mark.parametrize(
    ("field", "words"),
    [("graph_breaks", "graph breaks: 2 in the run, was 1"), ("graphs", "compiled graphs: 3 in the run, was 2")],
)
def test_any_new_graph_or_graph_break_fails(field: str, words: str) -> None:
    more = dataclasses.replace(BASE, **{field: getattr(BASE, field) + 1})
    assert compare(BASE, more).failed and words in compare(BASE, more).describe()


def test_a_quantity_one_side_did_not_count_is_not_judged() -> None:
    # A recording by a perfsuite that counted no bytes or graphs.
    older = dataclasses.replace(BASE, op_bytes=None, graphs=None, graph_breaks=None)
    more = dataclasses.replace(BASE, op_bytes=BASE.op_bytes * 2, graphs=9, graph_breaks=9)
    assert compare(older, more).describe() == "work unchanged"
    assert merge([BASE, older]).op_bytes is None


@pytest.mark.parametrize(
    ("stored", "current", "packages", "words"),
    [
        (StoredWork(BASE, PACKAGES), None, PACKAGES, "this run counted none"),
        (StoredWork(BASE, PACKAGES), WorkCount(BASE.ops, ranks=2, steady=False), PACKAGES, "counted steps differed"),
        (None, BASE, PACKAGES, "no recorded counts; record the counts again with --perf-update-baselines"),
        (StoredWork(BASE, PACKAGES), BASE, {**PACKAGES, "torch": "2.14.0"}, "torch 2.13.0+cpu -> 2.14.0"),
        (StoredWork(BASE, PACKAGES), WorkCount(BASE.ops, ranks=4), PACKAGES, "recorded over 2 rank(s), this run has 4"),
    ],
    ids=["none-counted", "unsteady", "none-recorded", "other-torch", "other-world"],
)
def test_counts_that_cannot_be_compared_are_not_judged_and_say_why(
    stored: StoredWork | None, current: WorkCount | None, packages: dict[str, str], words: str
) -> None:
    found = decide(stored, current, packages)
    assert found.status == "not_judged" and not found.judged
    assert words in found.message
    assert applied(Judgement("pass", "fine"), found) == Judgement("pass", "fine")


def test_a_costed_growth_fails_a_passing_scenario_and_leads_a_failing_one() -> None:
    found = decide(StoredWork(BASE, PACKAGES), with_ops({"aten::item": 3.0}), PACKAGES)
    passed = applied(Judgement("other_machine", "memory within tolerance"), found)
    assert passed.verdict == WORK_CHANGED == "work_changed" and passed.failed
    assert passed.message.startswith("step work changed: host syncs aten::item: 3 per step, was 2")
    assert passed.message.endswith("; timing and memory: other_machine")
    slower = applied(Judgement("regression", "samples_per_s: 10 vs 12"), found)
    assert slower.verdict == "regression"
    assert slower.message.splitlines() == [found.message, "samples_per_s: 10 vs 12"]


def test_unchanged_work_under_a_timing_regression_says_the_step_runs_slower_not_does_more() -> None:
    found = decide(StoredWork(BASE, PACKAGES), BASE, PACKAGES)
    assert found.status == "unchanged"
    judged = applied(Judgement("regression", "samples_per_s: 10 vs 12"), found)
    assert judged.message.endswith(
        "step work unchanged: the slowdown is in how the step runs (a library, driver or the machine), not what it does"
    )
    assert applied(Judgement("pass", "fine"), found).message == "fine"


def test_a_row_that_marks_its_work_unjudged_shows_the_change_and_never_fails() -> None:
    found = decide(StoredWork(BASE, PACKAGES), with_ops({"aten::item": 3.0}), PACKAGES, wanted=False)
    assert found.status == "not_judged" and not found.judged
    assert found.message.startswith("work not judged (the scenario sets judge_work=False): host syncs aten::item")
    assert applied(Judgement("pass", "fine"), found) == Judgement("pass", "fine")


def test_ranks_merge_by_summing() -> None:
    merged = merge([BASE, with_ops({"aten::item": 1.0})])
    assert merged.ops["aten::item"] == 3.0 and merged.ranks == 4 and merged.collectives == {"all_reduce": 2.0}
    assert (merged.op_bytes, merged.graphs, merged.graph_breaks) == (2.0**31, 4, 2)


def test_a_results_files_count_reads_from_another_revision_or_not_at_all() -> None:
    from perfsuite.core.protocol import read_work_count as read

    newer = {**json.loads(json.dumps(BASE.to_json())), "energy_j": 4.5}  # a later perfsuite's field
    assert read(newer) == BASE
    older = {"ops": {"aten::mm(float)": 1.0}, "collectives": {}, "collective_bytes": 0.0, "version": 1}
    assert read(older) == WorkCount({"aten::mm(float)": 1.0})  # no bytes read, no graphs: not judged
    assert read(None) is None and read({"ops": "many"}) is None and read({"ops": {}, "ranks": "two"}) is None


# -- the store --------------------------------------------------------------------------------------


def test_the_store_keeps_counts_and_versions_and_refuses_a_corrupt_file_untouched(tmp_path: Path) -> None:
    store = WorkStore(tmp_path, "cpu")
    path = store.record("team", "team.ddp", StoredWork(BASE, PACKAGES))
    assert path == tmp_path / "cpu" / "work" / "team.json"
    assert WorkStore(tmp_path, "cpu").get("team", "team.ddp") == StoredWork(BASE, PACKAGES)
    path.write_text('{"version": 1, "scenarios": {"team.ddp": {"ops": "many"}}}')
    with pytest.raises(BaselineError, match=f"work file {path}: cannot be read.*record the counts again"):
        WorkStore(tmp_path, "cpu").get("team", "team.ddp")
    with pytest.raises(BaselineError):
        WorkStore(tmp_path, "cpu").record("team", "team.other", StoredWork(BASE, PACKAGES))
    assert path.read_text() == '{"version": 1, "scenarios": {"team.ddp": {"ops": "many"}}}'


# -- the nesting, on the profiler's raw events ------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """A stand-in for the profiler's raw event (``_KinetoEvent``): what the count reads of one."""

    event_name: str
    start: int
    end: int
    thread: int = 1
    async_: bool = False
    types: tuple[str, ...] = ("float",)
    shapes: tuple[list[int], ...] = ([4],)
    device: str = "CPU"

    def name(self) -> str:
        return self.event_name

    def start_ns(self) -> int:
        return self.start

    def end_ns(self) -> int:
        return self.end

    def start_thread_id(self) -> int:
        return self.thread

    def is_async(self) -> bool:
        return self.async_

    def dtypes(self) -> list[str]:
        return list(self.types)

    def structured_input_shapes(self) -> list[list[int]]:
        return list(self.shapes)

    def device_type(self) -> object:
        from torch.autograd import DeviceType

        return getattr(DeviceType, self.device)


def test_the_count_nests_as_torch_does_and_leaves_perfsuites_regions_and_async_calls_out() -> None:
    from perfsuite.rank.worker.workcount import count

    (step,) = count(
        [
            Event("ProfilerStep#0", 0, 100),
            Event("c10d::recv_", 1, 90, async_=True, types=("TensorList",)),  # waits while the forward runs
            Event("aten::linear", 2, 10),
            Event("aten::addmm", 3, 9),  # inside linear: the kernel's choice, not counted
            Event("aten::copy_", 8, 15),  # overlaps linear's end: not inside it (torch's rule)
            Event("perfsuite::planted_slowdown", 20, 30),
            Event("aten::mm", 21, 29),  # perfsuite's own work
            Event("gloo:all_reduce", 40, 50, thread=2, shapes=([8, 2],)),  # the backend's thread
            Event("aten::item", 60, 61),
            Event("aten::add_", 200, 210),  # after the step
        ]
    )
    assert step.ops == {
        "c10d::recv_(TensorList)": 1,
        "aten::linear(float)": 1,
        "aten::copy_(float)": 1,
        "aten::item(float)": 1,
    }
    assert step.collectives == {"all_reduce": 1} and step.collective_bytes == 8 * 2 * 4
    # The top-level calls' inputs: four float tensors of 4 elements (recv's TensorList has no size).
    assert step.op_bytes == 3 * 4 * 4


def test_on_a_gpu_kernels_count_by_the_step_they_ran_in_and_runtime_syncs_wherever_called() -> None:
    """The GPU side, on the events a CUDA profile records (checked for real in the GPU call)."""
    from perfsuite.rank.worker.workcount import count

    first, second = count(
        [
            Event("ProfilerStep#0", 0, 100),
            Event("ProfilerStep#1", 100, 200),
            Event("aten::mm", 2, 10),
            Event("sm90_xmma_gemm_f32", 5, 40, thread=7, device="CUDA"),  # runs after its launch
            Event("aten::item", 50, 60),
            Event("cudaStreamSynchronize", 52, 58),  # inside item: counted all the same
            Event("aten::mm", 102, 110),
            Event("sm90_xmma_gemm_f32", 104, 130, thread=7, device="CUDA"),
            Event("Memcpy DtoH (Device -> Pinned)", 140, 141, thread=7, device="CUDA"),
        ]
    )
    assert first.kernels == {"sm90_xmma_gemm_f32": 1} and first.syncs == {
        "aten::item(float)": 1,
        "cudaStreamSynchronize": 1,
    }
    assert second.kernels == {"sm90_xmma_gemm_f32": 1, "Memcpy DtoH (Device -> Pinned)": 1}
    diff = compare(first, second)
    assert "device kernels: 2 per step, was 1" in diff.describe()
    assert "kernels per step: Memcpy DtoH (Device -> Pinned) +1" in diff.describe()
    assert compare(dataclasses.replace(first, kernels={}), second).describe().count("device kernels") == 0


# -- real counts of a real step ---------------------------------------------------------------------

STEP = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch import nn
    from perfsuite.rank.worker.workcount import count_steps

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
    opt = torch.optim.AdamW(model.parameters(), foreach="noforeach" not in sys.argv)
    x = torch.randn(8, 32)

    if "break" in sys.argv:
        model[1].register_forward_hook(lambda *_: torch._dynamo.graph_break())
    if "compile" in sys.argv:  # dynamo's eager backend: its graphs and breaks, without inductor's build
        model = torch.compile(model, backend="eager")

    def step():
        out = model(x)
        if "upcast" in sys.argv:
            out = out.double()
        loss = out.pow(2).mean()
        if "item" in sys.argv:
            loss.item()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return 0.0

    for _ in range(3):  # the optimizer's state exists from the first step on
        step()
    print(json.dumps(count_steps(step, torch.device("cpu")).to_json()))
    """
)


def counted(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> WorkCount:
    script = tmp_path / "step.py"
    script.write_text(STEP)
    out = subprocess.run(
        [sys.executable, str(script), *flags], env={**os.environ, **(env or {})}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout.splitlines()[-1])
    return WorkCount(**{k: v for k, v in data.items() if k != "version"})


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> WorkCount:
    return counted(tmp_path_factory.mktemp("plain"))


def test_a_real_step_counts_the_same_twice_and_under_avx2_kernels(plain: WorkCount, tmp_path: Path) -> None:
    assert plain.steady and plain.calls > 10
    # The two Linear layers' forward, as the module called it: aten::linear, not the addmm inside.
    assert plain.ops.get("aten::linear(float)") == 2 and "aten::addmm(float)" not in plain.ops
    avx2 = counted(tmp_path, env={"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert compare(plain, avx2).describe() == "work unchanged"


@pytest.mark.parametrize(
    ("flag", "words"),
    [("item", "host syncs aten::item"), ("noforeach", "op calls: "), ("upcast", "MiB read by ops per step")],
    ids=["item", "adamw-without-foreach", "upcast"],
)
def test_planted_changes_to_a_real_step_fail(plain: WorkCount, tmp_path: Path, flag: str, words: str) -> None:
    diff = compare(plain, counted(tmp_path, flag))
    assert diff.failed and words in diff.describe(), diff.describe()


def test_a_graph_break_in_a_compiled_step_fails(tmp_path: Path) -> None:
    whole = counted(tmp_path, "compile")
    assert (whole.graphs, whole.graph_breaks) == (1, 0)
    broken = counted(tmp_path, "compile", "break")
    assert broken.graph_breaks and broken.steady  # dynamo counts the break each time it traces it
    diff = compare(whole, broken)
    assert diff.failed and f"graph breaks: {broken.graph_breaks} in the run, was 0" in diff.describe()


# -- through the plugin, in a team's repository ----------------------------------------------------

TEAM = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perfsuite import Recipe


    class Net(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.a, self.b = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            h = F.gelu(self.a(x))
            PLANTED
            return x + self.b(h)


    def build(device, dtype, width=32):
        model = Net(width).to(device=device, dtype=dtype)

        def batch(rows, seq_len, gen):
            return {"x": torch.randn(rows, seq_len, width, generator=gen),
                    "target": torch.randn(rows, seq_len, width, generator=gen)}

        return Recipe(model, batch, loss=lambda out, b: F.mse_loss(out, b["target"]), inputs=("x",))
    """
)
TEAM_BENCH = textwrap.dedent(
    """
    from perfsuite import ModelSpec, Scenario, parametrize

    SCENARIOS = [Scenario("team", "ddp", ModelSpec.module("teampkg.models:build"), strategy="ddp", world_size=2,
                          micro_batch=4, global_batch=8, seq_len=16, warmup_steps=1, steps=4)]

    @parametrize(SCENARIOS)
    def test_team(perf, scenario):
        perf.check(scenario)
    """
)


def write_team(root: Path, planted: str) -> None:
    (root / "teampkg").mkdir(exist_ok=True)
    (root / "teampkg" / "__init__.py").write_text("")
    (root / "teampkg" / "models.py").write_text(TEAM.replace("PLANTED", planted))


def test_a_host_sync_planted_in_a_teams_model_fails_the_gate_at_world_size_2(pytester: pytest.Pytester) -> None:
    require("torch")
    write_team(pytester.path, "pass")
    results = record_team(pytester, TEAM_BENCH, passed=1)
    work = results["team.ddp"]["work"]
    assert work["count"]["ranks"] == 2 and work["count"]["steady"], work
    # DDP's reducer all-reduces every gradient once a step, from C++: one bucket of the model's 8352
    # fp32 parameters (two Linear layers, 32 <-> 128 wide, with biases) on each rank.
    assert work["count"]["collectives"] == {"all_reduce": 2}
    assert work["count"]["collective_bytes"] == 2 * 8352 * 4
    stored = json.loads((pytester.path / "baselines" / "cpu" / "work" / "team.json").read_text())
    assert stored["scenarios"]["team.ddp"]["packages"]["torch"]
    unchanged = team_gate(pytester, "--perf-op-profiles=off")
    unchanged.assert_outcomes(passed=1)
    unchanged.stdout.fnmatch_lines(["*judged: work 1, memory 1, timing 1 of 1*"])
    write_team(pytester.path, "h.sum().item()")
    planted = team_gate(pytester, "--perf-op-profiles=off", "--perf-json", "gate.json")
    planted.assert_outcomes(failed=1)
    planted.stdout.fnmatch_lines(["*team.ddp: work_changed: step work changed: host syncs aten::item*"])
    gated = json.loads((pytester.path / "gate.json").read_text())["results"][0]
    assert gated["verdict"] == "work_changed" and gated["work"]["status"] == "failed"
