from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from perfsuite import ModelSpec, Scenario
from perfsuite.launch.base import WorkerJob
from perfsuite.launch.slurm import SlurmLauncher, first_host, topology_from_env
from perfsuite.launch.torchrun import Topology, TopologyError, TorchrunLauncher
from perfsuite.protocol import RankJob


def rank_job(tmp_path: Path, world: int) -> RankJob:
    scenario = Scenario(
        "g", "s", ModelSpec("bert", 1, 32, 2, 512, 32), world_size=world, micro_batch=1, global_batch=world, seq_len=16
    )
    return RankJob(spec=scenario.rank_spec(), device="cpu", reports_dir=str(tmp_path / "reports"))


ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_NODELIST": "gpu[07-08]"}


def expand(nodelist: str) -> list[str]:
    assert nodelist == "gpu[07-08]"
    return ["gpu07", "gpu08"]


def test_slurm_topology_comes_from_the_allocation() -> None:
    topology = topology_from_env(ENV, expand=expand)
    assert topology == Topology(nnodes=2, nproc_per_node=8, rdzv_endpoint="gpu07:29400", local_agents=1)
    assert first_host("n1", expand=lambda _: ["n1"]) == "n1"


def test_slurm_outside_an_allocation_is_a_clear_error() -> None:
    with pytest.raises(TopologyError, match="inside a Slurm allocation"):
        topology_from_env({})


def test_slurm_starts_one_torchrun_agent_per_node(tmp_path: Path) -> None:
    launcher = SlurmLauncher(topology_from_env(ENV, expand=expand))
    job = WorkerJob(rank_job(tmp_path, 16), world_size=16, timeout_s=60, workdir=tmp_path)
    (cmd,) = launcher.commands(job, launcher.endpoint(), "run1")
    assert cmd[:5] == ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--export=ALL"]
    assert cmd[5:7] == ["bash", "-c"]
    inner = cmd[7]
    words = shlex.split(inner)
    assert words[1:3] == ["-m", "torch.distributed.run"]
    for flag, value in (
        ("--nnodes", "2"),
        ("--nproc-per-node", "8"),
        ("--rdzv-backend", "c10d"),
        ("--rdzv-endpoint", "gpu07:29400"),
        ("--rdzv-id", "run1"),
    ):
        assert words[words.index(flag) + 1] == value
    # Each node's agent logs under logs/node<SLURM_NODEID>, expanded on that node.
    assert f'"{tmp_path / "logs" / "node"}$SLURM_NODEID"' in inner
    assert words[-3:] == ["-m", "perfsuite.worker", str(job.spec_path)]


def test_world_size_must_split_over_nodes() -> None:
    with pytest.raises(TopologyError, match="2 node"):
        Topology(nnodes=2).ranks_per_node(3)
    assert Topology(nnodes=2).ranks_per_node(4) == 2


def test_global_rank_maps_to_node_and_local_rank(tmp_path: Path) -> None:
    job = WorkerJob(rank_job(tmp_path, 4), world_size=4, timeout_s=1, workdir=tmp_path, nproc_per_node=2)
    assert [job.node_of(r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


PIPELINE = """
from perfsuite import ModelSpec, Scenario, parametrize

GPT = ModelSpec("megatron_gpt", layers=2, hidden=64, heads=2, vocab=256, max_positions=32)
SCENARIOS = [Scenario("parallel_3d", "pp2_two_nodes", GPT, strategy="tp_pp",
                      strategy_options={"pp": 2, "schedule": "gpipe", "microbatches": 2},
                      world_size=2, micro_batch=2, global_batch=4, seq_len=32, warmup_steps=1, steps=3)]

@parametrize(SCENARIOS)
def test_bench(perf, scenario):
    perf.check(scenario)
"""


def test_two_agents_rendezvous_over_loopback(pytester: pytest.Pytester) -> None:
    """Two torchrun agents ("nodes", one rank each) meet at a c10d endpoint on
    127.0.0.1 and train a parallel_3d scenario to completion: a two-stage
    pipeline whose stages live on different nodes."""
    pytester.makepyfile(test_bench=PIPELINE)
    out = pytester.path / "r.json"
    port = TorchrunLauncher().endpoint().rsplit(":", 1)[1]
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--perf-profile=cpu",
        "--perf-launcher=torchrun",
        "--perf-nnodes=2",
        f"--perf-rdzv-endpoint=127.0.0.1:{port}",
        f"--perf-json={out}",
    )
    result.assert_outcomes(skipped=1)  # no baseline: it trained and was measured
    (res,) = json.loads(out.read_text())["results"]
    assert res["status"] == "ok" and res["launch"]["launcher"] == "torchrun" and res["launch"]["nnodes"] == 2
    assert sum(res["launch"]["ranks_per_host"].values()) == 2
    assert [r["rank"] for r in res["metrics"]["per_rank"]] == [0, 1]
    assert res["config"]["layout"]["pp"] == 2 and res["config"]["layout"]["bubble_fraction"] == pytest.approx(1 / 3)


def test_slurm_launcher_outside_an_allocation_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nothing="def test_x(): pass")
    result = pytester.runpytest_subprocess("--perf-launcher=slurm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*must run inside a Slurm allocation (SLURM_JOB_ID is unset)*"])
