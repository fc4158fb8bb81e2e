"""``python -m perfsuite bisect GOOD BAD``: which commit between two revisions made a row slower?

A binary search over BAD's first-parent line after GOOD, each step the sequential A/B of
``ab-rev`` (:func:`perfsuite.commands.abrev.ab_trees`): GOOD's tree against the step's commit,
pairs of whole pytest runs, until a regression, a pass (no slowdown of the minimum effect or
more) or undecided. GOOD against BAD first, so a range without a slowdown costs one A/B; then
``ceil(log2(N))`` more for N commits. Each commit is checked out with ``git worktree add
--detach`` in a scratch folder (the user's checkout is untouched) and every worktree is removed
at the end, after an error and after Ctrl-C or SIGTERM too. Undecided at any step stops the search with the
range still open (exit 3): a guess would send someone to read the wrong commit. Torch-free.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from perfsuite.commands.abrev import BAD_INPUT, NOT_JUDGED, Settings, ab_trees, add_design_options, settings_of
from perfsuite.commands.cliargs import INTERRUPTED
from perfsuite.core.files import atomic_write_json
from perfsuite.judge.abtest import ABResult
from perfsuite.launch import procs, warm
from perfsuite.store import vcs

#: What to try when a step was not judged, by its verdict.
ADVICE = {
    "undecided": "more pairs (--max-pairs, --budget) or a larger --min-effect may decide",
    "unreliable": "its regression was measured under contention: run it on a quiet machine",
    "error": "a side failed (the step's message says which); fix it or bisect a narrower range",
    "skipped": "a row the search follows could not run at that commit",
}
Outcome = Literal["found", "none", "undecided"]


class BadInput(ValueError):
    """Input that no A/B can answer: a one-line message, exit 2."""


@dataclass(frozen=True)
class Search:
    """Where a search ended, as indexes into its commits (GOOD exclusive .. BAD inclusive, oldest
    first): ``found``: the first bad commit is ``commits[low]`` (``low == high``); ``none``: BAD is
    not slower than GOOD; ``undecided``: the first bad commit, if any, is in ``commits[low..high]``."""

    outcome: Outcome
    low: int
    high: int
    steps: int


def most_steps(count: int) -> int:
    """A/B steps a search of ``count`` commits may take: GOOD vs BAD, then one per halving."""
    return 1 + math.ceil(math.log2(count)) if count > 1 else 1


def search(commits: Sequence[str], step: Callable[[str], str]) -> Search:
    """The first commit whose ``step`` (its A/B against GOOD) says ``regression``, by halving.

    ``step`` answers ``regression``, ``pass`` or anything else (undecided, unreliable, error),
    which stops the search where it stands: the open range is what was learned. It assumes that
    a commit after the first bad one is slow too, as a bisection must; a later fix breaks that and
    the search then finds one of the slow commits, not necessarily the first."""
    low, high = 0, len(commits) - 1
    first = step(commits[high])
    if first != "regression":
        return Search("none" if first == "pass" else "undecided", low, high, 1)
    steps = 1
    while low < high:
        middle = (low + high) // 2
        verdict = step(commits[middle])
        steps += 1
        if verdict == "regression":
            high = middle
        elif verdict == "pass":
            low = middle + 1
        else:
            return Search("undecided", low, high, steps)
    return Search("found", low, high, steps)


def git(repo: Path, *args: str) -> str:
    """:func:`perfsuite.store.vcs.git`, its failure bad input (exit 2)."""
    try:
        return vcs.git(repo, *args)
    except vcs.GitError as exc:
        raise BadInput(str(exc)) from None


def resolve(repo: Path, rev: str) -> str:
    """REV's full commit, or a one-line error naming it."""
    try:
        return vcs.git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except vcs.GitError:
        raise BadInput(f"unknown revision {rev!r}: no such commit in {repo}") from None


def first_parent_line(repo: Path, good: str, bad: str, names: tuple[str, str]) -> list[tuple[str, str]]:
    """The commits (full sha, subject) from GOOD (exclusive) to BAD (inclusive) along BAD's
    first parents, oldest first; refused unless that line starts right after GOOD."""
    if good == bad:
        raise BadInput(f"GOOD {names[0]!r} and BAD {names[1]!r} are the same commit ({good[:12]}): nothing to search")
    try:
        vcs.git(repo, "merge-base", "--is-ancestor", good, bad)  # exit 1: it is not
    except vcs.GitError:
        raise BadInput(f"GOOD {names[0]!r} ({good[:12]}) is not an ancestor of BAD {names[1]!r} ({bad[:12]})") from None
    log = git(repo, "log", "--first-parent", "--reverse", "--format=%H%x09%s", f"{good}..{bad}")
    commits = [(sha, subject) for sha, _, subject in (line.partition("\t") for line in log.splitlines() if line)]
    if not commits:
        raise BadInput(f"no commits between GOOD {names[0]!r} and BAD {names[1]!r}")
    parent = git(repo, "rev-parse", f"{commits[0][0]}^1").strip()
    if parent != good:  # GOOD came in through a merge: a commit on the line may not contain it
        raise BadInput(
            f"GOOD {names[0]!r} ({good[:12]}) is not on BAD's first-parent line (it was merged in): "
            "give the merge's first parent or `git merge-base` as GOOD"
        )
    return commits


class Worktrees:
    """One detached worktree per commit under ``scratch``; :meth:`close` removes them all."""

    def __init__(self, repo: Path, scratch: Path) -> None:
        self.repo, self.scratch = repo, scratch
        self.paths: dict[str, Path] = {}

    def get(self, commit: str) -> Path:
        if commit not in self.paths:
            self.paths[commit] = path = self.scratch / "trees" / commit  # first: Ctrl-C during the add
            git(self.repo, "worktree", "add", "--detach", str(path), commit)
        return self.paths[commit]

    def drop(self, commit: str) -> None:
        path = self.paths.pop(commit, None)
        if path is not None:
            with contextlib.suppress(vcs.GitError):  # close() removes what git would not
                vcs.git(self.repo, "worktree", "remove", "--force", str(path))

    def close(self) -> None:
        for commit in list(self.paths):
            self.drop(commit)
        shutil.rmtree(self.scratch, ignore_errors=True)  # a worktree git would not remove goes too
        with contextlib.suppress(vcs.GitError):
            vcs.git(self.repo, "worktree", "prune")


@dataclass
class Step:
    """One A/B of GOOD against ``commit``: its verdict on the rows searched and every row's result."""

    commit: str
    subject: str
    verdict: str
    results: list[ABResult]
    rows: tuple[str, ...]
    message: str = ""

    def line(self, number: int, most: int) -> str:
        figures = "; ".join(describe(r) for r in self.results if r.id in self.rows) or self.message[-600:]
        return f"step {number}/{most} {self.commit[:12]} {self.subject[:50]}: {self.verdict}: {figures}"

    def to_json(self) -> dict[str, Any]:
        return {
            "commit": self.commit,
            "subject": self.subject,
            "verdict": self.verdict,
            "rows": list(self.rows),
            "message": self.message,
            "ab": [r.to_json() for r in self.results],
        }


def describe(result: ABResult) -> str:
    """A row's verdict with its slowdown against GOOD, the decision's interval and pairs spent."""
    if result.headline is None:
        return f"{result.id} {result.verdict}: {result.message[:300]}"
    state = result.headline.state
    interval = state.interval(result.headline.design)
    note = " (measured under contention)" if result.verdict == "unreliable" else ""
    return f"{result.id} {result.verdict}{note}, slowdown {state.slowdown:+.1%} ({interval}), {state.pairs} pair(s)"


def verdict_of(results: Sequence[ABResult], rows: Sequence[str]) -> str:
    """A step's verdict on ``rows``: ``regression`` if any of them is slower (the commit is bad for
    one), ``pass`` when all passed, else the first row's undecided/unreliable/error/skipped."""
    chosen = {r.id: r for r in results if r.id in rows}
    if any(r.verdict == "regression" for r in chosen.values()):
        return "regression"
    if len(chosen) < len(rows):
        return "error"  # a row the search follows was not measured at this commit
    if all(r.verdict == "pass" for r in chosen.values()):
        return "pass"
    return next(r.verdict for r in chosen.values() if r.verdict != "pass")


@dataclass
class Bisection:
    """The search's state between steps: GOOD's tree is every step's base."""

    good: str
    bad: str
    commits: list[tuple[str, str]]
    settings: Settings
    trees: Worktrees
    json_path: Path | None = None
    selection: str = "bench_tests"
    """The paths and -k, as the user gave them, for the message when they select nothing."""
    steps: list[Step] = field(default_factory=list)
    rows: tuple[str, ...] = ()
    """The rows that regressed between GOOD and BAD: the ones the search follows."""

    def step(self, commit: str) -> str:
        # Always against GOOD, not the last commit that passed: each step asks the same question (is
        # this commit slower than GOOD by the minimum effect?), so the verdicts line up along the
        # history and a commit after the first bad one shows the slowdown at full size. Against a
        # moving lower bound, a few slowdowns each under the minimum effect could pass step by step
        # and the search would drift away from the commit that shows up against GOOD; the base also
        # stays the same tree, so its worktree is made once.
        base, candidate = self.trees.get(self.good), self.trees.get(commit)
        out = self.trees.scratch / f"step-{len(self.steps) + 1}"
        out.mkdir()
        message = ""
        try:
            results = ab_trees(base, candidate, self.settings, out, lambda line: print(f"  {line}", flush=True))
        except RuntimeError as exc:  # a side's pytest wrote no results: it failed before measuring
            results, message = [], str(exc)
        finally:
            if commit != self.good:
                self.trees.drop(commit)
        if not self.steps:
            self._choose_rows(results, message)
        verdict = verdict_of(results, self.rows) if self.rows else "error"
        subject = dict(self.commits)[commit]
        self.steps.append(Step(commit, subject, verdict, results, self.rows, message))
        print(self.steps[-1].line(len(self.steps), most_steps(len(self.commits))), flush=True)
        self.write()
        return verdict

    def _choose_rows(self, results: Sequence[ABResult], message: str) -> None:
        """The first step (GOOD against BAD) names the rows to follow: those that regressed, else
        every row it compared; none selected is bad input."""
        if message:
            return
        if not results or all(r.verdict == "skipped" for r in results):
            why = f" ({results[0].id}: {results[0].message})" if results else ""
            raise BadInput(f"no row selected: {self.selection} selected no scenario that measures samples_per_s{why}")
        regressed = tuple(r.id for r in results if r.verdict == "regression")
        self.rows = regressed or tuple(r.id for r in results if r.verdict != "skipped")
        if regressed and len(results) > 1:
            print(f"bisecting the row(s) that regressed: {', '.join(regressed)}", flush=True)

    def conclude(self, found: Search) -> int:
        """Print what the search learned; the exit status."""
        good, bad = self.good[:12], self.bad[:12]
        if found.outcome == "none":
            rows = "; ".join(describe(r) for r in self.steps[0].results if r.id in self.rows)
            effect = _min_effect(self.steps[0].results)
            print(f"no slowdown of the minimum effect ({effect}) between GOOD {good} and BAD {bad}: {rows}")
            return 0
        if found.outcome == "undecided":
            where = self.steps[-1]
            advice = ADVICE.get(where.verdict, "see the step's message")
            if found.steps == 1:
                print(
                    f"perfsuite bisect: {where.verdict} between GOOD {good} and BAD {bad}, so nothing was searched: "
                    f"{advice}",
                    file=sys.stderr,
                )
                return NOT_JUDGED
            after = self.commits[found.low - 1][0] if found.low else self.good
            span = found.high - found.low + 1
            last = self.commits[found.high][0][:12]
            print(
                f"perfsuite bisect: {where.verdict} at {where.commit[:12]}: the first bad commit is one of the "
                f"{span} after {after[:12]} up to {last} (git log {after[:12]}..{last}); {advice}",
                file=sys.stderr,
            )
            return NOT_JUDGED
        sha, subject = self.commits[found.low]
        proof = next(s for s in self.steps if s.commit == sha)
        print(f"first bad commit: {sha} {subject}")
        print(f"  against GOOD {good}: " + "; ".join(describe(r) for r in proof.results if r.id in self.rows))
        parent = self.commits[found.low - 1][0] if found.low else self.good
        before = next((s for s in self.steps if s.commit == parent), None)
        if before is not None:  # how much of it was there already, below the minimum effect
            print(f"  its parent {parent[:12]}: " + "; ".join(describe(r) for r in before.results if r.id in self.rows))
        return 0

    def write(self, found: Search | None = None) -> None:
        if self.json_path is None:
            return
        first_bad = self.commits[found.low] if found is not None and found.outcome == "found" else None
        left = self.commits[found.low : found.high + 1] if found is not None and found.outcome == "undecided" else []
        atomic_write_json(
            self.json_path,
            {
                "good": self.good,
                "bad": self.bad,
                "outcome": found.outcome if found else "running",
                "first_bad": first_bad[0] if first_bad else None,
                "subject": first_bad[1] if first_bad else None,
                "remaining": [sha for sha, _ in left],
                "steps": [s.to_json() for s in self.steps],
            },
        )


def _min_effect(results: Sequence[ABResult]) -> str:
    effects = sorted({r.headline.design.min_effect for r in results if r.headline is not None})
    return ", ".join(f"{e:.1%}" for e in effects) or "-"


#: Pairs a step may take by default: twice ``ab-rev``'s, since one undecided step ends the whole
#: search. On init's example row launches spread so that 2 of 5 searches stopped at a step of
#: unchanged code after 8 pairs (docs/lab/contention.md); a step that decides early stops early.
MAX_PAIRS = 16


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("bisect", help="find the commit between GOOD and BAD that made a row slower (A/B)")
    parser.add_argument("good", metavar="GOOD", help="a revision that is not slower (e.g. v1.4, HEAD~16)")
    parser.add_argument("bad", metavar="BAD", help="a later revision that is slower (e.g. HEAD, origin/main)")
    parser.add_argument(
        "paths",
        nargs="*",
        default=["bench_tests"],
        help="test paths or node ids, the same at every commit (default bench_tests)",
    )
    add_design_options(parser, MAX_PAIRS)
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every step and the result to this file")


def run(ns: argparse.Namespace, extra: Sequence[str]) -> int:
    """0: the first bad commit found, or no slowdown; 2: bad input; 3: a step was not judged."""
    try:
        settings = settings_of(ns, extra)
        repo = Path(git(Path.cwd(), "rev-parse", "--show-toplevel").strip())
        good, bad = resolve(repo, ns.good), resolve(repo, ns.bad)
        commits = first_parent_line(repo, good, bad, (ns.good, ns.bad))
    except ValueError as exc:  # BadInput, and Settings' own checks
        print(f"perfsuite bisect: {exc}", file=sys.stderr)
        return BAD_INPUT
    print(
        f"perfsuite bisect: {len(commits)} commit(s) after GOOD {good[:12]} up to BAD {bad[:12]}: at most "
        f"{most_steps(len(commits))} A/B step(s) of at most {settings.max_pairs} pairs",
        flush=True,
    )
    # Launches fork from warm parents kept for the whole run, keyed by what each side's tree shadows
    # (warm.ParentKey): a team's repository, one for both sides; perfsuite's own, one per side.
    warm.share_with_children()
    trees = Worktrees(repo, Path(tempfile.mkdtemp(prefix="perfsuite-bisect.")))
    selection = (f"-k {ns.keyword!r} in " if ns.keyword else "") + " ".join(settings.paths)
    bisection = Bisection(good, bad, commits, settings, trees, ns.json, selection)
    try:
        _check_paths(trees, settings.paths, {good: f"GOOD {ns.good!r}", bad: f"BAD {ns.bad!r}"})
        found = search([sha for sha, _ in commits], bisection.step)
        bisection.write(found)
        return bisection.conclude(found)
    except BadInput as exc:
        print(f"perfsuite bisect: {exc}", file=sys.stderr)
        return BAD_INPUT
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (perfsuite's main makes it one)
        print(
            f"perfsuite bisect: interrupted{f' ({exc})' if str(exc) else ''}; removing its worktrees", file=sys.stderr
        )
        return INTERRUPTED
    finally:
        with procs.signals_held():
            trees.close()


def _check_paths(trees: Worktrees, paths: Sequence[str], names: dict[str, str]) -> None:
    """Every path exists at GOOD and at BAD: a typo is bad input, not a failed A/B."""
    for commit, name in names.items():
        tree = trees.get(commit)  # kept for its step
        missing = [p for p in paths if not (tree / p.split("::")[0]).exists()]
        if missing:
            raise BadInput(f"{', '.join(missing)}: no such path at {name} ({commit[:12]})")
