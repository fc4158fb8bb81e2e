"""This run's machine as the plugin sees it: its fingerprint, its hardware
profile (with the price the command line or ini set, and how ranks start when
the command line chose it) and the launcher that starts its workers, each made
once per run and kept in the config's stash. Pytest side, torch-free.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from perfsuite.core.profiles import HardwareProfile, ProfileError, ProfileRegistry, profile_for
from perfsuite.launch import Launcher
from perfsuite.launch.fingerprint import machine_fingerprint
from perfsuite.launch.slurm import SlurmLauncher
from perfsuite.launch.torchrun import LocalTorchrun, Topology, TopologyError, TorchrunLauncher

PROFILE_KEY = pytest.StashKey[HardwareProfile]()
FINGERPRINT_KEY = pytest.StashKey[dict]()


def fingerprint(config: pytest.Config) -> dict[str, Any]:
    """This machine's fingerprint, taken once per run."""
    if FINGERPRINT_KEY not in config.stash:
        config.stash[FINGERPRINT_KEY] = machine_fingerprint()
    return config.stash[FINGERPRINT_KEY]


def profile(config: pytest.Config) -> HardwareProfile:
    """The run's hardware profile: --perf-profile, else a plugin's key, else detected; priced."""
    if PROFILE_KEY in config.stash:
        return config.stash[PROFILE_KEY]
    machine = fingerprint(config)
    registry = ProfileRegistry()
    for extra in config.hook.pytest_perfsuite_profiles():
        registry = registry.with_extra(extra or [])
    name = (
        config.getoption("--perf-profile")
        or config.hook.pytest_perfsuite_hardware_key(fingerprint=machine)
        or profile_for(machine)
    )
    try:
        found = registry.get(name, machine)
    except ProfileError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[PROFILE_KEY] = _started(config, _priced(config, found))
    return config.stash[PROFILE_KEY]


def _started(config: pytest.Config, profile: HardwareProfile) -> HardwareProfile:
    """The profile with how ranks start, when ``--perf-rank-start`` chose it for this run."""
    chosen = config.getoption("--perf-rank-start")
    return replace(profile, rank_start=chosen) if chosen else profile


def _priced(config: pytest.Config, profile: HardwareProfile) -> HardwareProfile:
    """The profile with the price and currency the command line or ini set."""
    price: Any = config.getoption("--perf-gpu-hour-price")
    if price is None and config.getini("perf_gpu_hour_price"):
        try:
            price = float(config.getini("perf_gpu_hour_price"))
        except ValueError:
            raise pytest.UsageError(
                f"ini option perf_gpu_hour_price must be a number, got {config.getini('perf_gpu_hour_price')!r}"
            ) from None
    if price is not None and not (math.isfinite(price) and price >= 0):
        raise pytest.UsageError(f"--perf-gpu-hour-price (ini: perf_gpu_hour_price) must be >= 0, got {price}")
    currency = config.getoption("--perf-currency") or config.getini("perf_currency") or profile.currency
    return replace(profile, gpu_hour_price=price if price is not None else profile.gpu_hour_price, currency=currency)


def launcher(config: pytest.Config) -> Launcher:
    kind = config.getoption("--perf-launcher")
    nproc = config.getoption("--perf-nproc-per-node")
    try:
        if kind == "slurm":
            return SlurmLauncher.from_env(nproc)
    except TopologyError as exc:
        raise pytest.UsageError(str(exc)) from None
    if kind == "local":
        return LocalTorchrun()
    topology = Topology(
        nnodes=config.getoption("--perf-nnodes"),
        nproc_per_node=nproc,
        rdzv_endpoint=config.getoption("--perf-rdzv-endpoint"),
        local_agents=config.getoption("--perf-local-agents"),
    )
    return TorchrunLauncher(topology)
