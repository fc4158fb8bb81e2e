"""Command line: ``python -m perfsuite calibrate|selftest|doctor|bootstrap|profile|history|report|summary|explain|init|ab-rev|bisect|compare``.

``profile`` prints this machine's profile as the gate picks it, after the repository's
conftest hooks (:mod:`perfsuite.commands.collection`); ``doctor``, ``bootstrap`` and the workflow
``init`` writes use the same.

``explain`` prints, from a results file, why each regressed scenario got
slower: its op profile against the one stored with its baseline
(:mod:`perfsuite.judge.explain`).

``bootstrap`` makes this runner's profile ready to judge within a time budget
(:mod:`perfsuite.commands.bootstrap`).

``history`` shows a scenario's metric over the commits of a ``--perf-history``
store with its change points (:mod:`perfsuite.commands.history`); ``report``
renders a results file as one HTML page and ``summary`` as a text or markdown
table (:mod:`perfsuite.reports.html`).

``doctor`` says whether this machine can run the suite: fingerprint and
profile, which engines import and pass a 2-step smoke run, which scenarios
would run or skip here and why (see :mod:`perfsuite.commands.doctor`).

``selftest --simulate`` computes the false-alarm and detection rates from measured variance
components, in seconds (:mod:`perfsuite.judge.simulate`). ``selftest`` proves the gate on this runner: it runs the selected scenarios
against their committed baselines ``--trials`` times at each planted slowdown
(``--perf-inject-slowdown``, real extra device work per step) and prints how
often the gate failed. The 0% row is the false-alarm rate.

``calibrate`` runs the selected scenarios N times with fresh workers and
writes into their baselines the metric values and recommended tolerances (3
sigma of the spread between launches), which later runs then use. It is
``pytest <paths> --perf-calibrate --perf-repeats N``, with this machine's
profile and any further pytest arguments. A calibration on another machine of
the profile is pooled with the ones the baseline holds; ``calibrate --pool
FILE_OR_DIR...`` pools the baselines or results files brought from several
runners without launching anything (:mod:`perfsuite.commands.bootstrap.pool`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from perfsuite.commands import abrev as revab
from perfsuite.commands import bisect as bisectcmd
from perfsuite.commands import collection
from perfsuite.commands import compare as comparecmd
from perfsuite.commands import explain as explaincmd
from perfsuite.commands import history as historycmd
from perfsuite.commands import init as scaffold
from perfsuite.commands import report as htmlreport_cli
from perfsuite.commands.bootstrap import pool
from perfsuite.commands.cliargs import INTERRUPTED, at_least, duration, levels
from perfsuite.core.files import atomic_write_json
from perfsuite.launch import procs, warm


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfsuite", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    calibrate = commands.add_parser("calibrate", help="measure repeatedly and write recommended tolerances")
    calibrate.add_argument("paths", nargs="*", default=["bench_tests"], help="test paths (default bench_tests)")
    calibrate.add_argument("-k", dest="keyword", help="pytest -k expression selecting scenarios")
    calibrate.add_argument("--repeats", type=at_least(2), default=10, help="fresh launches per scenario (default 10)")
    pool.add_arguments(calibrate)  # --pool: calibrations brought from several runners
    selftest = commands.add_parser("selftest", help="measure the gate's detection and false-alarm rates")
    selftest.add_argument("paths", nargs="*", default=["bench_tests"], help="test paths (default bench_tests)")
    selftest.add_argument("-k", dest="keyword", help="pytest -k expression (one scenario is best; not with --simulate)")
    selftest.add_argument(
        "--levels", type=levels, help="slowdowns in %% (default 0,25,50,100; with --simulate 0,3,5,10)"
    )
    selftest.add_argument("--trials", type=at_least(1), default=10, help="runs per level (default 10)")
    selftest.add_argument("--json", type=Path, metavar="PATH", help="also write the table as JSON to PATH")
    selftest.add_argument(
        "--ab",
        metavar="BASE,CANDIDATE",
        help="test the interleaved A/B instead of the stored-baseline gate: the slowdown is planted in the "
        "candidate (pass --perf-env and --perf-repeats through)",
    )
    selftest.add_argument(
        "--simulate",
        action="store_true",
        help="compute the rates from measured variance components instead (seconds, nothing run)",
    )
    selftest.add_argument(
        "--perf-profile",
        "--profile",
        dest="profile",
        action="append",
        help="--simulate: profiles, repeatable or comma-separated (default: all measured)",
    )
    selftest.add_argument(
        "--baselines",
        type=Path,
        default=Path("baselines"),
        help="--simulate: baselines folder whose rows it sizes (default baselines)",
    )
    selftest.add_argument(
        "--draws", type=at_least(100), default=100_000, help="--simulate: runs a level (default 100000)"
    )
    selftest.add_argument(
        "--max-pairs",
        "--pairs",
        dest="max_pairs",
        type=at_least(2),
        help="--simulate: the sequential A/B's most pairs (default: the A/B's, 8)",
    )
    selftest.add_argument("--seed", type=int, default=0, help="--simulate: random seed (default 0)")
    doctor = commands.add_parser("doctor", help="check this machine: engines, scenarios that would run, smoke runs")
    doctor.add_argument("paths", nargs="*", default=["bench_tests"], help="test paths (default bench_tests)")
    doctor.add_argument("-k", dest="keyword", help="pytest -k expression selecting scenarios")
    doctor.add_argument("--engines", help="comma-separated engines to check (default: all)")
    doctor.add_argument("--no-smoke", action="store_true", help="skip the smoke runs (import checks only)")
    doctor.add_argument("--perf-profile", dest="profile", help="profile (default: detected from this machine)")
    add_bootstrap_parser(commands)
    historycmd.add_parser(commands)  # history DIR: a metric over commits and its change points
    htmlreport_cli.add_parsers(commands)  # report, summary: a results file as a page or a table
    explaincmd.add_parser(commands)  # explain RESULTS.json: the op-profile diff of each regression
    scaffold.add_parser(commands)  # init [ROOT]: perfsuite in a team's repository
    revab.add_parser(commands)  # ab-rev REV: this checkout against a git revision, interleaved
    bisectcmd.add_parser(commands)  # bisect GOOD BAD: the commit that made a row slower, by A/B
    comparecmd.add_parser(commands)  # compare OLD NEW: two results files side by side, per scenario
    collection.add_parser(commands)  # profile: the profile the gate would use here
    return parser


def add_bootstrap_parser(commands: Any) -> None:
    boot = commands.add_parser(
        "bootstrap", help="make this runner's profile ready to judge within a time budget (resumable)"
    )
    boot.add_argument("paths", nargs="*", default=["bench_tests"], help="test paths (default bench_tests)")
    boot.add_argument(
        "--budget", type=duration, default=480.0, help="wall-clock budget for everything, e.g. 8m, 90s (default 8m)"
    )
    boot.add_argument(
        "--out",
        type=Path,
        default=Path("build/bootstrap"),
        help="state, logs, results and reports (default build/bootstrap)",
    )
    boot.add_argument(
        "--baselines", type=Path, default=Path("baselines"), help="baselines folder to fill (default baselines)"
    )
    boot.add_argument("--perf-profile", dest="profile", help="profile (default: detected from this machine)")
    boot.add_argument("-k", dest="keyword", help="pytest -k expression limiting the scenarios")
    boot.add_argument(
        "--repeats", type=at_least(2), default=3, help="fresh launches per spread measurement (default 3)"
    )
    boot.add_argument(
        "--levels", type=levels, default=(0.0, 3.0, 5.0, 10.0), help="selftest slowdowns in %% (default 0,3,5,10)"
    )
    boot.add_argument("--trials", type=at_least(1), default=2, help="selftest trials per level (default 2)")
    boot.add_argument("--redo", action="store_true", help="start over: ignore earlier state and baselines")
    boot.add_argument("--dry-run", action="store_true", help="print the plan and estimates; launch nothing")


def bootstrap(ns: argparse.Namespace, extra: list[str]) -> int:
    from perfsuite.commands.bootstrap.plan import Settings
    from perfsuite.commands.bootstrap.run import Options, run

    settings = Settings(repeats=ns.repeats, levels=ns.levels, trials=ns.trials)
    options = Options(
        ns.budget,
        ns.out.resolve(),
        ns.baselines.resolve(),
        tuple(ns.paths),
        ns.keyword,
        ns.profile,
        settings,
        ns.redo,
        ns.dry_run,
        tuple(extra),
    )
    return run(options)


def calibrate_args(ns: argparse.Namespace, extra: list[str]) -> list[str]:
    if ns.repeats < 2:
        raise SystemExit("perfsuite calibrate: --repeats must be >= 2 to measure a spread")
    args = [*ns.paths, "--perf-calibrate", f"--perf-repeats={ns.repeats}", "-p", "no:cacheprovider"]
    if ns.keyword:
        args += ["-k", ns.keyword]
    return args + extra


def selftest(ns: argparse.Namespace, extra: list[str]) -> int:
    """Each trial is a fresh pytest process, as a CI job would be. A trial's
    outcome is read from its results file, so a scenario that did not run
    (skipped here) stops the self-test instead of counting as "not caught"."""
    rows: list[dict[str, Any]] = []
    warm.share_with_children()  # the trials fork their launches from one parent per import set
    with tempfile.TemporaryDirectory(prefix="perfsuite-selftest-") as tmp:
        out = Path(tmp) / "results.json"
        for level in ns.levels:
            caught = unreliable = undecided = 0
            changes: list[float] = []
            spreads: list[float] = []
            pairs: list[int] = []
            for _ in range(ns.trials):
                plant = (
                    [f"--perf-ab={ns.ab}", f"--perf-ab-inject-slowdown={level}"]
                    if ns.ab
                    else [f"--perf-inject-slowdown={level}"]
                )
                # No op profile of each caught regression: the trial asks whether it failed, not why.
                cmd = [
                    sys.executable,
                    "-m",
                    "pytest",
                    *ns.paths,
                    "-k",
                    ns.keyword,
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    *plant,
                    "--perf-op-profiles=off",
                    f"--perf-json={out}",
                    *extra,
                ]
                code = procs.run_stoppable(cmd).returncode
                if ns.ab:
                    found = ab_trials(out, cmd, code)
                    verdicts = [verdict for verdict, _, _ in found]
                    pairs += [spent for _, spent, _ in found]
                    changes += [slowdown for _, _, slowdown in found]
                else:
                    verdicts = trial_verdicts(out, cmd, code)
                    figures = primary_figures(out)
                    changes += [change for change, _ in figures]
                    spreads += [spread for _, spread in figures]
                caught += "regression" in verdicts
                unreliable += "unreliable" in verdicts
                undecided += "undecided" in verdicts
            rows.append(
                {
                    "level": level,
                    "throughput_change": -level / (100 + level),
                    "trials": ns.trials,
                    "failed": caught,
                    "unreliable": unreliable,
                    "undecided": undecided,
                    "measured_changes": changes,
                    "step_cvs": spreads,
                    "pairs": pairs,
                }
            )
            note = f", unreliable {unreliable}" if unreliable else ""
            note += f", undecided {undecided}" if ns.ab else ""
            note += f", pairs mean {sum(pairs) / len(pairs):.1f} (most {max(pairs)})" if pairs else ""
            print(
                f"slowdown {level:5.0f}%  throughput -{level / (100 + level):.0%}  failed {caught}/{ns.trials}{note}",
                flush=True,
            )
            if ns.json:  # after every level, so a stopped self-test keeps what it measured
                atomic_write_json(ns.json, {"keyword": ns.keyword, "ab": ns.ab, "levels": rows})
    return 0


def trial_verdicts(path: Path, cmd: list[str], code: int) -> list[str]:
    """Verdicts of the scenarios one trial measured; refuses a trial that measured nothing."""
    if code not in (0, 1) or not path.exists():
        raise SystemExit(f"perfsuite selftest: pytest exited {code} (not pass/fail): {' '.join(cmd)}")
    results = json.loads(path.read_text())["results"]
    elsewhere = [r["id"] for r in results if r["verdict"] == "other_machine"]
    if elsewhere:  # every trial would read "failed 0/N" as if the gate caught nothing
        raise SystemExit(
            f"perfsuite selftest: the baselines of {', '.join(elsewhere)} were recorded on another processor, so "
            "this machine's timing is not judged against them and no planted slowdown can fail; record this "
            "machine's first (python -m perfsuite bootstrap, or pytest ... --perf-update-baselines)"
        )
    measured = [r for r in results if r["status"] == "ok"]
    if not measured:
        why = "; ".join(f"{r['id']}: {r['verdict']}: {r['message']}" for r in results) or "no scenario selected"
        raise SystemExit(f"perfsuite selftest: nothing was measured, so there is no gate to test ({why})")
    return [r["verdict"] for r in measured]


def primary_figures(path: Path) -> list[tuple[float, float]]:
    """Each measured scenario's relative change of its primary metric against the baseline, with
    that metric's step-to-step CV, of the measurement its verdict rests on (the confirmation, when
    one ran). The CV says whether a false alarm came with a spread grown since recording (the
    spread rule's cue) or from a steady run."""
    found = []
    for result in json.loads(path.read_text())["results"]:
        primary = (result.get("config") or {}).get("primary")
        checks = [c for c in result.get("checks") or [] if c.get("metric") == primary and c.get("delta") is not None]
        stored = (result.get("metrics") or {}).get(primary)
        if not checks or not isinstance(stored, dict) or not stored.get("mean"):
            continue
        found.append((round(float(checks[0]["delta"]), 5), round(float(stored["std"]) / float(stored["mean"]), 5)))
    return found


def ab_trials(path: Path, cmd: list[str], code: int) -> list[tuple[str, int, float]]:
    """Each A/B one trial made: its verdict, the pairs it spent and the slowdown it measured;
    refuses a trial that compared nothing. An undecided A/B exits 1 (not judged), like a failure."""
    if code not in (0, 1) or not path.exists():
        raise SystemExit(f"perfsuite selftest: pytest exited {code} (not pass/fail): {' '.join(cmd)}")
    compared = [r for r in json.loads(path.read_text()).get("ab", []) if r.get("headline")]
    if not compared:
        raise SystemExit(f"perfsuite selftest: the A/B compared nothing: {' '.join(cmd)}")
    return [(r["verdict"], int(r["pairs"]), round(float(r["headline"]["slowdown"]), 5)) for r in compared]


#: Commands whose unknown arguments go on to pytest (which refuses what it does not know).
PYTEST_PASS_THROUGH = ("calibrate", "selftest", "bootstrap", "ab-rev", "bisect")


def main(argv: list[str] | None = None) -> int:
    """The command's exit status; Ctrl-C or SIGTERM (a cancelled job) stops it and whatever it
    started (each command's own cleanup, :func:`perfsuite.launch.procs.stoppable`): exit 130, but for
    ``calibrate``, which runs pytest in this process and exits as pytest does (2)."""
    parser = build_parser()
    ns, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if extra and ns.command not in PYTEST_PASS_THROUGH:
        parser.error(f"{ns.command}: unrecognized arguments: {' '.join(extra)}")
    restore = procs.interrupt_on_sigterm()  # its message: "SIGTERM received, stopping"
    try:
        return dispatch(parser, ns, extra)
    except KeyboardInterrupt as exc:
        print(f"perfsuite {ns.command}: interrupted{f' ({exc})' if str(exc) else ''}", file=sys.stderr)
        return INTERRUPTED
    finally:
        restore()


def dispatch(parser: argparse.ArgumentParser, ns: argparse.Namespace, extra: list[str]) -> int:
    if ns.command == "selftest":
        if ns.simulate:
            from perfsuite.judge.simulate.cli import run as simulate

            if extra:
                parser.error(f"selftest --simulate: unrecognized arguments: {' '.join(extra)}")
            return simulate(ns, lambda: collection.tiers_of(ns.paths))
        if not ns.keyword:
            parser.error("selftest: -k is required (unless --simulate)")
        # --perf-profile is pytest's too: a real self-test passes it on.
        extra = [*(f"--perf-profile={name}" for name in ns.profile or ()), *extra]
        ns.levels = ns.levels or (0.0, 25.0, 50.0, 100.0)
        return selftest(ns, extra)
    if ns.command == "bootstrap":
        return bootstrap(ns, extra)
    if ns.command == "history":
        return historycmd.run(ns)
    if ns.command == "explain":
        return explaincmd.run(ns)
    if ns.command == "init":
        return scaffold.run(ns)
    if ns.command == "profile":
        return collection.run(ns)
    if ns.command == "ab-rev":
        return revab.run(ns, extra)
    if ns.command == "bisect":
        return bisectcmd.run(ns, extra)
    if ns.command == "compare":
        return comparecmd.run(ns)
    if ns.command in htmlreport_cli.COMMANDS:
        return htmlreport_cli.run(ns)
    if ns.command == "doctor":
        from perfsuite.commands.doctor import run

        engines = ns.engines.split(",") if ns.engines else None
        return run(ns.paths, ns.keyword, engines, run_smoke=not ns.no_smoke, profile_name=ns.profile)
    if ns.pool:
        return pool.run(ns, extra)
    import pytest

    return int(pytest.main(calibrate_args(ns, extra)))


if __name__ == "__main__":
    sys.exit(main())
