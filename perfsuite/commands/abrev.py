"""``python -m perfsuite ab-rev REV``: is this checkout slower than revision REV?

An interleaved, sequential A/B of two revisions of one repository on one machine, for machines
whose speed drifts between sessions more than any stored baseline's tolerance can absorb (the
2-core cpu VM: 15-40%; docs/lab/issue-26.md) and for slowdowns smaller than a stored baseline's
tolerance (2% on a GPU). REV's tree is exported (``git archive``) into a scratch folder and this
checkout copied beside it (:func:`snapshot`), then the selected scenarios run in the two copies pair
by pair, the side that goes first alternating: every
run is a whole pytest process of that side's own code (its bench_tests, and its perfsuite when
the repository holds one), with an empty baselines folder, so nothing is judged or written, only
measured. After each pair every open scenario is judged by :mod:`perfsuite.judge.sequential`:
regression, pass (no slowdown of the minimum effect or more) or one more pair, until
``--max-pairs`` or ``--budget``, then undecided. A regression measured under contention is
unreliable. ``bisect`` runs the same A/B (:func:`ab_trees`) between commits. Torch-free.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.commands.cliargs import at_least, duration, fraction, rate

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tomli dependency on 3.10
    import tomli as tomllib
from perfsuite.core import workcount
from perfsuite.core.profiles import CPU
from perfsuite.core.protocol import work_count_of
from perfsuite.judge import sequential
from perfsuite.judge.abtest import ABResult, Trial, markdown_lines, summary_lines, work_lines
from perfsuite.judge.contention import Contention, Quiet, contended, wait_for_quiet
from perfsuite.judge.results import OneLaunch
from perfsuite.launch import procs, warm
from perfsuite.store.vcs import git

BASE, CANDIDATE = "base", "candidate"
#: The headline metric the A/B judges; memory and exact bytes stay with the stored-baseline gate.
METRIC = "samples_per_s"
#: Exit statuses: a regression, bad input, something not judged (undecided, unreliable, failed).
REGRESSED, BAD_INPUT, NOT_JUDGED = 1, 2, 3


@dataclass(frozen=True)
class Settings:
    """What one A/B between two trees runs and how it decides."""

    paths: tuple[str, ...] = ("bench_tests",)
    args: tuple[str, ...] = ()
    """pytest arguments for both sides (``-k``, ``--perf-profile``)."""
    candidate_args: tuple[str, ...] = ()
    min_effect: float | None = None
    """None: each scenario's own, else its profile's, as the candidate's results file says."""
    max_pairs: int = sequential.MAX_PAIRS
    budget_s: float | None = None
    """No new pair after this long (seconds since the first)."""
    alpha: float = sequential.ALPHA
    """How often ``regression`` may be said at no slowdown."""

    def __post_init__(self) -> None:
        self.design(self.min_effect or CPU.min_effect)  # its errors name the field
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"budget_s must be positive seconds, got {self.budget_s!r}")

    def design(self, min_effect: float) -> sequential.Design:
        return sequential.Design(min_effect, alpha=self.alpha, max_pairs=self.max_pairs)


@dataclass(frozen=True)
class Limits:
    """The contention limits of the profile a side measured on (its results file's
    ``contention_limits``; a revision from before them: the cpu profile's)."""

    max_foreign_cores: float = CPU.max_foreign_cores
    max_steal_cores: float = CPU.max_steal_cores

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> Limits:
        found = document.get("contention_limits")
        if not isinstance(found, Mapping):
            return cls()
        try:
            return cls(float(found["max_foreign_cores"]), float(found["max_steal_cores"]))
        except (KeyError, TypeError, ValueError):
            return cls()


@dataclass(frozen=True)
class SideRun:
    """One pytest run of one side: each scenario's launch and minimum effect, by id."""

    launches: Mapping[str, OneLaunch]
    min_effects: Mapping[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    nodeids: Mapping[str, str] = field(default_factory=dict)
    """Each scenario's pytest node id, as its results file names it (a revision from before it: none)."""
    limits: Limits = field(default_factory=Limits)
    """The contention limits of the profile it measured on."""
    work: Mapping[str, workcount.WorkCount | None] = field(default_factory=dict)
    """Each scenario's counted step work (none where that side's perfsuite counted none)."""


def export(repo: Path, rev: str, into: Path) -> str:
    """REV's tree under ``into`` (``git archive``: no worktree left behind); its full commit."""
    commit = git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}").strip()
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit], capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as raw:
        raw.write(archive)
        raw.seek(0)
        with tarfile.open(fileobj=raw) as tar:
            tar.extractall(into, filter="data")
    return commit


#: The two trees' folder names in the scratch folder: of one length, so that no string a rank holds
#: (module paths, code objects' file names) differs in size between the sides.
BASE_DIR, CANDIDATE_DIR = "base", "cand"


def snapshot(repo: Path, into: Path) -> int:
    """The checkout as it is, uncommitted changes included, copied under ``into``: the files git
    tracks and the untracked ones it does not ignore. The candidate runs from this copy, not from
    the checkout itself, so that the two sides differ in their code alone, not in where their tree
    lies or what else sits in it; the number of files copied."""
    listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    copied = 0
    for name in dict.fromkeys(n for n in listed if n):  # a file both staged and changed is listed twice
        source, target = repo / name, into / name
        if not source.exists() and not source.is_symlink():  # tracked, deleted in the checkout
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir() and not source.is_symlink():  # a submodule: its files as they are
            shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        else:
            shutil.copy2(source, target, follow_symlinks=False)
        copied += 1
    return copied


def run_side(root: Path, paths: Sequence[str], pytest_args: Sequence[str], out: Path) -> SideRun:
    """One pytest run of the selected scenarios in ``root`` (that side's code first on the path),
    against an empty baselines folder: each scenario's launch and minimum effect, by id."""
    empty = out.with_suffix(".baselines")
    empty.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        *paths,
        "-p",
        "no:cacheprovider",
        *own_plugin(root),
        "-q",
        f"--perf-baselines={empty}",
        f"--perf-json={out}",
        *pytest_args,
    ]
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(root)}
    started = time.monotonic()
    done = procs.run_stoppable(argv, cwd=root, env=env)  # interrupted: its ranks stop with it
    if not out.exists():
        tail = (done.stdout + done.stderr).strip()[-1500:]
        raise RuntimeError(f"pytest in {root} wrote no results (exit {done.returncode}): {tail}")
    document = json.loads(out.read_text())
    results = document["results"]
    default = float(document.get("min_effect") or CPU.min_effect)  # a revision from before min_effect: cpu's
    effects = {r["id"]: float((r.get("config") or {}).get("min_effect") or default) for r in results}
    found = document.get("nodeids")
    nodeids = {k: v for k, v in found.items() if isinstance(v, str)} if isinstance(found, dict) else {}
    limits = Limits.of(document)
    launches = {r["id"]: launch_of(r, limits) for r in results}
    work = {r["id"]: work_count_of(r) for r in results}
    return SideRun(launches, effects, time.monotonic() - started, nodeids, limits, work)


def selection(roots: Mapping[str, Path], last: Mapping[str, SideRun], still: Sequence[str]) -> tuple[str, ...] | None:
    """What both sides' next runs select: the node ids of the scenarios ``still`` open, so a decided
    one is not launched again, where each side's last run named every one of them alike and each
    names a file of each tree (node ids are relative to the folder pytest runs in); else None, and
    both run the user's selection. Both sides or neither: an A/B compares identical runs."""
    named = {tuple(run.nodeids.get(scenario_id, "") for scenario_id in still) for run in last.values()}
    if not still or len(last) != len(roots) or len(named) != 1:
        return None
    (ids,) = named
    files = {n.split("::")[0] for n in ids}
    if not all(ids) or not all((root / f).is_file() for root in roots.values() for f in files):
        return None
    return ids


def own_plugin(root: Path) -> list[str]:
    """pytest arguments that load the side's own plugin where its tree holds perfsuite itself.

    pytest finds the plugin through the installed entry point, which names this checkout's module
    (``perfsuite.plugin.hooks``); a revision from before the folders had ``perfsuite.plugin``, so
    its side would fail to start. Its own ``pyproject.toml`` names the module that its code has."""
    pyproject = root / "pyproject.toml"
    if not (root / "perfsuite" / "__init__.py").is_file() or not pyproject.is_file():
        return []
    try:
        entry = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["pytest11"]["perfsuite"]
    except (tomllib.TOMLDecodeError, KeyError, TypeError):
        return []
    return ["-p", "no:perfsuite", "-p", str(entry)]


def launch_of(result: Mapping[str, Any], limits: Limits = Limits()) -> OneLaunch:
    """One scenario's launch as a results file gives it: status, throughput, and why it was measured
    under contention by the A/B's rule (foreign load or a process on the GPU; steal is reported,
    not counted: :func:`ab_trees`)."""
    metrics = result.get("metrics") or {}
    value = metrics.get(METRIC)
    values = {METRIC: float(value["mean"])} if isinstance(value, Mapping) else {}
    status, message = str(result.get("status") or "error"), str(result.get("message") or "")
    if status == "ok" and not values:  # a microbenchmark's or collective's rate is another metric
        status, message = "skipped", f"measures no {METRIC}: ab-rev compares training throughput"
    busy = metrics.get("contention")
    found = Contention.from_json(busy) if isinstance(busy, Mapping) else None
    why = contended(found, limits.max_foreign_cores, limits.max_steal_cores, steal=False)
    return OneLaunch(status, values, message, why, found.steal_cores if found else 0.0)


#: How long an A/B waits for a quiet host after a pair it dropped as contended, at most (and never
#: past its budget): as the gate's ``--perf-contention-wait``.
QUIET_WAIT_S = 60.0


def await_quiet(limits: Limits, timeout_s: float) -> Quiet:
    """Wait for the host to be free of foreign load (the A/B's rule: steal hits both sides alike)."""
    return wait_for_quiet(limits.max_foreign_cores, math.inf, timeout_s)


def ab_trees(
    base: Path,
    candidate: Path,
    settings: Settings,
    scratch: Path,
    say: Callable[[str], None] = lambda line: None,
    quiet: Callable[[Limits, float], Quiet] = await_quiet,
) -> list[ABResult]:
    """The sequential A/B of the selected scenarios, ``base``'s tree against ``candidate``'s: pairs
    of whole pytest runs, the first side alternating, until every scenario has decided or the
    pairs or the budget are spent. ``say`` gets a line per pair.

    A pair one of whose sides was measured under foreign load (another process busy on the host, or
    on the GPU) is dropped for that scenario: such load can fall on one side only and would be read
    as its speed. The A/B then waits for a quiet host (``quiet``, within the budget) and measures
    again, up to ``max_pairs`` dropped pairs. Stolen time is not a reason to drop: the hypervisor
    steals from whichever side runs, so over interleaved pairs it is noise that the sequential test
    measures and pays for with pairs, not a bias. Each pair's line says how much was stolen."""
    trials: dict[str, Trial] = {}
    roots = {BASE: (base, settings.args), CANDIDATE: (candidate, (*settings.args, *settings.candidate_args))}
    started = time.monotonic()
    last: dict[str, SideRun] = {}
    still: list[str] = []
    attempts = 2 * settings.max_pairs  # the measured pairs, and as many dropped
    for pair in range(attempts):
        order = (BASE, CANDIDATE) if sequential.base_first(pair) else (CANDIDATE, BASE)
        paths = selection({side: root for side, (root, _) in roots.items()}, last, still)
        runs = {
            side: run_side(roots[side][0], paths or settings.paths, roots[side][1], scratch / f"{side}-{pair}.json")
            for side in order
        }
        if pair == 0:
            roots = {side: (root, _counted_once(args, runs[side])) for side, (root, args) in roots.items()}
        last = runs
        dropped = 0
        for scenario_id in sorted(set(runs[BASE].launches) | set(runs[CANDIDATE].launches)):
            trial = trials.get(scenario_id) or trials.setdefault(scenario_id, _trial(scenario_id, settings, runs))
            _add_work(trial, runs, scenario_id)
            launches = [(side, runs[side].launches.get(scenario_id, _unmeasured(side))) for side in order]
            dropped += _add_pair(trial, pair, launches)
        final = pair == attempts - 1 or (
            settings.budget_s is not None and time.monotonic() - started >= settings.budget_s
        )
        for trial in trials.values():
            trial.look(final)
        still = sorted(scenario_id for scenario_id, trial in trials.items() if trial.open)
        say(_pair_line(pair, order, runs, len(still), len(trials), dropped))
        if not still:
            break
        if dropped:
            left = QUIET_WAIT_S if settings.budget_s is None else settings.budget_s - (time.monotonic() - started)
            if left > 0:
                waited = quiet(runs[CANDIDATE].limits, min(QUIET_WAIT_S, left))
                say(f"  waited {waited.waited_s:.0f} s for a quiet host: {'quiet' if waited.quiet else 'still busy'}")
    return [trials[scenario_id].result for scenario_id in sorted(trials)]


def _counted_once(args: tuple[str, ...], run: SideRun) -> tuple[str, ...]:
    """A side's pytest arguments after its first run: step work is exact, so once counted it is not
    counted again (``--perf-work=off``, which only a revision that counted knows)."""
    return (*args, "--perf-work=off") if any(count is not None for count in run.work.values()) else args


def _add_work(trial: Trial, runs: Mapping[str, SideRun], scenario_id: str) -> None:
    """The candidate's step work against the base's, from the first pair that counted both."""
    base, candidate = (runs[side].work.get(scenario_id) for side in (BASE, CANDIDATE))
    if trial.result.work is None and base is not None and candidate is not None:
        trial.result.work = workcount.compare(base, candidate)


def _unmeasured(side: str) -> OneLaunch:
    return OneLaunch("error", {}, f"no {side} run measured it")


def _add_pair(trial: Trial, pair: int, launches: Sequence[tuple[str, OneLaunch]]) -> int:
    """Feed one pair to an open trial; 1 if it was dropped as contended (both sides ran)."""
    if not trial.open:
        return 0
    busy = [f"{side}: {launch.contended}" for side, launch in launches if launch.status == "ok" and launch.contended]
    if busy and all(launch.status == "ok" for _, launch in launches):
        trial.drop(f"pair {pair + 1}: {'; '.join(busy)}")
        return 1
    for side, launch in launches:
        if trial.open:
            trial.add(side, launch)
    return 0


def _pair_line(
    pair: int, order: Sequence[str], runs: Mapping[str, SideRun], still: int, scenarios: int, dropped: int
) -> str:
    """What a pair took, what is still open, and the contention it met."""
    crowded = [side for side in order if any(x.contended for x in runs[side].launches.values())]
    stolen = max((x.steal_cores for side in order for x in runs[side].launches.values()), default=0.0)
    return (
        f"pair {pair + 1}: {' then '.join(f'{side} {runs[side].seconds:.0f} s' for side in order)}; "
        f"{still} of {scenarios} scenario(s) still open"
        + (f"; measured under contention: {', '.join(crowded)}" if crowded else "")
        + (f" ({dropped} scenario(s) dropped this pair, to be measured again)" if dropped else "")
        + (f"; steal up to {stolen:.2f} cores (not counted: it hits both sides alike)" if stolen >= 0.01 else "")
    )


def _trial(scenario_id: str, settings: Settings, runs: Mapping[str, SideRun]) -> Trial:
    effect = settings.min_effect or runs[CANDIDATE].min_effects.get(scenario_id) or CPU.min_effect
    return Trial(scenario_id, (METRIC,), BASE, CANDIDATE, settings.design(effect), {METRIC: 0.0})


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("ab-rev", help="sequential, interleaved A/B of this checkout against a git revision")
    parser.add_argument("rev", help="the base revision (e.g. HEAD~1, origin/main, $(git merge-base origin/main HEAD))")
    parser.add_argument(
        "paths",
        nargs="*",
        default=["bench_tests"],
        help="test paths or node ids, the same on both sides (default bench_tests)",
    )
    add_design_options(parser)
    parser.add_argument("--json", type=Path, help="write the comparisons to this file")
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="FILE",
        help="append a Markdown table of verdicts, slowdowns and pairs spent (e.g. $GITHUB_STEP_SUMMARY)",
    )
    parser.add_argument(
        "--candidate-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an argument for the candidate's pytest only, e.g. --candidate-arg=--perf-inject-slowdown=20 "
        "to measure what the A/B detects (repeatable)",
    )


def add_design_options(parser: argparse.ArgumentParser, max_pairs: int = sequential.MAX_PAIRS) -> None:
    """The options of a sequential A/B, shared with ``bisect`` (which allows more pairs by default)."""
    parser.add_argument("-k", dest="keyword", help="pytest -k expression: the scenarios to compare")
    parser.add_argument(
        "--min-effect",
        type=fraction,
        metavar="FRACTION",
        help="the smallest slowdown that matters, e.g. 0.02 (steps 2%% slower); default: each "
        "scenario's min_effect, else its profile's (0.1 on cpu, 0.02 on GPUs)",
    )
    parser.add_argument(
        "--max-pairs",
        "--pairs",
        dest="max_pairs",
        type=at_least(2),
        default=max_pairs,
        help=f"most base/candidate pairs before a scenario is undecided (default {max_pairs})",
    )
    parser.add_argument(
        "--budget",
        type=duration,
        metavar="DURATION",
        help="start no pair after this long, e.g. 20m (undecided where nothing decided)",
    )
    parser.add_argument(
        "--alpha",
        type=rate,
        default=sequential.ALPHA,
        metavar="RATE",
        help=f"how often it may say regression at no slowdown (default {sequential.ALPHA}); "
        "lower needs more pairs to catch a real one",
    )
    parser.add_argument("--tolerance", type=_gone, help=argparse.SUPPRESS)


def _gone(text: str) -> float:
    raise argparse.ArgumentTypeError(
        "--tolerance is gone: the A/B decides against the smallest slowdown that matters, --min-effect FRACTION"
    )


def settings_of(ns: argparse.Namespace, extra: Sequence[str], candidate_args: Sequence[str] = ()) -> Settings:
    args = (*(["-k", ns.keyword] if ns.keyword else []), *extra)
    return Settings(tuple(ns.paths), args, tuple(candidate_args), ns.min_effect, ns.max_pairs, ns.budget, ns.alpha)


def run(ns: argparse.Namespace, extra: Sequence[str]) -> int:
    """0: no regression; 1: a regression; 2: bad input; 3: something was not judged (undecided,
    unreliable, failed) or nothing was compared."""
    here = Path.cwd()
    try:
        settings = settings_of(ns, extra, ns.candidate_arg)
    except ValueError as exc:
        print(f"perfsuite ab-rev: {exc}", file=sys.stderr)
        return BAD_INPUT
    # Launches fork from warm parents kept for the whole run, keyed by what each side's tree shadows
    # (warm.ParentKey): a team's repository, one for both sides; perfsuite's own, one per side.
    warm.share_with_children()
    with tempfile.TemporaryDirectory(prefix="perfsuite-ab-rev.") as scratch:
        base, candidate = Path(scratch) / BASE_DIR, Path(scratch) / CANDIDATE_DIR
        try:
            commit = export(here, ns.rev, base)
        except (ValueError, subprocess.CalledProcessError) as exc:
            print(f"perfsuite ab-rev: cannot export {ns.rev!r}: {exc}", file=sys.stderr)
            return BAD_INPUT
        try:
            snapshot(here, candidate)
        except (ValueError, OSError) as exc:
            print(f"perfsuite ab-rev: cannot copy this checkout into {candidate}: {exc}", file=sys.stderr)
            return BAD_INPUT
        print(
            f"perfsuite ab-rev: this checkout against {ns.rev} ({commit[:12]}), at most {settings.max_pairs} pairs",
            flush=True,
        )
        results = ab_trees(base, candidate, settings, Path(scratch), lambda line: print(line, flush=True))
    print("\n".join([*work_lines(results), *summary_lines(results)]))
    if ns.json:
        ns.json.write_text(json.dumps({"base": commit, "ab": [r.to_json() for r in results]}, indent=1))
    if ns.markdown:
        with ns.markdown.open("a") as out:
            out.write("\n".join(markdown_lines(results, f"perfsuite A/B against {ns.rev} ({commit[:12]})")) + "\n")
    return exit_status(results, "ab-rev")


def exit_status(results: Sequence[ABResult], command: str) -> int:
    if any(r.verdict == "regression" for r in results):
        return REGRESSED
    unjudged = [f"{r.id} {r.verdict}" for r in results if r.verdict not in ("pass", "skipped")]
    if unjudged or not any(r.judged for r in results):
        print(f"perfsuite {command}: not judged: {', '.join(unjudged) or 'nothing was compared'}", file=sys.stderr)
        return NOT_JUDGED
    return 0
