"""pytest-benchmark export: a session's scenarios in pytest-benchmark's JSON
format and storage layout, so its own tools (``pytest-benchmark compare``,
``--histogram``, ``--csv``) work on perfsuite runs.

Each measured scenario is one benchmark whose rounds are its measured steps
(the slowest rank's time of each), so pytest-benchmark's ``ops`` is steps/s;
samples/s, tokens/s, peak memory, model-state bytes, the verdict and the
profile go in ``extra_info``. The statistics are computed by pytest-benchmark's
own ``Stats`` class and ``machine_info`` by its own generator, so the file is
what its CLI expects. pytest-benchmark is imported only when a flag is given.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from perfsuite.core import metrics as registry
from perfsuite.core.files import atomic_write_json, output_problem
from perfsuite.store.vcs import Commit, current_commit

JSON_FLAG = "--perf-benchmark-json"
SAVE_FLAG = "--perf-benchmark-save"
AUTOSAVE_FLAG = "--perf-benchmark-autosave"
STORAGE_FLAG = "--perf-benchmark-storage"
INSTALL = "pip install 'pytest-benchmark[histogram]>=4'"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perfsuite")
    group.addoption(
        JSON_FLAG,
        metavar="PATH",
        help="write the measured scenarios to PATH in pytest-benchmark's JSON format "
        "(rounds = measured steps; needs pytest-benchmark)",
    )
    group.addoption(
        SAVE_FLAG,
        metavar="NAME",
        help="save the run in pytest-benchmark's storage as <storage>/<machine-id>/NNNN_NAME.json",
    )
    group.addoption(
        AUTOSAVE_FLAG,
        action="store_true",
        help="save the run in pytest-benchmark's storage named after the commit and time, as --benchmark-autosave",
    )
    group.addoption(
        STORAGE_FLAG,
        metavar="DIR",
        help="pytest-benchmark storage folder for the two save flags (default: <rootdir>/.benchmarks)",
    )


def pytest_configure(config: pytest.Config) -> None:
    given = [f for f in (JSON_FLAG, SAVE_FLAG, AUTOSAVE_FLAG, STORAGE_FLAG) if config.getoption(f)]
    if not given:
        return
    try:
        from pytest_benchmark.utils import parse_save
    except ImportError:
        raise pytest.UsageError(f"{given[0]} needs pytest-benchmark: {INSTALL}") from None
    save = config.getoption(SAVE_FLAG)
    if save is not None:
        try:
            parse_save(save)  # pytest-benchmark's own rule for --benchmark-save names
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"{SAVE_FLAG}={save!r}: {exc}") from None
    if config.getoption(STORAGE_FLAG) and not (save or config.getoption(AUTOSAVE_FLAG)):
        raise pytest.UsageError(f"{STORAGE_FLAG} is where {SAVE_FLAG} or {AUTOSAVE_FLAG} save; give one of them")
    path, storage = config.getoption(JSON_FLAG), config.getoption(STORAGE_FLAG)
    if path is not None and Path(path).is_dir():
        raise pytest.UsageError(f"{JSON_FLAG} must name a file, got the folder {path!r}")
    if storage is not None and Path(storage).exists() and not Path(storage).is_dir():
        raise pytest.UsageError(f"{STORAGE_FLAG} must name a folder (created if missing), got the file {storage!r}")
    for flag, given, folder in ((JSON_FLAG, path, False), (STORAGE_FLAG, storage, True)):
        problem = output_problem(flag, given, folder)
        if problem:
            raise pytest.UsageError(problem)


def pytest_perfsuite_session_finished(config: pytest.Config, document: dict[str, Any]) -> None:
    path, save, autosave = (config.getoption(f) for f in (JSON_FLAG, SAVE_FLAG, AUTOSAVE_FLAG))
    if not (path or save or autosave):
        return
    commit = current_commit(config.rootpath)
    output = benchmark_document(document, commit, project=config.rootpath.name)
    written = []
    if path:
        atomic_write_json(Path(path), output)
        written.append(Path(path))
    if save or autosave:
        storage = Path(config.getoption(STORAGE_FLAG) or config.rootpath / ".benchmarks")
        written += [save_in_storage(storage, output, name) for name in (save, autosave and tag(commit)) if name]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for file in written:
            reporter.write_line(f"perfsuite pytest-benchmark file: {file}")


def benchmark_document(document: Mapping[str, Any], commit: Commit, project: str) -> dict[str, Any]:
    """The results document as pytest-benchmark's JSON (its ``pytest_benchmark_generate_json`` layout)."""
    from datetime import datetime, timezone

    from pytest_benchmark import __version__
    from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info

    machine = pytest_benchmark_generate_machine_info()
    # perfsuite's fingerprint (GPUs, driver, packages) beside pytest-benchmark's own fields.
    machine["perfsuite"] = {"profile": document.get("profile"), "fingerprint": document.get("machine", {})}
    return {
        "machine_info": machine,
        "commit_info": {
            "id": commit.id or "unversioned",  # pytest-benchmark's word outside a checkout
            "time": commit.time,
            "author_time": commit.author_time,
            "dirty": commit.dirty,
            "project": project,
            "branch": commit.branch or "(unknown)",
        },
        "benchmarks": [b for r in document.get("results", []) if (b := benchmark(r, document)) is not None],
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": __version__,
    }


def benchmark(result: Mapping[str, Any], document: Mapping[str, Any]) -> dict[str, Any] | None:
    """One scenario as a pytest-benchmark benchmark; None if it measured no steps."""
    from pytest_benchmark.stats import Stats

    metrics = result.get("metrics") or {}
    steps = metrics.get("step_times_s") or []
    if result.get("status") != "ok" or not steps:
        return None
    stats = Stats()
    for seconds in steps:
        stats.update(seconds)
    return {
        "group": result.get("group"),
        "name": result["id"],
        "fullname": result["id"],
        "params": None,
        "param": None,
        "extra_info": extra_info(result, document),
        "options": {
            "timer": "perfsuite: slowest rank's step",
            "warmup": metrics.get("steady_state_start", 0),
            "min_rounds": len(steps),
            "max_time": 0,
            "disable_gc": False,
        },
        "stats": {**stats.as_dict(), "data": list(steps), "iterations": 1},
    }


def extra_info(result: Mapping[str, Any], document: Mapping[str, Any]) -> dict[str, Any]:
    """Every registered metric's value (and spread), verdict, status and profile."""
    info: dict[str, Any] = {
        "profile": document.get("profile"),
        "verdict": result.get("verdict"),
        "status": result.get("status"),
        "world_size": (result.get("config") or {}).get("world_size"),
    }
    for name, value in (result.get("metrics") or {}).items():
        if name not in registry.METRICS:
            continue
        if isinstance(value, Mapping) and "mean" in value:
            info[name], info[f"{name}_std"] = value["mean"], value.get("std")
        else:
            info[name] = value
    return info


def tag(commit: Commit) -> str:
    """pytest-benchmark's autosave name: commit, UTC time, and a mark for uncommitted changes."""
    from pytest_benchmark.utils import get_current_time

    parts = [commit.id or "unversioned", get_current_time()]
    return "_".join([*parts, "uncommitted-changes"] if commit.dirty else parts)


def save_in_storage(storage: Path, output: Mapping[str, Any], name: str) -> Path:
    """Write ``output`` as pytest-benchmark's FileStorage does: the next free
    NNNN_ number in this interpreter's machine-id folder."""
    from pytest_benchmark.utils import get_machine_id

    folder = storage / get_machine_id()
    numbers = [int(f.name[:4]) for f in folder.glob("[0-9][0-9][0-9][0-9]_*.json")] if folder.is_dir() else []
    path = folder / f"{max(numbers, default=0) + 1:04}_{name}.json"
    atomic_write_json(path, output)
    return path
