from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from perfsuite import ModelSpec, Scenario, ScenarioError
from perfsuite.core.profiles import CPU, CUDA_32GB, HardwareProfile, ProfileError
from perfsuite.core.protocol import RankJob
from perfsuite.launch.base import WorkerJob, classify
from perfsuite.launch.slurm import SlurmLauncher, first_host, rdzv_port, topology_from_env
from perfsuite.launch.torchrun import Topology, TopologyError, TorchrunLauncher, free_ports
from perfsuite.rank.worker.agent import forked_ranks


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
    assert topology == Topology(nnodes=2, nproc_per_node=8, rdzv_endpoint="gpu07:15042", local_agents=1, flexible=True)
    assert first_host("n1", expand=lambda _: ["n1"]) == "n1"


def test_slurm_rendezvous_port_differs_per_job_unless_master_port_is_set() -> None:
    ports = {rdzv_port({**ENV, "SLURM_JOB_ID": job}) for job in ("42", "43", "1234567")}
    assert ports == {15042, 15043, 19567}
    assert rdzv_port({**ENV, "MASTER_PORT": "29500"}) == 29500
    for bad in ("http", "0", "70000"):
        with pytest.raises(TopologyError, match=f"MASTER_PORT='{bad}' is not a TCP port"):
            rdzv_port({**ENV, "MASTER_PORT": bad})


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
    assert words[1:3] == ["-m", "perfsuite.rank.worker.agent"]
    for flag, value in (
        ("--nnodes", "2"),
        ("--nproc-per-node", "8"),
        ("--rdzv-backend", "c10d"),
        ("--rdzv-endpoint", "gpu07:15042"),
        ("--rdzv-id", "run1"),
    ):
        assert words[words.index(flag) + 1] == value
    # Each node's agent logs under logs/node<SLURM_NODEID>, expanded on that node.
    assert f'"{tmp_path / "logs" / "node"}$SLURM_NODEID"' in inner
    assert words[-3:] == ["-m", "perfsuite.rank.worker", str(job.spec_path)]


def test_ranks_start_warm_on_cpu_and_exec_on_cuda_unless_the_profile_says() -> None:
    assert (CPU.rank_start, CUDA_32GB.rank_start) == ("warm", "exec")
    assert HardwareProfile("mine", "cuda", rank_start="fork").rank_start == "fork"
    with pytest.raises(ProfileError, match="rank_start must be one of warm, fork, exec, not 'spawn'"):
        HardwareProfile("mine", "cpu", rank_start="spawn")  # type: ignore[arg-type]


@pytest.mark.parametrize("start", ["warm", "fork", "exec"])
def test_the_agent_is_asked_to_fork_only_for_forked_ranks(tmp_path: Path, start: str) -> None:
    job = WorkerJob(rank_job(tmp_path, 2), 2, 60, tmp_path, rank_start=start)  # type: ignore[arg-type]
    (cmd,) = TorchrunLauncher().commands(job, "127.0.0.1:1234", "run1")
    assert cmd[-3:] == ["-m", "perfsuite.rank.worker", str(job.spec_path)]
    assert ("--start-method" in cmd) == (start != "exec")
    if start != "exec":
        assert cmd[cmd.index("--start-method") + 1] == "fork"


def test_multi_node_and_other_pythons_start_their_agents_fresh(tmp_path: Path) -> None:
    """A warm parent serves one host's one agent, in this interpreter; the rest keep exec'd agents."""
    job = WorkerJob(rank_job(tmp_path, 4), 4, 60, tmp_path, rank_start="warm")
    parent, why = TorchrunLauncher(Topology(nnodes=2)).warm_parent(job, {})
    assert parent is None and why == "2 nodes: each node's agent starts as a fresh interpreter"
    other = WorkerJob(rank_job(tmp_path, 2), 2, 60, tmp_path, python="/opt/env/bin/python", rank_start="warm")
    parent, why = TorchrunLauncher().warm_parent(other, {})
    assert parent is None and why == "another Python environment (/opt/env/bin/python) starts fresh interpreters"
    assert TorchrunLauncher().warm_parent(dataclasses.replace(other, rank_start="fork"), {}) == (None, "")


def test_a_warm_start_elsewhere_than_linux_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.platform", "darwin")
    job = WorkerJob(rank_job(tmp_path, 2), 2, 60, tmp_path, rank_start="warm")
    assert TorchrunLauncher().warm_parent(job, {}) == (
        None,
        "a warm parent needs Linux (/proc, pidfd_open); this is darwin",
    )


def test_the_agent_runs_the_worker_file_in_its_forks() -> None:
    """torchrun runs a ``-m`` module as a new interpreter whatever the start
    method, so the agent turns it into ``--run-path`` on the worker's file."""
    tail = ["-m", "perfsuite.rank.worker", "job.json"]
    for fork in (["--start-method", "fork"], ["--start-method=fork"]):
        argv = forked_ranks(["--nnodes", "1", *fork, *tail])
        assert argv[:-2] == ["--nnodes", "1", *fork, "--run-path"]
        assert Path(argv[-2]).parts[-4:] == ("perfsuite", "rank", "worker", "__main__.py") and Path(argv[-2]).is_file()
        assert argv[-1] == "job.json"
    for unchanged in (["--nnodes", "1", *tail], ["--start-method", "spawn", *tail], [*tail, "--start-method", "fork"]):
        assert forked_ranks(unchanged) == unchanged


EXEC_CONFTEST = """
from perfsuite.core.profiles import HardwareProfile

def pytest_perfsuite_profiles():
    return [HardwareProfile("cpu-exec", "cpu", rank_start="exec", aliases=("cpu",))]
"""


@pytest.mark.parametrize("profile", ["cpu", "cpu-exec"])
def test_ranks_start_as_the_profile_says(pytester: pytest.Pytester, profile: str) -> None:
    """Warm (the cpu default) or fresh interpreters (the cuda default, here on
    cpu): either trains, and the results file says how its ranks started."""
    pytester.makeconftest(EXEC_CONFTEST)
    pytester.makepyfile(test_bench=PIPELINE)
    out = pytester.path / "r.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--perf-profile={profile}", f"--perf-json={out}")
    result.assert_outcomes(skipped=1)  # no baseline: it trained and was measured
    (res,) = json.loads(out.read_text())["results"]
    assert res["status"] == "ok"
    assert res["launch"]["rank_start"] == ("exec" if profile == "cpu-exec" else "warm")


def test_ports_asked_for_together_are_distinct() -> None:
    # The kernel picks a port to bind at random among ~14k: 400 ports chosen one
    # after another would repeat one with probability 1 - e^-5.7 (> 99%).
    ports = free_ports(400)
    assert len(set(ports)) == len(ports)


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
    assert sum(res["launch"]["ranks_per_host"].values()) == 2 and res["launch"]["rank_start"] == "fork"
    assert [r["rank"] for r in res["metrics"]["per_rank"]] == [0, 1]
    assert res["config"]["layout"]["pp"] == 2 and res["config"]["layout"]["bubble_fraction"] == pytest.approx(1 / 3)


def test_a_scenario_naming_its_nodes_is_emulated_by_the_local_launcher(pytester: pytest.Pytester) -> None:
    """``nodes=2`` under the default local launcher: two torchrun agents on
    this host, one pipeline stage each, as the cluster_gpt rows run on cpu."""
    pytester.makepyfile(test_bench=PIPELINE.replace("world_size=2,", "world_size=2, nodes=2,"))
    out = pytester.path / "r.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--perf-profile=cpu", f"--perf-json={out}")
    result.assert_outcomes(skipped=1)  # no baseline: it trained and was measured
    (res,) = json.loads(out.read_text())["results"]
    assert res["status"] == "ok" and res["config"]["nodes"] == 2
    assert res["launch"]["launcher"] == "torchrun" and res["launch"]["nnodes"] == 2


def test_nodes_must_divide_the_world() -> None:
    with pytest.raises(ScenarioError, match="field 'nodes' must divide world_size=4, got 3"):
        Scenario("g", "x", ModelSpec("bert", 1, 32, 2, 512, 32), world_size=4, nodes=3, micro_batch=1, global_batch=4)


def test_slurm_launcher_outside_an_allocation_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nothing="def test_x(): pass")
    result = pytester.runpytest_subprocess("--perf-launcher=slurm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*must run inside a Slurm allocation (SLURM_JOB_ID is unset)*"])


def test_under_slurm_a_scenario_takes_the_nodes_its_world_size_needs(tmp_path: Path) -> None:
    topology = topology_from_env(ENV, expand=expand)  # 2 nodes x 8 GPUs
    assert [topology.layout(n) for n in (1, 4, 8, 12, 16)] == [(1, 1), (1, 4), (1, 8), (2, 6), (2, 8)]
    with pytest.raises(TopologyError, match=r"world_size 24 needs 3 node\(s\) of 8 rank\(s\); the allocation has 2"):
        topology.layout(24)
    (cmd,) = SlurmLauncher(topology).commands(WorkerJob(rank_job(tmp_path, 4), 4, 60, tmp_path), "gpu07:29400", "r")
    words = shlex.split(cmd[7])
    assert cmd[1] == "--nodes=1" and words[words.index("--nnodes") + 1 : words.index("--nnodes") + 4] == [
        "1",
        "--nproc-per-node",
        "4",
    ]


def test_emulated_nodes_on_one_gpu_host_get_disjoint_gpus(tmp_path: Path) -> None:
    import dataclasses

    launcher = TorchrunLauncher(Topology(nnodes=2))
    job = dataclasses.replace(
        WorkerJob(rank_job(tmp_path, 4), 4, 60, tmp_path, nproc_per_node=2, devices=("0", "1", "2", "3")),
        rank_job=dataclasses.replace(rank_job(tmp_path, 4), device="cuda"),
    )
    assert [launcher.agent_env(job, node) for node in (0, 1)] == [
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        {"CUDA_VISIBLE_DEVICES": "2,3"},
    ]
    with pytest.raises(TopologyError, match=r"emulating 2 nodes of 2 rank\(s\) on this host needs 4 GPUs; it has 2"):
        launcher.agent_env(dataclasses.replace(job, devices=("0", "1")), 0)
    assert (
        TorchrunLauncher(Topology(nnodes=2)).agent_env(dataclasses.replace(job, rank_job=rank_job(tmp_path, 4)), 0)
        == {}
    )


def test_emulated_nodes_share_the_host_gpus_and_refuse_before_launch() -> None:
    from perfsuite.core.profiles import gpu_profile
    from perfsuite.gate.fitting import launch_precondition

    scenario = Scenario(
        "g", "s", ModelSpec("bert", 1, 32, 2, 512, 32), world_size=2, micro_batch=1, global_batch=2, seq_len=16
    )
    one_gpu = {"gpu_count": 1, "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]}
    reason = launch_precondition(scenario, gpu_profile("nvidia-h100-80gb-hbm3-x1"), one_gpu, Topology(nnodes=2))
    assert reason == "needs 2 GPUs, 2 node(s) emulated on this host share its 1 GPU(s): 0 each"
    two_gpus = {**one_gpu, "gpu_count": 2}
    assert launch_precondition(scenario, gpu_profile("x"), two_gpus, Topology(nnodes=2)) is None


def dump(*frames: tuple[str, str]) -> str:
    return "\n".join(f'  File "{file}", line 1 in {func}' for file, func in frames)


def test_a_hung_forked_rank_is_shown_where_it_hangs_not_where_its_agent_forked(tmp_path: Path) -> None:
    """A forked rank's dumped stack ends in 30+ frames of its agent
    (multiprocessing, torchrun): the failure shows the innermost frames."""
    job = WorkerJob(rank_job(tmp_path, 2), 2, 18, tmp_path)
    agent = [(f"/py/torch/distributed/elastic/agent{i}.py", "run") for i in range(30)]
    stacks = {
        0: dump(
            ("/py/torch/distributed/distributed_c10d.py", "all_reduce"),
            ("/src/perfsuite/rank/worker/loop.py", "measure"),
        ),
        1: dump(("/proj/faults.py", "forward_backward"), ("/src/perfsuite/rank/worker/loop.py", "measure"), *agent),
    }
    for rank, main in stacks.items():
        log = tmp_path / "logs" / "node0" / "run" / "attempt_0" / str(rank) / "stderr.log"
        log.parent.mkdir(parents=True)
        watchdog = dump(("/usr/lib/python3/threading.py", "wait"), ("/src/perfsuite/rank/worker/watchdog.py", "watch"))
        log.write_text(
            f"Thread 0x00007f01 (most recent call first):\n{watchdog}\n\n"
            f"Current thread 0x00007f00 (most recent call first):\n{main}\n"
        )
    outcome = classify(job, timed_out=True, wall_s=18.0)
    assert outcome.status == "timeout" and outcome.failure is not None
    assert outcome.failure.rank == 1
    lines = outcome.failure.stderr_tail.splitlines()
    assert lines[0] == "main thread, most recent call first:"
    assert "faults.py" in lines[1] and "forward_backward" in lines[1]
    assert len(lines) == 1 + 25 and not any("watchdog" in line for line in lines)


def test_one_node_meets_statically_at_its_own_port_and_nodes_through_c10d(tmp_path: Path) -> None:
    """Static rendezvous (plain torchrun's) for one node on a port perfsuite chose; c10d otherwise."""
    job = WorkerJob(rank_job(tmp_path, 2), 2, 60, tmp_path)
    (cmd,) = TorchrunLauncher().commands(job, "127.0.0.1:29511", "run1")
    at = cmd.index("--rdzv-backend")
    assert cmd[at : at + 8] == [
        "--rdzv-backend",
        "static",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29511",
        "--node-rank",
        "0",
    ]
    assert "--rdzv-endpoint" not in cmd
    chosen = TorchrunLauncher(Topology(rdzv_endpoint="head:29400"))
    (cmd,) = chosen.commands(job, chosen.endpoint(), "run1")
    assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d" and cmd[cmd.index("--rdzv-endpoint") + 1] == "head:29400"
    two = WorkerJob(rank_job(tmp_path, 4), 4, 60, tmp_path)
    for cmd in TorchrunLauncher(Topology(nnodes=2)).commands(two, "127.0.0.1:29512", "run1"):
        assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d"


def test_slurm_starts_its_agents_through_srun_not_a_warm_parent(tmp_path: Path) -> None:
    launcher = SlurmLauncher(topology_from_env({**ENV, "SLURM_JOB_NUM_NODES": "1"}, expand=lambda _: ["gpu07"]))
    job = WorkerJob(rank_job(tmp_path, 2), 2, 60, tmp_path, rank_start="warm")
    assert launcher.warm_parent(job, {}) == (None, "the slurm launcher starts each node's agent itself")
