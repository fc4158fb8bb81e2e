"""git, for what is kept between runs: the commit a run measured, read from the pytest rootdir,
and the one git runner of the commands that read revisions (``ab-rev``, ``bisect``).

Both exporters name the same commit: pytest-benchmark's own helper reads the
current directory instead, which need not be the project's checkout.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Commit:
    """What git says about the checkout; every field None outside one."""

    id: str | None = None  # full hash
    time: str | None = None  # committer date, ISO 8601 with offset
    author_time: str | None = None
    dirty: bool = False  # tracked files differ from the commit
    branch: str | None = None

    @property
    def short(self) -> str | None:
        return self.id[:7] if self.id else None


def current_commit(root: Path) -> Commit:
    """HEAD of the checkout ``root`` is in; an empty Commit when ``root`` is
    not in one or git is not installed (a run must not fail for that)."""
    head = git_output(root, "rev-parse", "HEAD")
    if head is None:
        return Commit()
    times = (git_output(root, "show", "-s", "--format=%cI%n%aI", "HEAD") or "\n").splitlines()
    status = git_output(root, "status", "--porcelain", "--untracked-files=no")
    branch = git_output(root, "rev-parse", "--abbrev-ref", "HEAD")
    return Commit(
        id=head,
        time=times[0] or None,
        author_time=times[1] if len(times) > 1 else None,
        dirty=bool(status),
        branch=None if branch in (None, "HEAD") else branch,
    )


class GitError(ValueError):
    """A git command failed: its arguments and git's own message."""


def git(repo: Path, *args: str, timeout_s: float | None = None) -> str:
    """What git prints for ``args`` in ``repo``, or :class:`GitError` with git's message."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"git {' '.join(args)}: {exc}") from None
    if done.returncode:
        raise GitError(f"git {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def git_output(root: Path, *args: str) -> str | None:
    """What git prints for ``args`` in ``root``; None where git fails or is missing (a run must not
    fail for that)."""
    try:
        return git(root, *args, timeout_s=30).strip()
    except GitError:
        return None
