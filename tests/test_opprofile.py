"""Op profiles (issue 28): the summary's arithmetic, its size cap, the stored file, the diff and
``python -m perfsuite explain``. The end-to-end runs with real torch.profiler profiles are at the end."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import CPU_PROFILE, JUDGE_UNDER_CONTENTION, bench_module

from perfsuite.__main__ import main
from perfsuite.core import processor as processors
from perfsuite.core.opprofile import (
    MAX_SUMMARY_BYTES,
    NOISE_SHARE,
    OTHER,
    PLANTED_REGION,
    OpProfile,
    OpStat,
    diff,
    merge,
    top,
)
from perfsuite.judge.explain import Explanation
from perfsuite.store.baselines import BaselineError
from perfsuite.store.profilestore import ProfileStore, fit


def profile(step_ms: float, **ops_ms: float) -> OpProfile:
    """A cpu profile whose ops take the given ms per step (self CPU), at ``step_ms`` per measured step."""
    stats = tuple(OpStat(name.replace("__", "::"), 1.0, ms * 1000) for name, ms in ops_ms.items())
    return OpProfile("cpu", 5, step_ms / 1000 * 1.1, step_ms / 1000, stats)


BASE = profile(10.0, aten__addmm=5.0, aten__gelu=2.0, aten__add_=2.0, aten__copy_=1.0)


def test_a_grown_matmul_leads_the_diff_with_its_share_of_the_slowdown() -> None:
    wider = profile(14.0, aten__addmm=9.0, aten__gelu=2.0, aten__add_=2.0, aten__copy_=1.0)
    found = diff(BASE, wider)
    assert found.changes[0].name == "aten::addmm" and found.changes[0].delta_us == pytest.approx(4000)
    assert found.lead().startswith("op profile: aten::addmm +4 ms/step (+80%)")
    assert "100% of the 4 ms/step added" in found.lead()


def test_an_unchanged_profile_lists_no_op_and_a_uniformly_busier_machine_little() -> None:
    assert diff(BASE, BASE).significant() == []
    assert "no op's share of the step grew by more than" in diff(BASE, BASE).lead()
    # Every op 8% slower (a busier moment): the largest op moves 4% of a step, under the threshold.
    busier = profile(10.8, aten__addmm=5.4, aten__gelu=2.16, aten__add_=2.16, aten__copy_=1.08)
    assert diff(BASE, busier).significant() == [] and NOISE_SHARE > 0.04


def test_a_machine_that_slows_every_op_alike_moves_no_op_but_a_grown_op_still_shows() -> None:
    """A CI VM once ran a whole unchanged step 2-6x slower for minutes: every op grew by more than a
    tenth of a step, yet no op's share of the step moved. Only what a uniform slowdown does not
    explain is listed."""
    slower = profile(30.0, aten__addmm=15.0, aten__gelu=6.0, aten__add_=6.0, aten__copy_=3.0)
    found = diff(BASE, slower)
    assert found.changes[0].delta_us == pytest.approx(10_000), "the raw change is kept for the table"
    assert found.significant() == []
    assert found.lead().endswith("every op slowed alike, the step +20 ms")
    # The same slower machine, and the matmul widened as well: the matmul alone is listed.
    wider = profile(42.0, aten__addmm=27.0, aten__gelu=6.0, aten__add_=6.0, aten__copy_=3.0)
    assert [c.name for c in diff(BASE, wider).grown()] == ["aten::addmm"]
    assert diff(BASE, wider).lead().startswith("op profile: aten::addmm +22 ms/step")


def test_new_and_gone_ops_are_named_so() -> None:
    changed = profile(12.0, aten__addmm=5.0, aten__gelu=2.0, aten__add_=2.0, aten___foreach_add_=3.0)
    found = diff(BASE, changed)
    assert found.changes[0].describe() == "new op aten::_foreach_add_ +3 ms/step"
    assert found.changes[-1].describe() == "aten::copy_ gone (-1 ms/step)"


def test_allocations_that_grew_are_listed_for_a_memory_regression(tmp_path: Path) -> None:
    more = OpProfile("cpu", 5, 0.011, 0.01, (OpStat("aten::empty", 2, 1000, 0, 8 * 2**20), *BASE.ops))
    lead = Explanation(more, BASE, str(tmp_path)).lead(memory=True)
    assert lead == "op profile: allocations grew in aten::empty +8 MiB/step"


def test_ranks_merge_to_their_mean_and_the_rest_folds_into_other() -> None:
    a, b = profile(10.0, aten__mm=4.0), profile(12.0, aten__mm=6.0, aten__add=1.0)
    merged = merge([a, b])
    assert merged.ranks == 2 and merged.op("aten::mm").cpu_us == pytest.approx(5000)  # type: ignore[union-attr]
    assert merged.op("aten::add").cpu_us == pytest.approx(500) and merged.unprofiled_step_s == pytest.approx(0.011)  # type: ignore[union-attr]
    many = top((OpStat(f"op{i}", 1, float(i)) for i in range(50)), "cpu", keep=10)
    assert len(many) == 11 and many[-1].name == OTHER and many[-1].cpu_us == sum(range(40))


def test_a_stored_summary_stays_under_its_cap(tmp_path: Path) -> None:
    huge = OpProfile(
        "cpu", 5, 0.1, 0.1, tuple(OpStat("aten::" + "x" * 200 + str(i), 1, 1000.0 - i) for i in range(400))
    )
    stored = ProfileStore(tmp_path, "cpu").record("g", "g.s", huge)
    assert len(json.dumps(stored.to_json())) <= MAX_SUMMARY_BYTES and stored.ops[-1].name == OTHER
    assert sum(op.cpu_us for op in stored.ops) == pytest.approx(sum(op.cpu_us for op in huge.ops))
    assert ProfileStore(tmp_path, "cpu").lookup("g", "g.s").profile == stored  # read back from the file
    assert fit(BASE) == BASE


def test_a_corrupt_profile_file_names_itself_and_is_never_rewritten(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path, "cpu")
    store.path("g").parent.mkdir(parents=True)
    store.path("g").write_text("{not json")
    with pytest.raises(BaselineError, match=r"op_profiles/g\.json.*--perf-update-baselines"):
        store.record("g", "g.s", BASE)
    assert store.path("g").read_text() == "{not json"


def results_file(tmp_path: Path, explanation: Explanation | None) -> Path:
    result = {"id": "g.s", "status": "ok", "verdict": "regression", "message": "slower", "metrics": {}}
    if explanation is not None:
        result["op_profile"] = explanation.to_json()
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"profile": "cpu", "results": [result]}))
    return path


def test_explain_prints_the_diff_from_the_saved_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wider = profile(14.0, aten__addmm=9.0, aten__gelu=2.0, aten__add_=2.0, aten__copy_=1.0)
    path = results_file(tmp_path, Explanation(wider, BASE, "baselines/cpu/op_profiles/g.json", "t.json.gz"))
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "g.s: regression" and out[1].startswith("  op profile: aten::addmm +4 ms/step")
    assert out[2].split()[:2] == ["op", "baseline"] and out[4].split()[:4] == ["aten::addmm", "5", "9", "+4"]
    assert out[-1].endswith("trace: t.json.gz")


def test_explain_without_a_stored_profile_says_how_to_store_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = results_file(tmp_path, Explanation(BASE, None, "baselines/cpu/op_profiles/g.json"))
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "no profile stored with this baseline" in out and "--perf-update-baselines" in out
    assert "aten::addmm 5 ms/step" in out


def test_explain_of_a_file_without_regressions_or_not_a_results_file(tmp_path: Path) -> None:
    assert main(["explain", str(results_file(tmp_path, None))]) == 1
    (tmp_path / "bad.json").write_text("[]")
    assert main(["explain", str(tmp_path / "bad.json")]) == 2


# -- end to end, with real torch.profiler profiles ----------------------------------------
#: Widens every MLP of perfsuite's GPT in the ranks when WIDEN_FFN is set: a code change the
#: scenario's definition does not show (the ranks put the project folder on their path).
SITECUSTOMIZE = textwrap.dedent(
    """
    import os
    if os.environ.get("WIDEN_FFN"):
        from perfsuite.rank.models import megatron_gpt

        narrow = megatron_gpt.MLP.__init__

        def wide(self, hidden, ffn):
            narrow(self, hidden, ffn * int(os.environ["WIDEN_FFN"]))

        megatron_gpt.MLP.__init__ = wide
    """
)
SHAPE = "world_size=2, micro_batch=8, global_batch=16, seq_len=32, warmup_steps=2, steps=6"
MATMULS = ("aten::addmm", "aten::mm", "aten::linear", "aten::bmm", "aten::matmul")


def gate(project: pytest.Pytester, out: Path, *args: str) -> pytest.RunResult:
    return project.runpytest_subprocess(
        CPU_PROFILE,
        "--perf-op-profiles=auto",
        "--perf-confirm=0",
        f"--perf-json={out}",
        "-p",
        "no:cacheprovider",
        *args,
    )


def unchanged_moves(project: pytest.Pytester, name: str) -> list[dict[str, object]]:
    """The ops an unchanged, passing rerun (profiled anyway) would blame: grown beyond the diff's noise."""
    same = gate(project, project.path / name, "--perf-op-profiles=always")
    same.assert_outcomes(passed=1)
    (result,) = json.loads((project.path / name).read_text())["results"]
    if result["verdict"] != "pass":  # judged otherwise (an improvement): no diff to read
        return []
    moved = set(result["op_profile"]["diff"]["grown"])
    return [c for c in result["op_profile"]["diff"]["changes"] if c["name"] in moved]


@pytest.mark.serial  # timings: a neighbouring test's launches would be contention
def test_a_widened_ffn_regression_names_a_matmul_and_explain_reproduces_it(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A widened FFN is judged however much the hypervisor steals: a CI run saw the regression
    # unreliable at 0.78 cores stolen, and this test is of the explanation, not of contention.
    project.makeconftest(JUDGE_UNDER_CONTENTION)
    project.makepyfile(test_bench=bench_module(f'Scenario("g", "s", TINY, {SHAPE}),'))
    project.makepyfile(sitecustomize=SITECUSTOMIZE)
    recorded = gate(project, project.path / "rec.json", "--perf-update-baselines")
    recorded.assert_outcomes(passed=1)
    stored = project.path / "baselines" / "cpu" / "op_profiles" / "g.json"
    assert stored.exists() and len(stored.read_text()) <= MAX_SUMMARY_BYTES, "the op profile is stored, capped"
    kept = json.loads(stored.read_text())["scenarios"]["g.s"]
    assert processors.key(kept["processor"]) == processors.key(processors.processor()), "as this processor's"

    # The same code again, profiled although it passes: no op moves beyond the stated noise. As
    # the gate confirms a regression, a second rerun confirms a move: a VM stall inside one op
    # (aten::addmm 0.7 -> 2.2 ms/step in one CI run) rarely strikes twice.
    moved = unchanged_moves(project, "same.json")
    if moved:
        moved = unchanged_moves(project, "same-again.json")
    assert not moved, f"two unchanged reruns grew ops beyond {NOISE_SHARE:.0%} of a step: {moved}"

    monkeypatch.setenv("WIDEN_FFN", "8")
    out = project.path / "wide.json"
    widened = gate(project, out)
    widened.assert_outcomes(failed=1)
    failed = next(line for line in widened.outlines if "g.s: regression:" in line)
    lead = failed.split("regression: ", 1)[1]
    # A wider FFN costs time and memory: whichever metric judged it (a noisy CI VM once judged
    # only its peak memory), the explanation's first op is a matmul, by time or by allocations.
    assert lead.startswith("op profile: "), lead
    by_memory = lead.startswith("op profile: allocations grew in ")
    first = lead.removeprefix("op profile: allocations grew in " if by_memory else "op profile: ").split()[0]
    assert first in MATMULS, lead
    (result,) = json.loads(out.read_text())["results"]
    assert Path(result["op_profile"]["trace"]).exists(), "the profiled launch's trace is kept next to the results"
    assert Path(result["op_profile"]["trace"]).parent == project.path / "perf-artifacts"

    capsys.readouterr()
    assert main(["explain", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[1].strip() == lead


@pytest.mark.serial
def test_the_planted_slowdown_shows_under_its_own_region(project: pytest.Pytester) -> None:
    project.makepyfile(test_bench=bench_module(f'Scenario("g", "s", TINY, {SHAPE}),'))
    gate(project, project.path / "rec.json", "--perf-update-baselines").assert_outcomes(passed=1)
    slowed = gate(project, project.path / "slow.json", "--perf-inject-slowdown=200")
    slowed.assert_outcomes(failed=1)
    # The planted work counts under its region, never as the matmuls and tanh it ran. Another op
    # may rank above it: a VM stall inside one op (aten::arange +44 ms/step, seen once) grows that op.
    (line,) = [x for x in slowed.stdout.lines if x.startswith("g.s: regression: op profile:")]
    assert f"new op {PLANTED_REGION} +" in line
    assert "aten::mm" not in line and "aten::tanh" not in line


def test_the_job_summary_and_the_page_show_the_diff_table(tmp_path: Path) -> None:
    from perfsuite.reports.html import summary

    wider = profile(14.0, aten__addmm=9.0, aten__gelu=2.0, aten__add_=2.0, aten__copy_=1.0)
    doc = json.loads(results_file(tmp_path, Explanation(wider, BASE, "s", "perf-artifacts/g.s.trace.gz")).read_text())
    text = summary.markdown(doc)
    assert "### Why `g.s` changed" in text and "op profile: aten::addmm +4 ms/step (+80%)" in text
    assert "| `aten::addmm` | 5 | 9 | +4 | +0 |" in text and "perf-artifacts/g.s.trace.gz" in text
    pytest.importorskip("jinja2", reason="the report extra: pip install 'perfsuite[report]'")
    pytest.importorskip("matplotlib", reason="the report extra: pip install 'perfsuite[report]'")
    from perfsuite.reports.html.page import render

    page = render(doc, "results.json")
    assert "Why g.s changed" in page and "<td>aten::addmm</td>" in page


def test_a_cuda_kernel_counts_once_under_the_op_that_launched_it() -> None:
    """On CUDA the profiler lists a kernel as an event of its own besides the op that launched it, whose
    self device time already holds the kernel's (seen on the H100): the summary keeps the op only."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from perfsuite.rank.worker.profiling import summarise

    def event(name: str, device: object, cpu_us: float, device_us: float) -> SimpleNamespace:
        return SimpleNamespace(
            name=name,
            device_type=device,
            cpu_parent=None,
            self_cpu_time_total=cpu_us,
            self_device_time_total=device_us,
            self_cpu_memory_usage=0,
            self_device_memory_usage=0,
        )

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    stats = summarise([event("aten::mm", cpu, 20.0, 14_500.0), event("sm90_xmma_gemm", cuda, 0.0, 14_400.0)], 1)
    assert [(s.name, s.device_us) for s in stats] == [("aten::mm", 14_500.0)]


def test_a_cuda_oom_names_where_each_allocation_was_made() -> None:
    """Blocks of the first CUDA OOM snapshot (H100, GPT-1.3B fp32 under a 20 GiB cap). Their stacks start
    with the capture's own C++ frames, which once named every block (``memory_snapshot.cpp
    gather_with_cpp``, 20,260 MiB in one row); backward blocks have no Python frame at all."""
    pytest.importorskip("torch")
    from perfsuite.rank.worker.profiling import allocations_by_origin, origin

    blocks = json.loads((Path(__file__).parent / "data" / "cuda_oom_blocks.json").read_text())["blocks"]
    named = {kind: origin(block["frames"]) for kind, block in blocks.items()}
    assert named["adam_state"] == "adam.py:178 _init_group (from primitives.py:126 step)"
    assert named["parameters"].startswith("module.py:") and "convert" in named["parameters"]
    assert "distributed.py" in named["ddp_buckets"] and "_ddp_init_helper" in named["ddp_buckets"]
    assert named["backward_grad"] == "AddmmBackward0 (backward)"
    assert origin([{"name": "at::_ops::add_Tensor::call(...)", "filename": "??", "line": 0}]) == "aten::add_Tensor"
    assert origin([]) == "(no frame)"

    snapshot = {
        "segments": [
            {
                "blocks": [{**b, "state": "active_allocated"} for b in blocks.values()]
                + [{**blocks["adam_state"], "state": "inactive"}]
            }
        ]
    }
    ranked = allocations_by_origin(snapshot)
    assert len(ranked) == 4 and all(op.calls == 1 for op in ranked)  # the freed block is not counted
    assert [op.alloc_bytes for op in ranked] == sorted((b["size"] for b in blocks.values()), reverse=True)
