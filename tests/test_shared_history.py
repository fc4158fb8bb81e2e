"""The fleet's shared history (perfsuite.reports.exports.shared): runners append their runs to one branch
of the repository; two appending at once both land, nothing is lost, and ``history --branch``
reads it back with its change points."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from perfsuite.reports.exports import shared
from perfsuite.reports.exports.history import load, record
from perfsuite.store.vcs import Commit

BRANCH = "perf-history"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A bare remote and two runners' clones of it."""
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    seed = tmp_path / "seed"
    git(tmp_path, "init", "-q", "-b", "main", str(seed))
    (seed / "README").write_text("team repo\n")
    git(seed, "add", "README")
    git(seed, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    git(seed, "push", "-q", str(remote), "main")
    clones = [tmp_path / name for name in ("runner-a", "runner-b")]
    for clone in clones:
        git(tmp_path, "clone", "-q", str(remote), str(clone))
    return remote, clones[0], clones[1]


def runs(store: Path, runner: str, count: int, rate: float, start: datetime) -> None:
    for i in range(count):
        document = {
            "profile": "cpu",
            "results": [
                {
                    "id": "g.s",
                    "status": "ok",
                    "verdict": "pass",
                    "metrics": {"samples_per_s": {"mean": rate, "std": 0.5}},
                }
            ],
        }
        commit = Commit(id=f"{runner[-1]}{i:039d}", time=(start + timedelta(hours=i)).isoformat())
        record(store, document, commit, now=start + timedelta(hours=i, seconds=ord(runner[-1])))


def test_two_runners_appending_at_once_lose_nothing(fleet: tuple[Path, Path, Path]) -> None:
    remote, a, b = fleet
    start = datetime(2026, 11, 27, tzinfo=timezone.utc)
    runs(a / "perf-history", "runner-a", 4, 100.0, start)
    runs(b / "perf-history", "runner-b", 4, 60.0, start + timedelta(days=1))
    added: dict[str, list[str]] = {}
    barrier = threading.Barrier(2)

    def append(clone: Path) -> None:
        barrier.wait()  # both fetch the same (absent) branch, so one push must be refused and retried
        added[clone.name] = shared.publish(clone / "perf-history", clone, BRANCH)

    threads = [threading.Thread(target=append, args=(c,)) for c in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(map(len, added.values())) == [4, 4]
    on_branch = git(remote, "ls-tree", "-r", "--name-only", BRANCH).split()
    assert sorted(on_branch) == sorted(added["runner-a"] + added["runner-b"])
    assert shared.publish(a / "perf-history", a, BRANCH) == []  # appending again adds nothing
    assert git(remote, "rev-parse", "main") == git(a, "rev-parse", "origin/main")  # main untouched

    read = shared.materialise(b, BRANCH, b / "fleet")
    assert len(load(read, "cpu")) == 8
    shown = subprocess.run(
        [sys.executable, "-m", "perfsuite", "history", "fleet", "--branch", BRANCH],
        cwd=b,
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "change point" in shown.stdout.lower()


def test_publishing_nothing_or_reading_an_absent_branch_says_what_to_do(fleet: tuple[Path, Path, Path]) -> None:
    _, a, _ = fleet
    with pytest.raises(shared.SharedHistoryError, match="--perf-history"):
        shared.publish(a / "perf-history", a, BRANCH)
    with pytest.raises(shared.SharedHistoryError, match="nothing was published"):
        shared.materialise(a, BRANCH, a / "fleet")
