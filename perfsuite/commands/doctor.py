"""``python -m perfsuite doctor``: can this machine run the suite, and what would it run?

It reports the machine's fingerprint and profile, which engines can run here
and import, which benchmark scenarios would run or skip and why (the same
checks a run makes before launching), and smoke-runs every available engine
for two steps on this hardware (a tiny model, through torchrun and the real
worker). It exits 1 when something that should work here does not: an engine
whose packages are installed fails to import, or its smoke run fails; or when a
selected scenario needs an engine whose package is not installed (named by the
extra that installs it: a run would only skip those rows, which is easy to miss).

Runs in the pytest side's process: torch is imported only by the ranks and by
one import-check subprocess.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.commands.collection import collect
from perfsuite.core.engines import ENGINES, EngineSpec
from perfsuite.core.models import ModelSpec
from perfsuite.core.profiles import HardwareProfile
from perfsuite.core.protocol import RankJob
from perfsuite.core.workloads import Precision, Scenario, ScenarioError
from perfsuite.gate.fitting import Fit, fit
from perfsuite.judge.coverage import NotInstalled, Outcome, not_installed
from perfsuite.launch.base import WorkerJob
from perfsuite.launch.identity import describe_card, processor_text
from perfsuite.launch.torchrun import LocalTorchrun

SMOKE_TIMEOUT_S = 180.0
IMPORT_CHECK = """
import json, sys
from perfsuite.core.protocol import import_object
found = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        import_object(path)
        found[name] = ""
    except BaseException as exc:
        found[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(found))
"""


@dataclass(frozen=True)
class EngineCheck:
    name: str
    unavailable: str | None  # why it cannot run here by its spec (None if it can)
    import_error: str = ""
    smoke: str = ""  # "ok", "skipped: ...", or the failure
    smoke_s: float = 0.0

    @property
    def broken(self) -> bool:
        """It should work here (not unavailable by spec) but does not."""
        return not self.unavailable and (bool(self.import_error) or self.smoke not in ("", "ok"))


def import_errors(engines: Sequence[EngineSpec]) -> dict[str, str]:
    """Each engine's implementation imported in one subprocess (it imports torch)."""
    paths = json.dumps({e.name: e.implementation for e in engines})
    done = subprocess.run([sys.executable, "-c", IMPORT_CHECK, paths], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {e.name: f"import check failed: {done.stderr.strip()[-500:]}" for e in engines}
    found: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def smoke_scenario(engine: EngineSpec, profile: HardwareProfile, gpus: int) -> Scenario:
    """Two steps of a tiny model through ``engine`` on 2 ranks (1 on a single GPU)."""
    world = 2 if profile.device == "cpu" else max(1, min(2, gpus))
    family = engine.model_families[0] if engine.model_families else "gpt2"
    model = ModelSpec(family, layers=2, hidden=64, heads=2, vocab=512, max_positions=64)
    precision: Precision = "bf16" if profile.device == "cpu" else "fp16"  # no fast fp16 kernels on CPUs
    name = re.sub(r"[^a-z0-9_-]+", "_", engine.name.lower())  # user engines are named by module:Class
    return Scenario(
        "doctor",
        name,
        model,
        precision=precision,
        strategy=engine.name,
        strategy_options=engine.smoke_options,
        world_size=world,
        micro_batch=2,
        global_batch=2 * world,
        seq_len=32,
        warmup_steps=1,
        max_warmup_steps=1,
        steps=2,
    )


def smoke(engine: EngineSpec, profile: HardwareProfile, gpus: int, workdir: Path) -> tuple[str, float]:
    try:
        scenario = smoke_scenario(engine, profile, gpus)
    except ScenarioError as exc:
        return f"cannot build a smoke scenario (set EngineSpec.smoke_options): {exc}", 0.0
    job = RankJob(spec=scenario.rank_spec(), device=profile.device, reports_dir=str(workdir / "reports"))
    outcome = LocalTorchrun().run(WorkerJob(job, scenario.world_size, SMOKE_TIMEOUT_S, workdir))
    if outcome.status == "ok":
        return "ok", outcome.wall_s
    if outcome.status == "skipped":
        return f"skipped: {outcome.skip_reason}", outcome.wall_s
    detail = outcome.failure.describe() if outcome.failure else ""
    return f"{outcome.status}: {detail}", outcome.wall_s


def check_engines(
    profile: HardwareProfile, gpus: int, names: Sequence[str] | None, run_smoke: bool
) -> list[EngineCheck]:
    engines = [e for e in ENGINES if names is None or e.name in names]
    checks = {e.name: EngineCheck(e.name, e.unavailable(profile.device)) for e in engines}
    runnable = [e for e in engines if not checks[e.name].unavailable]
    errors = import_errors(runnable) if runnable else {}
    for engine in runnable:
        check = EngineCheck(engine.name, "", errors.get(engine.name, ""))
        if run_smoke and not check.import_error:
            with tempfile.TemporaryDirectory(prefix=f"perfsuite-doctor-{engine.name}-") as tmp:
                result, seconds = smoke(engine, profile, gpus, Path(tmp))
            check = EngineCheck(engine.name, "", "", result, seconds)
        checks[engine.name] = check
    return list(checks.values())


def uninstalled(fits: Iterable[Fit]) -> tuple[NotInstalled, ...]:
    """The scenarios that skip because their engine's package is not installed, by the extra to install."""
    return not_installed(
        Outcome(f.scenario.id, "skipped", f.skip, missing=f.missing) for f in fits if f.skip is not None
    )


def describe_machine(fingerprint: dict[str, Any], profile: HardwareProfile) -> list[str]:
    gpus = fingerprint.get("gpus") or []
    names = ", ".join(f"{describe_card(g)}, {g['memory_mib']} MiB" for g in gpus) or "none"
    links = f", {fingerprint['interconnect']}" if fingerprint.get("interconnect") else ""
    cpu = processor_text(fingerprint)
    lines = [
        f"machine: {fingerprint.get('host')} ({cpu}, Python {fingerprint.get('python')})",
        f"GPUs: {len(gpus)}: {names}" + (f" (driver {fingerprint['driver']}{links})" if gpus else ""),
        f"profile: {profile.name} (device {profile.device})",
        "packages: " + ", ".join(f"{k} {v}" for k, v in sorted(fingerprint.get("packages", {}).items())),
    ]
    return lines


def run(
    paths: Sequence[str],
    keyword: str | None,
    engine_names: Sequence[str] | None,
    run_smoke: bool,
    profile_name: str | None = None,
) -> int:
    unknown = sorted(set(engine_names or ()) - {e.name for e in ENGINES})
    if unknown:
        known = ", ".join(e.name for e in ENGINES)
        print(f"perfsuite doctor: --engines names no engine {', '.join(unknown)}; known: {known}", file=sys.stderr)
        return 2
    found = collect(paths, keyword, profile_name)
    if found.profile is None:
        print(f"perfsuite doctor: {found.problem}", file=sys.stderr)
        return 2
    fingerprint, profile, errors = found.fingerprint, found.profile, found.errors
    scenarios = list(found.scenarios.values())
    gpus = int(fingerprint.get("gpu_count", 0))
    print("\n".join(describe_machine(fingerprint, profile)), flush=True)

    print("\nengines" + (" (import check and a 2-step smoke run each):" if run_smoke else " (import check):"))
    start = time.monotonic()
    checks = check_engines(profile, gpus, engine_names, run_smoke)
    for c in checks:
        state = (
            f"skip: {c.unavailable}"
            if c.unavailable
            else (f"import failed: {c.import_error}" if c.import_error else "imports")
        )
        if c.smoke:
            state += f"; smoke {c.smoke} ({c.smoke_s:.1f} s)"
        print(f"  {c.name:<16} {state}")
    print(f"  ({time.monotonic() - start:.0f} s)")

    fits = [fit(s.resolve(profile.variant_keys), profile, fingerprint, None, None) for s in scenarios]
    runs = sum(1 for f in fits if f.skip is None)
    print(f"\nscenarios in {' '.join(paths)}: {runs} would run, {len(scenarios) - runs} skip")
    for f in fits:
        state = f"run on {f.scenario.world_size} rank(s)" if f.skip is None else f"skip: {f.skip}"
        print(f"  {f.scenario.id:<44} {state}")

    broken = [c for c in checks if c.broken]
    problems = [f"engine {c.name}: {c.import_error or c.smoke}" for c in broken]
    problems += [group.describe() for group in uninstalled(fits)]
    if errors:
        problems.append(f"{errors} benchmark module(s) failed to collect: run pytest --collect-only {' '.join(paths)}")
    if not scenarios:
        problems.append(f"no scenario collected from {' '.join(paths)}")
    print("\n" + ("result: OK" if not problems else "result: PROBLEMS\n  " + "\n  ".join(problems)))
    return 1 if problems else 0
