"""How each kind of bootstrap step runs: a pytest run of exactly its scenarios
(node ids, never ``-k`` substrings: ``n1_tp8_pp1`` is a prefix of its
megatron-core twin), a ``selftest`` subprocess, or the in-process doctor.

Every subprocess runs in its own process group with the time left as its
limit; at the limit it gets SIGTERM (perfsuite's pytest then stops its agents
and ranks) and SIGKILL 15 s later (:func:`perfsuite.launch.procs.stop_group`), and the step counts as interrupted.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.commands.bootstrap.plan import Plan, Step
from perfsuite.commands.bootstrap.probe import idle_readings
from perfsuite.commands.bootstrap.state import Status, StepRecord
from perfsuite.core.files import atomic_write_json, atomic_write_text
from perfsuite.launch import procs

#: Verdicts of a scenario that leave its step done (other_machine: its memory judged, its
#: timing not, against a baseline from another processor the plan did not record again).
GOOD = ("recorded", "pass", "improved", "expected_oom", "other_machine")
LOG_TAIL = 1500


@dataclass(frozen=True)
class Context:
    python: str
    profile: str
    baselines: Path
    out: Path
    pytest_args: tuple[str, ...] = ()
    """Further pytest arguments from the command line, passed to every run."""
    levels: tuple[float, ...] = (0.0, 3.0, 5.0, 10.0)
    trials: int = 2

    def results_path(self, step: Step) -> Path:
        return self.out / "results" / f"{safe(step.key)}.json"

    def log_path(self, step: Step) -> Path:
        return self.out / "logs" / f"{safe(step.key)}.log"

    def pytest(self, nodeids: Sequence[str], results: Path, *flags: str) -> list[str]:
        return [
            self.python,
            "-m",
            "pytest",
            *nodeids,
            "-q",
            "-p",
            "no:cacheprovider",
            f"--perf-profile={self.profile}",
            f"--perf-baselines={self.baselines}",
            f"--perf-json={results}",
            *flags,
            *self.pytest_args,
        ]


def safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in key)


def run_logged(cmd: Sequence[str], log: Path, timeout_s: float) -> int | None:
    """Exit status of ``cmd`` (output to ``log``), or None when it ran out of time and was stopped.
    Stopped with its processes too when the bootstrap itself is (:func:`perfsuite.launch.procs.stoppable`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write("+ " + " ".join(cmd) + "\n")
        handle.flush()
        with procs.stoppable(cmd, stdout=handle, stderr=subprocess.STDOUT) as proc:
            try:
                return proc.wait(timeout=max(1.0, timeout_s))
            except subprocess.TimeoutExpired:
                procs.stop_group(proc)
                return None


def tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL:]
    except OSError:
        return ""


def read_results(path: Path) -> list[dict[str, Any]]:
    try:
        results: list[dict[str, Any]] = json.loads(path.read_text())["results"]
        return results
    except (OSError, ValueError, KeyError, TypeError):
        return []


def judge(step: Step, results: Sequence[Mapping[str, Any]], code: int | None, log: Path) -> tuple[Status, str]:
    """(status, message) of a pytest step from what its results file says of each target."""
    if code is None:
        return "interrupted", "stopped at the budget's end; rerun to resume"
    by_id = {r["id"]: r for r in results}
    missing = [t.id for t in step.targets if t.id not in by_id]
    if missing:
        return "failed", f"pytest exited {code} without results for {', '.join(missing)}: {tail(log)}"
    verdicts = {t.id: by_id[t.id]["verdict"] for t in step.targets}
    # A seed shape that does not fit this card is a finding, not a failure; recording
    # its OOM as expected is a person's call (--perf-accept-oom), so it is left at that.
    verdicts = {i: "skipped" if v == "unexpected_oom" else v for i, v in verdicts.items()}
    bad = {i: v for i, v in verdicts.items() if v not in GOOD and v != "skipped"}
    if bad:
        why = "; ".join(f"{i}: {v}: {by_id[i].get('message', '')[:300]}" for i, v in bad.items())
        status: Status = "unreliable" if set(bad.values()) == {"unreliable"} else "failed"
        return status, why
    if all(v == "skipped" for v in verdicts.values()):
        return "skipped", "; ".join(f"{i}: {by_id[i].get('message', '')}" for i in verdicts)
    return "done", ", ".join(f"{i}: {v}" for i, v in verdicts.items())


def pytest_step(step: Step, ctx: Context, timeout_s: float, done: frozenset[str]) -> tuple[StepRecord, list[Any]]:
    """A ceilings, baseline or cv step: record (or, for ceilings already recorded, judge) its scenarios."""
    results_path, log = ctx.results_path(step), ctx.log_path(step)
    results_path.unlink(missing_ok=True)
    nodeids = [t.nodeid for t in step.targets]
    # Only a baseline step stores an op profile (one more launch each); the others would pay for one on
    # every judged regression or calibration, which the budget's estimates do not hold.
    if step.kind == "cv":
        flags: tuple[str, ...] = ("--perf-calibrate", f"--perf-repeats={step.launches}", "--perf-op-profiles=off")
    elif step.kind == "ceilings" and all(t.id in done for t in step.targets):
        flags = ("--perf-op-profiles=off",)  # same-session figures, judged against the recorded ones
    else:
        flags = ("--perf-update-baselines",)
    start = time.monotonic()
    code = run_logged(ctx.pytest(nodeids, results_path, *flags), log, timeout_s)
    results = read_results(results_path)
    status, message = judge(step, results, code, log)
    return StepRecord(status, time.monotonic() - start, step.estimate_s, message), results


def selftest_table(step: Step, ctx: Context) -> Path:
    """Where the selftest's detection table is kept, level by level, across runs."""
    return ctx.out / f"{safe(step.key)}.json"


def selftest_rows(step: Step, ctx: Context) -> list[dict[str, Any]]:
    """The levels an earlier, stopped run of this selftest already measured (of this run's levels)."""
    try:
        rows = json.loads(selftest_table(step, ctx).read_text())["levels"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [r for r in rows if isinstance(r, dict) and r.get("level") in ctx.levels]


def selftest_left(step: Step, ctx: Context) -> float:
    """The share of this selftest's levels still to measure (1.0 when none was)."""
    return 1.0 - len(selftest_rows(step, ctx)) / max(1, len(ctx.levels))


def selftest_step(step: Step, ctx: Context, timeout_s: float) -> tuple[StepRecord, dict[str, Any]]:
    """The gate against its own baseline with real extra work planted per step.

    The selftest writes its table after every level, so a run stopped at the
    budget's end keeps the levels it finished, and the next run measures only
    the others (GPU time is scarce: the first H100 run lost a whole selftest).
    """
    (target,) = step.targets
    table, part = selftest_table(step, ctx), ctx.out / f"{safe(step.key)}.part.json"
    done = selftest_rows(step, ctx)
    todo = [x for x in ctx.levels if x not in {r["level"] for r in done}]
    part.unlink(missing_ok=True)
    cmd = [
        ctx.python,
        "-m",
        "perfsuite",
        "selftest",
        target.nodeid,
        "-k",
        target.id,
        "--trials",
        str(ctx.trials),
        "--levels",
        ",".join(f"{x:g}" for x in todo),
        "--json",
        str(part),
        f"--perf-profile={ctx.profile}",
        f"--perf-baselines={ctx.baselines}",
        *ctx.pytest_args,
    ]
    start = time.monotonic()
    code = run_logged(cmd, ctx.log_path(step), timeout_s) if todo else 0
    wall = time.monotonic() - start
    doc = _merged(table, part, done, ctx.levels)
    if code is None:
        kept = f"; {len(doc['levels'])} of {len(ctx.levels)} level(s) kept" if doc["levels"] else ""
        return StepRecord(
            "interrupted", wall, step.estimate_s, f"stopped at the budget's end{kept}; rerun to resume"
        ), {}
    if code != 0 or len(doc["levels"]) < len(ctx.levels):
        return StepRecord("failed", wall, step.estimate_s, f"selftest exited {code}: {tail(ctx.log_path(step))}"), {}
    summary = ", ".join(f"{r['level']:g}%: {r['failed']}/{r['trials']}" for r in doc["levels"])
    return StepRecord("done", wall, step.estimate_s, f"{target.id} failed the gate at {summary}"), doc


def _merged(table: Path, part: Path, done: list[dict[str, Any]], levels: Sequence[float]) -> dict[str, Any]:
    """The levels kept from earlier runs and those this run wrote, in ``levels`` order, saved to ``table``."""
    try:
        new = json.loads(part.read_text())
    except (OSError, ValueError):
        new = {"levels": []}
    by_level = {r["level"]: r for r in [*done, *new.get("levels", [])]}
    doc = {**new, "levels": [by_level[x] for x in levels if x in by_level]}
    doc.setdefault("ab", None)
    atomic_write_json(table, doc)
    part.unlink(missing_ok=True)
    return doc


def doctor_step(
    ctx: Context, plan: Plan, fingerprint: Mapping[str, Any], profile: Any
) -> tuple[StepRecord, dict[str, Any]]:
    """Fingerprint, profile, engines that import (no smoke runs: the steps are the smoke runs), NVML at idle."""
    from perfsuite.commands.doctor import check_engines, describe_machine

    start = time.monotonic()
    engines = check_engines(profile, int(fingerprint.get("gpu_count", 0)), None, run_smoke=False)
    idle = idle_readings()
    facts: dict[str, Any] = {
        "machine": describe_machine(dict(fingerprint), profile),
        "packages": dict(fingerprint.get("packages", {})),
        "driver": fingerprint.get("driver"),
        "engines": {e.name: e.unavailable or e.import_error or "imports" for e in engines},
        "idle": idle,
        "plan": plan.to_json(),
    }
    atomic_write_json(ctx.out / "doctor.json", facts)
    lines = [*facts["machine"], "engines:", *(f"  {k}: {v}" for k, v in facts["engines"].items()), "GPUs at idle:"]
    lines += [f"  {g}" for g in idle["gpus"]] or [f"  none ({idle['note']})"]
    atomic_write_text(ctx.out / "doctor.txt", "\n".join(lines) + "\n")
    throttled = [str(g["index"]) for g in idle["gpus"] if g["throttled_at_idle"]]
    note = f"; GPU {', '.join(throttled)} throttled at idle" if throttled else ""
    broken = [e.name for e in engines if e.broken]
    message = f"profile {ctx.profile}, {len(plan.targets)} scenario(s) fit here, {len(plan.not_here)} do not{note}"
    if broken:
        message += f"; engines that should import but do not: {', '.join(broken)}"
    return StepRecord("done", time.monotonic() - start, 0.0, message), facts
