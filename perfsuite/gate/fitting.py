"""Whether a scenario can run on this machine, and at what size.

``fit_to_hardware`` shrinks a GPU scenario's world size to the GPUs here (all
nodes' under a multi-node launcher); ``launch_precondition`` says why a
resolved scenario cannot run here (another profile, CUDA only, too many ranks
or GPUs, a layout the nodes cannot hold), before anything launches, and
``launch_missing`` the engine package behind such a reason, as data. The
session, ``doctor`` and the bootstrap's plan all decide with these. Pytest
side, torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfsuite.core.engines import MissingPackage
from perfsuite.core.profiles import HardwareProfile
from perfsuite.core.workloads.base import BaseScenario
from perfsuite.launch.torchrun import Topology, TopologyError


@dataclass(frozen=True)
class Fit:
    """A resolved scenario as this machine runs it: at the world size its GPUs hold, why it cannot
    launch here (None if it can), and the engine package whose absence that is (a run groups such
    rows by the extra to install, and ``doctor`` fails on them)."""

    scenario: BaseScenario
    skip: str | None = None
    missing: MissingPackage | None = None


def fit(
    resolved: BaseScenario,
    profile: HardwareProfile,
    fingerprint: Mapping[str, Any],
    topology: Topology | None,
    env_problem: str | None,
) -> Fit:
    """``resolved`` fitted to this machine and judged launchable, in one decision: ``env_problem``
    (why its Python environment cannot run here) comes first, then :func:`launch_precondition`."""
    fitted = fit_to_hardware(resolved, profile, fingerprint, topology)
    if env_problem is not None:
        return Fit(fitted, env_problem)
    skip = launch_precondition(fitted, profile, fingerprint, topology)
    return Fit(fitted, skip, launch_missing(fitted, profile) if skip is not None else None)


def fit_to_hardware(
    scenario: BaseScenario, profile: HardwareProfile, fingerprint: Mapping[str, Any], topology: Topology | None
) -> BaseScenario:
    """On a GPU profile, the scenario at a world size this machine's GPUs hold
    (all nodes' under a multi-node launcher); elsewhere unchanged."""
    if profile.device != "cuda":
        return scenario
    return scenario.fit(gpu_capacity(fingerprint, topology)[0])


def gpu_capacity(fingerprint: Mapping[str, Any], topology: Topology | None) -> tuple[int, str]:
    """GPUs a run can use (every node with this host's GPUs, split among the
    agents that share this host), and how that count came about."""
    gpus = int(fingerprint.get("gpu_count", 0))
    if topology is None:
        return gpus, f"1 node(s) here have {gpus}"
    sharing = topology.hosts_sharing
    per_node = gpus // sharing
    if sharing > 1:
        where = f"{topology.nnodes} node(s) emulated on this host share its {gpus} GPU(s): {per_node} each"
        return per_node * topology.nnodes, where
    return per_node * topology.nnodes, f"{topology.nnodes} node(s) here have {per_node * topology.nnodes}"


def launch_precondition(
    scenario: BaseScenario, profile: HardwareProfile, fingerprint: Mapping[str, Any], topology: Topology | None
) -> str | None:
    """Why ``scenario`` (resolved for ``profile``) cannot run here, or None if it can."""
    if not _on_profile(scenario, profile):
        return f"runs on {', '.join(scenario.only_on)} profiles only; this is {profile.name}"
    reason = scenario.precondition(profile.device)
    if reason:
        return reason
    if profile.max_world_size and scenario.world_size > profile.max_world_size:
        return (
            f"needs {scenario.world_size} ranks; profile {profile.name} runs at most "
            f"{profile.max_world_size} (one machine's cores)"
        )
    if profile.device == "cuda":
        gpus, where = gpu_capacity(fingerprint, topology)
        if scenario.world_size > gpus:
            sizes = sorted({scenario.world_size, *scenario.world_sizes})
            need = (
                f"at least {sizes[0]} GPUs (runs on {', '.join(map(str, sizes))})"
                if len(sizes) > 1
                else f"{sizes[0]} GPUs"
            )
            return f"needs {need}, {where}"
    if topology is not None:
        try:
            topology.ranks_per_node(scenario.world_size)
        except TopologyError as exc:
            return str(exc)
    return None


def launch_missing(scenario: BaseScenario, profile: HardwareProfile) -> MissingPackage | None:
    """The engine package whose absence is the reason :func:`launch_precondition` gives for
    ``scenario`` here (None when it gives another, or none), as data: a run groups such rows by
    the extra to install, and ``doctor`` fails on them."""
    return scenario.missing_package(profile.device) if _on_profile(scenario, profile) else None


def _on_profile(scenario: BaseScenario, profile: HardwareProfile) -> bool:
    return not scenario.only_on or bool(set(scenario.only_on) & set(profile.variant_keys))
