"""The session's launches: from a prepared scenario to pooled metrics.

:class:`Launches` builds each launch's :class:`~perfsuite.launch.WorkerJob`
(the rank job, timeout, environment, ranks per node, GPUs), holds this host's
GPUs for the launch so that no other run measures on them meanwhile, runs it
with the session's launcher (or, for a multi-node scenario under the local
launcher, torchrun agents emulating its nodes over loopback), and pools
``repeats`` launches into a :class:`~perfsuite.judge.results.Measurement`. It also
keeps what the ranks reported about the nodes they ran on, which the stack
fingerprint of every baseline includes. Nothing is judged or recorded here.
Pytest side, torch-free.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfsuite.core.protocol import RankJob
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.gate.settings import RunSettings
from perfsuite.judge.results import Measurement
from perfsuite.judge.stats import ScenarioMetrics, aggregate, pool
from perfsuite.launch import Launcher, LaunchOutcome, WorkerJob, devicelock
from perfsuite.launch.envs import CURRENT
from perfsuite.launch.procs import launcher_env
from perfsuite.launch.progress import Progress
from perfsuite.launch.torchrun import LocalTorchrun, Topology, TorchrunLauncher


class Launches:
    """Launches for one session, and what its ranks reported about their nodes."""

    def __init__(
        self, settings: RunSettings, fingerprint: Mapping[str, Any], launcher: Launcher, progress: Progress
    ) -> None:
        self.settings = settings
        self.fingerprint = fingerprint
        self.launcher = launcher  # the session's; tests swap it between runs
        self.progress = progress
        self.runtime: dict[str, Any] = {}  # rank 0's torch/CUDA/NCCL builds, once seen
        self.nodes: dict[str, dict[str, Any]] = {}  # host -> ranks seen there and its runtime
        self.env_runtime: dict[str, dict[str, Any]] = {}  # rank 0's builds per named environment
        self._emulators: dict[int, TorchrunLauncher] = {}
        self._workroot = settings.workdir or Path(tempfile.mkdtemp(prefix="perfsuite-"))

    def launcher_for(self, scenario: BaseScenario) -> Launcher:
        """The session's launcher, or for a multi-node scenario under the local
        launcher, torchrun agents emulating its nodes on this host (over loopback)."""
        nodes = scenario.nodes or 1
        if nodes == 1 or not isinstance(self.launcher, LocalTorchrun):
            return self.launcher
        if nodes not in self._emulators:
            self._emulators[nodes] = TorchrunLauncher(Topology(nnodes=nodes))
        return self._emulators[nodes]

    def topology(self, scenario: BaseScenario) -> Topology | None:
        """The nodes ``scenario``'s launcher spreads ranks over (None for a single-host launcher)."""
        topology: Topology | None = getattr(self.launcher_for(scenario), "topology", None)
        return topology

    def info(self, scenario: BaseScenario, measurement: Measurement) -> dict[str, Any]:
        """Launcher, nodes this scenario used (Slurm takes as many as it needs),
        ranks per host, how they started (``warm``, ``fork``, ``exec``: the profile's
        ``rank_start`` or ``--perf-rank-start``, as the launch went; with the reason when it
        went otherwise, and a warm launch's parent), and where the
        deciding launch's time went: its ``timeline`` ([mark, seconds since spawn])
        and ``overhead_s``, its wall time less rank 0's timed warmup and steps."""
        launcher, topology = self.launcher_for(scenario), self.topology(scenario)
        outcome = measurement.outcome
        reports = outcome.reports
        per_host: dict[str, int] = {}
        for report in reports:
            per_host[report.host] = per_host.get(report.host, 0) + 1
        started = sorted({"fork" if report.forked else "exec" for report in reports})
        forked = outcome.started if outcome.started and started == ["fork"] else None
        return {
            "launcher": launcher.name,
            "nnodes": topology.layout(scenario.world_size)[0] if topology else 1,
            "ranks_per_host": per_host,
            "rank_start": forked or "+".join(started) or None,
            **({"rank_start_note": outcome.start_note} if outcome.start_note else {}),
            **({"warm": dict(outcome.warm)} if outcome.warm else {}),
            "timeline": [[name, at] for name, at in outcome.timeline()],
            "overhead_s": outcome.overhead_s,
        }

    def measure(
        self, scenario: BaseScenario, env: str, slowdown_pct: float | None, repeats: int, count_work: bool = False
    ) -> Measurement:
        """``repeats`` (0: the session's) fresh launches of a prepared scenario in ``env``,
        pooled; the first that fails ends the measurement. ``count_work``: each launch also counts
        what a step does, after its measured steps."""
        launches: list[LaunchOutcome] = []
        runs: list[ScenarioMetrics] = []
        work = scenario.step_work()
        for _ in range(repeats or self.settings.repeats):
            job = self.job(scenario, env, slowdown_pct, count_work=count_work)
            with self.devices_held(scenario), self.progress.watch(scenario.id, job.reports_dir):
                outcome = self.launcher_for(scenario).run(job)
            launches.append(outcome)
            self.note_nodes(outcome, env)
            if outcome.status != "ok":
                return Measurement(tuple(launches), None)
            runs.append(aggregate(outcome.reports, work, scenario.metrics))
        return Measurement(tuple(launches), pool(runs, scenario.metrics))

    def launch(
        self, scenario: BaseScenario, env: str, profile_steps: int = 0, trace: bool = False, explain_oom: bool = False
    ) -> tuple[LaunchOutcome, Path]:
        """One launch that profiles (:mod:`perfsuite.gate.profiling`): its outcome and its reports folder,
        where the ranks left their traces. Nothing is aggregated: its timings carry the profiler."""
        job = self.job(scenario, env, None, profile_steps, explain_oom, trace)
        with self.devices_held(scenario), self.progress.watch(f"{scenario.id} (profiled)", job.reports_dir):
            return self.launcher_for(scenario).run(job), job.reports_dir

    def note_nodes(self, outcome: LaunchOutcome, env: str = CURRENT) -> None:
        """Remember each node's runtime (reported by its local rank 0); another environment's apart."""
        if env != CURRENT:
            runtime = next((dict(r.runtime) for r in outcome.reports if r.rank == 0 and r.runtime), None)
            if runtime:
                self.env_runtime[env] = runtime
            return
        for report in outcome.reports:
            node = self.nodes.setdefault(report.host, {"ranks": []})
            if report.rank not in node["ranks"]:
                node["ranks"].append(report.rank)
            if report.runtime:
                node["runtime"] = dict(report.runtime)
                if report.rank == 0:
                    self.runtime = dict(report.runtime)

    def devices_held(self, scenario: BaseScenario) -> contextlib.AbstractContextManager[None]:
        """This host's GPUs, held for one launch so that no other run measures on
        them meanwhile (:mod:`perfsuite.launch.devicelock`); nothing on cpu."""
        if self.settings.profile.device != "cuda":
            return contextlib.nullcontext()
        settings = self.settings
        return devicelock.hold(self.gpu_keys(), scenario.id, settings.device_wait_s, _say, settings.lock_dir)

    def gpu_keys(self) -> tuple[str, ...]:
        """This host's GPUs as their locks name them: the card's UUID, which every container and
        CUDA_VISIBLE_DEVICES agree on; NVML's label (index) where the fingerprint has no UUID."""
        return tuple(str(gpu.get("uuid") or gpu["index"]) for gpu in self.fingerprint.get("gpus") or [])

    def gpu_labels(self) -> tuple[str, ...]:
        """This host's GPUs as NVML labels them (index, or UUID under CUDA_VISIBLE_DEVICES)."""
        return tuple(str(gpu["index"]) for gpu in self.fingerprint.get("gpus") or [])

    def job(
        self,
        scenario: BaseScenario,
        env: str = CURRENT,
        slowdown_pct: float | None = None,
        profile_steps: int = 0,
        explain_oom: bool = False,
        profile_trace: bool = False,
        count_work: bool = False,
    ) -> WorkerJob:
        """One launch of ``scenario`` in ``env``, in a fresh work folder; ``slowdown_pct``
        None plants the session's slowdown."""
        profile, settings = self.settings.profile, self.settings
        workdir = Path(tempfile.mkdtemp(prefix=f"{scenario.id}-", dir=self._workroot))
        timeout = settings.timeout_s or scenario.timeout_s or profile.timeout_s
        rank_job = RankJob(
            spec=scenario.rank_spec(),
            device=profile.device,
            reports_dir=str(workdir / "reports"),
            # A profiled launch is about time: the profiler's own records must not push a rank that fits
            # into the cpu memory limit over it. An OOM's explanation keeps the limit, to reproduce it.
            rank_memory_budget_mib=None if profile_steps else profile.rank_memory_budget_mib,
            device_memory_cap_mib=profile.device_memory_cap_mib,
            steady_threshold=profile.steady_threshold,
            slowdown_pct=settings.slowdown_pct if slowdown_pct is None else slowdown_pct,
            reference_mib=profile.reference_mib,
            profile_steps=profile_steps,
            profile_trace=profile_trace,
            explain_oom=explain_oom,
            count_work=count_work and not (profile_steps or explain_oom),
            imports=scenario.rank_imports(),
        )
        topology = self.topology(scenario)
        per_node = topology.ranks_per_node(scenario.world_size) if topology else None
        python = settings.envs[env]
        worker_env = {
            **(dict(settings.worker_env) if python.is_current else python.worker_env(settings.worker_env)),
            **launcher_env(),  # ranks exit if this process dies, even by SIGKILL
        }
        return WorkerJob(
            rank_job,
            scenario.world_size,
            timeout,
            workdir,
            worker_env,
            per_node,
            self.gpu_labels(),
            python.python,
            rank_start=profile.rank_start or "exec",  # resolved by the profile; never None
        )


def _say(message: str) -> None:
    """Tell the user now, past pytest's output capture (a wait can be minutes)."""
    print(message, file=sys.__stderr__, flush=True)
