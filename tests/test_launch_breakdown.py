"""Where a launch's time goes: the timeline of marks the gate, the agent and rank 0 take
(``launch.timeline`` in the results file), the launch's overhead, ``--perf-rank-start``, and
``perfsuite explain --launch``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import CPU_PROFILE, TINY_SHAPE, bench_module

from perfsuite.__main__ import main
from perfsuite.commands.explain import launch_lines
from perfsuite.core.protocol import AGENT_MARKS_VAR, LAUNCH_MARKS, LAUNCH_STRETCHES, RankReport
from perfsuite.launch.base import LaunchOutcome

#: The marks of a cpu training launch, in order (no ``device``: that is a CUDA context).
CPU_TRAINING_MARKS = [m for m in LAUNCH_MARKS if m != "device"]


def test_every_mark_says_what_its_stretch_is() -> None:
    assert list(LAUNCH_STRETCHES) == list(LAUNCH_MARKS)


def outcome(
    marks: dict[str, float], wall_s: float, rank0: dict[str, float], **times: tuple[float, ...]
) -> LaunchOutcome:
    report = RankReport(rank=0, status="ok", marks=rank0, **times)
    return LaunchOutcome("ok", [report], wall_s=wall_s, marks=marks)


def test_the_timeline_orders_the_marks_from_the_spawn_and_ends_at_the_wall_time() -> None:
    spawn = 1000.0
    rank0 = {"agent_start": 999.995, "agent_torch": 1001.5, "rank_start": 1001.7, "warmup": 1003.0, "measure": 1004.0}
    found = outcome({"spawn": spawn, "exit": 1004.5}, 4.75, rank0, warmup_times_s=(0.3, 0.2), step_times_s=(0.25,) * 4)
    # The agent's start, read in 10 ms ticks, came out before the spawn: it counts as the spawn.
    assert found.timeline() == [
        ("spawn", 0.0),
        ("agent_start", 0.0),
        ("agent_torch", 1.5),
        ("rank_start", 1.7),
        ("warmup", 3.0),
        ("measure", 4.0),
        ("exit", 4.5),
        ("end", 4.75),
    ]
    assert found.overhead_s == pytest.approx(4.75 - 0.5 - 1.0)
    assert LaunchOutcome("ok", [], wall_s=2.0).timeline() == []  # a launcher that marks no spawn
    assert LaunchOutcome("crash", [], wall_s=2.0, marks={"spawn": spawn}).overhead_s is None


def test_explain_prints_each_stretch_its_share_and_the_overhead(tmp_path: Path) -> None:
    timeline = [["spawn", 0.0], ["agent_torch", 1.0], ["measure", 3.0], ["end", 4.0]]
    result = {
        "id": "g.s",
        "status": "ok",
        "verdict": "pass",
        "wall_s": 4.0,
        "metrics": {},
        "launch": {"rank_start": "fork", "timeline": timeline, "overhead_s": 2.5},
    }
    lines = launch_lines(result)
    assert lines[0] == "g.s: ok, wall 4.00 s, ranks started by fork"
    rows = {line.split()[0]: line for line in lines[3:-1]}
    assert list(rows) == ["agent_torch", "measure", "end"]
    assert rows["measure"].split()[-3:] == ["3.00", "2.00", "50%"]
    assert LAUNCH_STRETCHES["measure"] in rows["measure"]
    assert lines[-1].strip().startswith("overhead 2.50 s (62% of wall)")
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"profile": "cpu", "results": [result]}))
    assert main(["explain", "--launch", str(path)]) == 0
    result["launch"] = {}
    path.write_text(json.dumps({"profile": "cpu", "results": [result]}))
    assert main(["explain", "--launch", str(path)]) == 1


AGENT_PROBE = """
import os, sys
import torch.distributed.run as run
def torchrun(argv):
    print(json.dumps({"argv": argv, "nvml": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
                      "marks": json.loads(os.environ[%r])}))
import json
run.main = torchrun
sys.argv = ["agent", "--nnodes", "1", *sys.argv[1:], "-m", "perfsuite.rank.worker", "job.json"]
from perfsuite.rank.worker.agent import main
main()
"""


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_an_agent_that_forks_keeps_torch_cuda_off_the_driver_and_hands_its_marks_on(start: str) -> None:
    """torchrun asks ``torch.cuda.is_available()`` in the agent; an agent that forks its ranks makes
    that an NVML query (``PYTORCH_NVML_BASED_CUDA_CHECK``), which does not poison fork. Either agent
    hands its ranks when it started and when it had imported torch."""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    args = ["--start-method", "fork"] if start == "fork" else []
    done = subprocess.run(
        [sys.executable, "-c", AGENT_PROBE % AGENT_MARKS_VAR, *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert ("--run-path" in seen["argv"]) == (start == "fork")
    assert seen["nvml"] == ("1" if start == "fork" else None)
    assert set(seen["marks"]) == {"agent_start", "agent_torch"}
    assert seen["marks"]["agent_start"] <= seen["marks"]["agent_torch"]


def launched(pytester: pytest.Pytester, *args: str) -> dict[str, Any]:
    """One tiny 2-rank cpu training row, launched (no baseline: measured, then skipped); its result."""
    pytester.makepyfile(test_bench=bench_module(f'Scenario("tiny", "ddp", TINY, {TINY_SHAPE})'))
    out = pytester.path / "r.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", CPU_PROFILE, f"--perf-json={out}", *args)
    result.assert_outcomes(skipped=1)
    (found,) = json.loads(out.read_text())["results"]
    assert found["status"] == "ok"
    return dict(found)


@pytest.mark.parametrize("start", ["exec", "fork", "warm"])
def test_a_launch_keeps_its_timeline_in_order_and_its_overhead(pytester: pytest.Pytester, start: str) -> None:
    """``--perf-rank-start`` overrides the profile's ``rank_start`` (warm on cpu) and the results
    file says how the ranks started; the timeline has every mark of a cpu training launch, in
    order, from the spawn to the wall time; the overhead is the wall time less the timed steps."""
    result = launched(pytester, f"--perf-rank-start={start}")
    launch = result["launch"]
    assert launch["rank_start"] == start
    names = [name for name, _ in launch["timeline"]]
    times = [at for _, at in launch["timeline"]]
    assert names == CPU_TRAINING_MARKS
    assert times == sorted(times) and times[0] == 0.0
    assert times[-1] == pytest.approx(result["wall_s"], abs=0.001)
    at = dict(launch["timeline"])
    # The timed warmup and measured steps lie between the engine's wrap and the last measured step.
    timed = result["wall_s"] - launch["overhead_s"]
    assert 0 < timed <= at["measure"] - at["wrap"] + 0.002
    assert 0 < launch["overhead_s"] < result["wall_s"]
    assert ("warm" in launch) == (start == "warm")
    if start == "warm":  # the parent imported the row's runner, engine and model classes; the agent nothing
        assert launch["warm"]["preloaded"] == [
            "perfsuite.rank.strategies.ddp",
            "perfsuite.rank.worker.train",
            "torch._dynamo",
        ]
        assert at["agent_torch"] - at["agent_start"] < 0.5


def test_explain_names_what_a_warm_parent_saved_and_why_a_launch_was_not_warm() -> None:
    timeline = [["spawn", 0.0], ["agent_torch", 0.1], ["measure", 3.0], ["end", 4.0]]
    parent = {
        "parent_pid": 42,
        "imports_s": 6.25,
        "preloaded": ["transformers.models.bert.modeling_bert"],
        "failed": {},
        "started_for_this_launch": False,
    }
    result = {
        "id": "g.s",
        "status": "ok",
        "wall_s": 4.0,
        "launch": {"rank_start": "warm", "timeline": timeline, "overhead_s": 1.5, "warm": parent},
    }
    lines = launch_lines(result)
    assert lines[0].endswith("ranks started by warm")
    assert lines[-1].strip() == (
        "warm parent (pid 42): 6.25 s of imports (torch, torchrun, transformers.models.bert.modeling_bert) "
        "paid once for the run, not by this launch's agent and ranks (paid before this launch)"
    )
    result["launch"] = {
        "rank_start": "fork",
        "timeline": timeline,
        "overhead_s": 1.5,
        "rank_start_note": "the warm parent (pid 42) died; the next launch starts another",
    }
    assert launch_lines(result)[-1].strip() == (
        "not started as asked: the warm parent (pid 42) died; the next launch starts another"
    )


def test_a_bad_rank_start_is_a_usage_error_naming_the_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--perf-rank-start=spawn")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--perf-rank-start" in result.stderr.str() and "'fork'" in result.stderr.str()
