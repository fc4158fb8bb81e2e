"""Guards of the pytest process: no scenario under pytest-xdist (parallel
scenarios measure each other), and a warning or an error when other processes use
the GPUs. Pytest side, torch-free.
"""

from __future__ import annotations

import warnings

import pytest

from perfsuite.launch.fingerprint import foreign_gpu_processes


class BusyGpuWarning(UserWarning):
    """Other processes were using the GPUs when the session started."""


def check_xdist(config: pytest.Config) -> None:
    """Scenarios on several pytest-xdist workers at once would measure each other."""
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        pytest.fail(
            f"perfsuite scenarios cannot run under pytest-xdist (this is worker {worker.get('workerid', '?')}): "
            "parallel scenarios share the machine and measure each other. Run them without -n "
            "(or with -p no:xdist); perfsuite's own self-tests may use -n, scenarios may not.",
            pytrace=False,
        )


def check_gpus_idle(config: pytest.Config) -> None:
    mode = config.getoption("--perf-gpu-busy")
    busy = foreign_gpu_processes() if mode != "ignore" else []
    if not busy:
        return
    listing = ", ".join(f"pid {p['pid']} on GPU {p['gpu']} ({p['used_mib']} MiB)" for p in busy)
    message = f"other processes use the GPUs, timings will be skewed: {listing}"
    if mode == "error":
        pytest.fail(message + " (--perf-gpu-busy=error)", pytrace=False)
    warnings.warn(BusyGpuWarning(message), stacklevel=1)
